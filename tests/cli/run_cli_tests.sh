#!/usr/bin/env bash
# tests/cli/run_cli_tests.sh TERAIO — error paths of the `teraio` command.
#
# The CLI's contract on bad input: a non-zero exit status and exactly one
# line on stderr, starting with "teraio <cmd>: " (or "teraio: " for errors
# of the dispatcher itself, before a subcommand is known).  Each case below is one call to
#   expect_one_line_error "<description>" <command and arguments...>
# (the binary is "$teraio"); add cases for a new subcommand in its own
# section.  Fixtures go in "$work", a temporary directory removed at exit.
# Ends with "cli: N passed, M failed" and exits non-zero if any failed.
set -u

teraio=${1:?usage: run_cli_tests.sh PATH/TO/teraio}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
passed=0
failed=0

expect_one_line_error() {
  local what=$1
  shift
  local rc=0
  "$@" >"$work/stdout" 2>"$work/stderr" || rc=$?
  local lines
  lines=$(wc -l <"$work/stderr")
  local why=""
  if [ "$rc" -eq 0 ]; then
    why="exit status 0"
  elif [ "$rc" -ge 128 ]; then
    why="killed by a signal (status $rc)"
  elif [ "$lines" -ne 1 ]; then
    why="$lines lines on stderr"
  elif ! head -n 1 "$work/stderr" | grep -q '^teraio[ :]'; then
    why="stderr does not start with 'teraio '"
  fi
  if [ -z "$why" ]; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    echo "FAIL: $what: $why" >&2
    sed 's/^/  stderr: /' "$work/stderr" >&2
  fi
}

# Like expect_one_line_error, and the exit status must be exactly $2.
expect_status() {
  local what=$1 want=$2
  shift 2
  local rc=0
  "$@" >/dev/null 2>&1 || rc=$?
  if [ "$rc" -eq "$want" ]; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    echo "FAIL: $what: exit status $rc, expected $want" >&2
  fi
}

# Passes when the command (a check on files the previous commands wrote) succeeds.
expect_true() {
  local what=$1
  shift
  if "$@"; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    echo "FAIL: $what" >&2
  fi
}

# --- teraio (dispatch) ---------------------------------------------------
expect_one_line_error "unknown command" "$teraio" no-such-command
expect_one_line_error "version: an argument" "$teraio" version extra
expect_status "version: an argument exits 2" 2 "$teraio" version extra
expect_status "version --help" 0 "$teraio" version --help

# --- teraio analyze --------------------------------------------------------
cat >"$work/good.tio" <<'EOF'
teraio-trace 1
counts 2 3 4
tensor 0 1048576 parameter global w
tensor 1 4096 activation intermediate
kernel 0 100 aten::mm r:0 w:1
kernel 1 100 aten::relu rw:1
kernel 2 100 aten::add_ rw:0
EOF
head -n 5 "$work/good.tio" >"$work/truncated.tio"
sed 's/^tensor 1 4096/tensor 1 40x96/' "$work/good.tio" >"$work/garbled.tio"
sed 's/^teraio-trace 1/teraio-trace 9/' "$work/good.tio" >"$work/newer.tio"
: >"$work/empty.tio"

expect_status "analyze good trace" 0 "$teraio" analyze "$work/good.tio"
expect_status "analyze --json" 0 "$teraio" analyze --json "$work/good.tio"
expect_status "analyze --help" 0 "$teraio" analyze --help
expect_one_line_error "analyze: missing file" "$teraio" analyze "$work/missing.tio"
expect_one_line_error "analyze: truncated trace" "$teraio" analyze "$work/truncated.tio"
expect_one_line_error "analyze: garbled number" "$teraio" analyze "$work/garbled.tio"
expect_one_line_error "analyze: newer version" "$teraio" analyze "$work/newer.tio"
expect_one_line_error "analyze: empty file" "$teraio" analyze "$work/empty.tio"
expect_one_line_error "analyze: a directory" "$teraio" analyze "$work"
expect_one_line_error "analyze: no TRACE" "$teraio" analyze
expect_one_line_error "analyze: two TRACEs" "$teraio" analyze "$work/good.tio" "$work/good.tio"
expect_one_line_error "analyze: unknown option" "$teraio" analyze --frobnicate "$work/good.tio"
expect_one_line_error "analyze: bandwidth missing" "$teraio" analyze "$work/good.tio" --ssd-read-gbps
expect_one_line_error "analyze: bandwidth zero" "$teraio" analyze "$work/good.tio" --ssd-write-gbps 0
expect_one_line_error "analyze: bandwidth not a number" "$teraio" analyze "$work/good.tio" --ssd-read-gbps fast
expect_status "analyze: unknown option exits 2" 2 "$teraio" analyze --frobnicate "$work/good.tio"
expect_status "analyze: bad file exits 1" 1 "$teraio" analyze "$work/garbled.tio"
# A FIFO without a writer used to block the reader forever.
mkfifo "$work/fifo.tio"
expect_one_line_error "analyze: a FIFO" timeout 10 "$teraio" analyze "$work/fifo.tio"
# /proc files report 0 bytes: the error is about their text, not "end of file".
expect_one_line_error "analyze: a /proc file" "$teraio" analyze /proc/self/status
expect_true "analyze: a /proc file is read past its reported size of 0" \
  grep -q "got 'Name:'" "$work/stderr"
expect_status "analyze: --ssd-read-gbps=R" 0 "$teraio" analyze "$work/good.tio" --ssd-read-gbps=3
expect_one_line_error "analyze: hex bandwidth" "$teraio" analyze "$work/good.tio" --ssd-read-gbps 0x10
expect_one_line_error "analyze: empty bandwidth" "$teraio" analyze "$work/good.tio" --ssd-write-gbps=
expect_one_line_error "analyze: bandwidth 1e400" "$teraio" analyze "$work/good.tio" --ssd-read-gbps 1e400
expect_one_line_error "analyze: bandwidth nan" "$teraio" analyze "$work/good.tio" --ssd-read-gbps nan
# A model text that is not UTF-8 went into --json raw: output that no JSON
# parser reads.  Such bytes are now written as \ufffd.
printf 'teraio-trace 1\nmodel a\377b\ncounts 1 1 1\ntensor 0 5 parameter global\nkernel 0 1 k r:0\n' >"$work/latin1.tio"
if "$teraio" analyze --json "$work/latin1.tio" >"$work/out.json" &&
   grep -q '"model": "a\\ufffdb"' "$work/out.json" && ! LC_ALL=C grep -q $'\377' "$work/out.json"; then
  passed=$((passed + 1))
else
  failed=$((failed + 1))
  echo "FAIL: analyze --json: a model text that is not UTF-8 is not escaped" >&2
fi

# --- teraio plan ------------------------------------------------------------
# The trace of tests/c/test_plan.c: M peaks at 5000 B (kernel 3); kernel 6
# (bwd.mm1) needs 2500 B.  At 4000 B (SSD 2/1 GB/s) the plan fits; at 4500 B
# with SSD read 0.25 GB/s and no host tier it does not.
cat >"$work/plan.tio" <<'EOF'
teraio-trace 1
counts 5 8 10
tensor 0 1000 parameter global P
tensor 1 2000 activation intermediate A
tensor 2 1000 activation intermediate B
tensor 3 500 temporary intermediate X
tensor 4 500 gradient global G
kernel 0 500 fwd.embed r:0
kernel 1 500 fwd.mm1 w:1
kernel 2 1000 fwd.mm2 w:2
kernel 3 1000 fwd.gelu w:3
kernel 4 1000 bwd.gelu r:3
kernel 5 1000 bwd.mm2 r:2
kernel 6 500 bwd.mm1 r:1 w:4
kernel 7 500 adamw rw:0 r:4
EOF

expect_status "plan: fits" 0 "$teraio" plan "$work/plan.tio" --capacity 4000 \
  --ssd-read-gbps 2 --ssd-write-gbps 1 -o "$work/fits.plan"
expect_status "plan --help" 0 "$teraio" plan --help
expect_one_line_error "plan: capacity below a kernel's need" \
  "$teraio" plan "$work/plan.tio" --capacity 2000 -o "$work/small.plan"
expect_true "plan: capacity error does not name kernel 6 (bwd.mm1) and its need" \
  grep -q "below kernel 6 (bwd.mm1)'s need of 2.44 KiB" "$work/stderr"
expect_status "plan: capacity too small exits 1" 1 \
  "$teraio" plan "$work/plan.tio" --capacity 2000 -o "$work/small.plan"
# one byte under the floor (2500 B): the rounded sizes would read alike, the exact ones show
expect_one_line_error "plan: one byte under the floor" \
  "$teraio" plan "$work/plan.tio" --capacity 2499 -o "$work/small.plan"
expect_true "plan: one byte under the floor does not give the exact sizes" \
  grep -q "capacity 2499 B is below kernel 6 (bwd.mm1)'s need of 2500 B" "$work/stderr"
cp "$work/plan.tio" "$work/self.tio"
expect_one_line_error "plan: -o the trace itself" \
  "$teraio" plan "$work/self.tio" --capacity 4000 -o "$work/self.tio"
expect_true "plan -o onto its own trace changed the trace" cmp -s "$work/plan.tio" "$work/self.tio"
expect_one_line_error "plan: does not fit (alg1)" "$teraio" plan "$work/plan.tio" --capacity 4500 \
  --ssd-read-gbps 0.25 --ssd-write-gbps 1 --planner alg1 --no-synchronous-moves -o "$work/nofit.plan"
if [ -s "$work/nofit.plan" ]; then
  passed=$((passed + 1))
else
  failed=$((failed + 1))
  echo "FAIL: plan: a plan that does not fit is still written" >&2
fi
expect_status "plan: does not fit exits 1 (alg1)" 1 "$teraio" plan "$work/plan.tio" --capacity 4500 \
  --ssd-read-gbps 0.25 --ssd-write-gbps 1 --planner=alg1 --no-synchronous-moves -o "$work/nofit.plan"
expect_status "plan: alg1 with the synchronous finish fits" 0 "$teraio" plan "$work/plan.tio" \
  --capacity 4500 --ssd-read-gbps 0.25 --ssd-write-gbps 1 --planner alg1 -o "$work/fit.plan"
expect_status "plan: teraio fits at the working-set floor" 0 "$teraio" plan "$work/plan.tio" \
  --capacity 2500 --ssd-read-gbps 0.25 --ssd-write-gbps 1 -o "$work/floor.plan"
expect_one_line_error "plan: unknown planner" "$teraio" plan "$work/plan.tio" --capacity 4500 \
  --planner greedy -o "$work/x.plan"
expect_status "plan: unknown planner exits 2" 2 "$teraio" plan "$work/plan.tio" --capacity 4500 \
  --planner greedy -o "$work/x.plan"
if "$teraio" plan --help | grep -q "cubically"; then
  passed=$((passed + 1))
else
  failed=$((failed + 1))
  echo "FAIL: plan --help does not say that alg1 grows about cubically" >&2
fi
expect_one_line_error "plan: missing trace" \
  "$teraio" plan "$work/missing.tio" --capacity 4000 -o "$work/x.plan"
expect_status "plan: missing trace exits 1" 1 \
  "$teraio" plan "$work/missing.tio" --capacity 4000 -o "$work/x.plan"
expect_one_line_error "plan: garbled trace" \
  "$teraio" plan "$work/garbled.tio" --capacity 4000 -o "$work/x.plan"
expect_one_line_error "plan: bad --capacity" \
  "$teraio" plan "$work/plan.tio" --capacity 12X -o "$work/x.plan"
expect_status "plan: bad --capacity exits 2" 2 \
  "$teraio" plan "$work/plan.tio" --capacity 12X -o "$work/x.plan"
expect_one_line_error "plan: zero --capacity" \
  "$teraio" plan "$work/plan.tio" --capacity 0 -o "$work/x.plan"
expect_one_line_error "plan: no --capacity" "$teraio" plan "$work/plan.tio" -o "$work/x.plan"
expect_status "plan: no --capacity exits 2" 2 "$teraio" plan "$work/plan.tio" -o "$work/x.plan"
expect_one_line_error "plan: no -o" "$teraio" plan "$work/plan.tio" --capacity 4000
expect_one_line_error "plan: no TRACE" "$teraio" plan --capacity 4000 -o "$work/x.plan"
expect_one_line_error "plan: bandwidth not a number" \
  "$teraio" plan "$work/plan.tio" --capacity 4000 --ssd-read-gbps fast -o "$work/x.plan"
expect_one_line_error "plan: unknown option" \
  "$teraio" plan "$work/plan.tio" --capacity 4000 --frobnicate -o "$work/x.plan"
expect_one_line_error "plan: unwritable output" \
  "$teraio" plan "$work/plan.tio" --capacity 4000 -o "$work/no-such-dir/x.plan"
# Byte counts above 2^53 are exact (they went through a double), those in
# [2^63, 2^64) are not clamped to 2^63 (llround overflowed).
for cap in 9007199254740993 18446744073709551615; do
  expect_status "plan: --capacity $cap" 0 "$teraio" plan "$work/plan.tio" --capacity "$cap" \
    -o "$work/cap.plan"
  expect_true "plan: --capacity $cap not kept exactly" \
    grep -qx "kernels 8 tensors 5 capacity $cap" "$work/cap.plan"
done
expect_status "plan: --capacity 1.5e4" 0 "$teraio" plan "$work/plan.tio" --capacity 1.5e4 -o "$work/cap.plan"
grep -qx "kernels 8 tensors 5 capacity 15000" "$work/cap.plan" && passed=$((passed + 1)) ||
  { failed=$((failed + 1)); echo "FAIL: plan: --capacity 1.5e4 is not 15000" >&2; }
for cap in 18446744073709551616 1e20 0x1000 " 4000" +4000 -0 nan 1e 16E; do
  expect_one_line_error "plan: --capacity '$cap'" \
    "$teraio" plan "$work/plan.tio" --capacity "$cap" -o "$work/x.plan"
done
# -o a directory: refused before anything is written next to it.
mkdir "$work/outdir"
expect_one_line_error "plan: -o a directory" "$teraio" plan "$work/plan.tio" --capacity 4000 -o "$work/outdir"
if ls "$work" | grep -q '\.tmp\.'; then
  failed=$((failed + 1))
  echo "FAIL: plan: a temporary file was left behind" >&2
else
  passed=$((passed + 1))
fi
# -o a FIFO: written in place, never replaced by a file (as root, -o /dev/null
# used to replace /dev/null); without a reader, an error instead of a hang.
mkfifo "$work/out.fifo"
expect_one_line_error "plan: -o a FIFO nobody reads" \
  timeout 10 "$teraio" plan "$work/plan.tio" --capacity 4000 -o "$work/out.fifo"
exec 3<>"$work/out.fifo" # a reader (read-write: opening does not wait)
expect_status "plan: -o a FIFO" 0 timeout 10 "$teraio" plan "$work/plan.tio" --capacity 4000 -o "$work/out.fifo"
timeout 10 head -n 1 <&3 >"$work/fifo.out"
exec 3<&-
if [ -p "$work/out.fifo" ] && grep -qx 'teraio-plan 1' "$work/fifo.out"; then
  passed=$((passed + 1))
else
  failed=$((failed + 1))
  echo "FAIL: plan: -o a FIFO did not write through it" >&2
fi
# A trace without kernels: no plan (its file, "kernels 0", would not load).
printf 'teraio-trace 1\ncounts 0 0 0\n' >"$work/no-kernels.tio"
expect_one_line_error "plan: trace without kernels" \
  "$teraio" plan "$work/no-kernels.tio" --capacity 1 -o "$work/x.plan"

# --- teraio check -----------------------------------------------------------
"$teraio" plan "$work/plan.tio" --capacity 4000 -o "$work/good.plan" >/dev/null 2>&1
sed 's/^offload \([0-9]*\) /offload 77 /' "$work/good.plan" >"$work/unknown.plan"
expect_one_line_error "check: plan names an unknown tensor" "$teraio" check "$work/plan.tio" "$work/unknown.plan"
head -c 40 "$work/good.plan" >"$work/truncated.plan"
expect_one_line_error "check: truncated plan" "$teraio" check "$work/plan.tio" "$work/truncated.plan"
expect_one_line_error "check: missing plan" "$teraio" check "$work/plan.tio" "$work/none.plan"
expect_one_line_error "check: one argument" "$teraio" check "$work/plan.tio"
expect_status "check: a matching plan passes" 0 "$teraio" check "$work/plan.tio" "$work/good.plan"
# Two pairs of P in its one inactive period that overlap (the second offload
# is issued before the first prefetch is due): used to pass, with an M'
# the runtime never reaches.
printf 'teraio-plan 1\nkernels 8 tensors 5 capacity 4000\noffload 0 1 2 ssd 1000\nprefetch 0 3 4 ssd 1000\noffload 0 1 4 ssd 1000\nprefetch 0 5 7 ssd 1000\n' >"$work/overlap.plan"
expect_one_line_error "check: overlapping pairs of one tensor" "$teraio" check "$work/plan.tio" "$work/overlap.plan"
expect_one_line_error "check: a FIFO as PLAN" timeout 10 "$teraio" check "$work/plan.tio" "$work/fifo.tio"

# --- teraio bench io ---------------------------------------------------------
: >"$work/a-file"
expect_one_line_error "bench io: nonexistent --dir" "$teraio" bench io --dir "$work/no-such-dir" --size 4MiB --runs 1
expect_one_line_error "bench io: --dir is a file" "$teraio" bench io --dir "$work/a-file" --size 4MiB --runs 1
expect_one_line_error "bench io: bad --size" "$teraio" bench io --dir "$work" --size lots
expect_one_line_error "bench io: --size 0" "$teraio" bench io --dir "$work" --size 0
expect_one_line_error "bench io: --size below --bs" "$teraio" bench io --dir "$work" --size 4KiB
expect_one_line_error "bench io: --bs not a multiple of 4096" "$teraio" bench io --dir "$work" --bs 1000
expect_one_line_error "bench io: --qd 0" "$teraio" bench io --dir "$work" --qd 0
expect_one_line_error "bench io: unknown option" "$teraio" bench io --dir "$work" --fast
expect_one_line_error "bench io: unknown pass" "$teraio" bench io --dir "$work" --passes seq,fast
expect_one_line_error "bench io: --rand-size above --size" "$teraio" bench io --dir "$work" --size 8MiB --rand-size 16MiB
expect_one_line_error "bench: no benchmark named" "$teraio" bench disk
expect_status "bench io --help" 0 "$teraio" bench io --help

# --- teraio tokenize ---------------------------------------------------------
printf 'hello world\n' >"$work/hello.txt"
printf '{"model": {"type": "WordPiece"}}' >"$work/wordpiece.json"
printf '{"model": ' >"$work/truncated.json"
printf '15339 x 1917' >"$work/bad-ids.txt"
printf '4000000' >"$work/big-id.txt"
expect_one_line_error "tokenize: no arguments" "$teraio" tokenize
expect_one_line_error "tokenize: no FILE" "$teraio" tokenize --encoding cl100k_base
expect_one_line_error "tokenize: --encoding and --file" "$teraio" tokenize --encoding cl100k_base --file "$work/wordpiece.json" "$work/hello.txt"
expect_one_line_error "tokenize: unknown encoding" "$teraio" tokenize --encoding gpt5 "$work/hello.txt"
expect_one_line_error "tokenize: --ids with --decode" "$teraio" tokenize --encoding cl100k_base --ids --decode "$work/hello.txt"
expect_one_line_error "tokenize: unknown option" "$teraio" tokenize --encoding cl100k_base --fast "$work/hello.txt"
expect_one_line_error "tokenize: --file not byte-level BPE" "$teraio" tokenize --file "$work/wordpiece.json" "$work/hello.txt"
expect_one_line_error "tokenize: --file truncated JSON" "$teraio" tokenize --file "$work/truncated.json" "$work/hello.txt"
expect_one_line_error "tokenize: --file missing" "$teraio" tokenize --file "$work/none.json" "$work/hello.txt"
expect_status "tokenize --help" 0 "$teraio" tokenize --help
# the rank files shipped with teraio, found from / with nothing set
expect_one_line_error "tokenize: missing input" "$teraio" tokenize --encoding cl100k_base "$work/none.txt"
expect_one_line_error "tokenize: --decode of a non-number" "$teraio" tokenize --encoding cl100k_base --decode "$work/bad-ids.txt"
expect_one_line_error "tokenize: --decode of an unknown id" "$teraio" tokenize --encoding cl100k_base --decode "$work/big-id.txt"
expect_status "tokenize --ids" 0 "$teraio" tokenize --encoding cl100k_base --ids "$work/hello.txt"
ids=$(cd / && env -u TERAIO_TOKENIZERS_DIR TIKTOKEN_CACHE_DIR= "$teraio" tokenize --encoding o200k_base --ids "$work/hello.txt")
if [ "$ids" = "24912 2375 198" ]; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: tokenize --ids from /: got '$ids'" >&2; fi
mkdir -p "$work/flipped-ranks"
sed '1000s/^./~/' "$(dirname "$teraio")/../tokenizers/cl100k_base.tiktoken" >"$work/flipped-ranks/cl100k_base.tiktoken"
expect_one_line_error "tokenize: a rank file with one byte changed" "$teraio" tokenize --encoding cl100k_base --dir "$work/flipped-ranks" "$work/hello.txt"
msg=$("$teraio" tokenize --encoding cl100k_base --dir "$work/flipped-ranks" "$work/hello.txt" 2>&1 || true)
case "$msg" in
  *"flipped-ranks/cl100k_base.tiktoken: sha256 "*) passed=$((passed + 1)) ;;
  *) failed=$((failed + 1)); echo "FAIL: tokenize: sha256 mismatch message: $msg" >&2 ;;
esac

# --- teraio eval ---------------------------------------------------------------
printf 'name = broken\ncapacity_bytes = lots\n' >"$work/garbled.conf"
printf 'name = partial\ncapacity_bytes = 4000\n' >"$work/partial.conf"
cat >"$work/ok.conf" <<'EOF'
name = cli-test
capacity_bytes = 4000
pcie_h2d_gbps = 10
pcie_d2h_gbps = 10
ssd_count = 1
ssd_read_gbps = 2
ssd_write_gbps = 1.5
ssd_latency_us = 0
host_latency_us = 0
host_cap_bytes = 0
cpu_adam_params_per_s = 1e9
EOF
expect_one_line_error "eval: nothing to evaluate" "$teraio" eval
expect_one_line_error "eval: unknown target" "$teraio" eval everything
expect_one_line_error "eval: unknown option" "$teraio" eval paper --fast
expect_one_line_error "eval paper: takes no file" "$teraio" eval paper "$work/plan.tio"
expect_one_line_error "eval paper: no --traces" "$teraio" eval paper
expect_one_line_error "eval paper: missing suite" "$teraio" eval paper --traces "$work/no-suite"
mkdir -p "$work/suite"
cp "$work/plan.tio" "$work/suite/t.tio"
printf 'teraio-suite 1\nhw cli-test\nconfig tiny 4 8 1 1 125.0 t.tio\nconfig tiny 8 8 1 1 125.0 t.tio\nreference all teraio-alg1 0.8\n' >"$work/suite/suite.txt"
expect_one_line_error "eval paper: missing --hw file" "$teraio" eval paper --traces "$work/suite" --hw "$work/none.conf"
expect_one_line_error "eval paper: suite without hw.conf" "$teraio" eval paper --traces "$work/suite"
expect_one_line_error "eval paper: garbled --hw" "$teraio" eval paper --traces "$work/suite" --hw "$work/garbled.conf"
expect_one_line_error "eval paper: --hw without a value" "$teraio" eval paper --traces "$work/suite" --hw
expect_one_line_error "eval paper: --alg1-seconds not a number" "$teraio" eval paper --traces "$work/suite" --alg1-seconds soon
cp "$work/ok.conf" "$work/suite/hw.conf"
expect_status "eval paper: a small suite" 0 "$teraio" eval paper --traces "$work/suite" --json
"$teraio" eval paper --traces "$work/suite" --json --alg1-seconds 0 >"$work/suite.json" 2>/dev/null || true
expect_true "eval paper --json: no fidelity table" grep -q '"fidelity"' "$work/suite.json"
expect_true "eval paper --json: no trace names" grep -q '"trace": "t.tio"' "$work/suite.json"
printf 'teraio-suite 1\nhw cli-test\nconfig tiny 4 8 1 1 125.0 ../plan.tio\n' >"$work/suite/suite.txt"
expect_one_line_error "eval paper: a trace outside the suite" "$teraio" eval paper --traces "$work/suite"
expect_one_line_error "eval trace: no --hw" "$teraio" eval trace "$work/plan.tio"
expect_one_line_error "eval trace: no trace" "$teraio" eval trace --hw "$work/ok.conf"
expect_one_line_error "eval trace: missing trace" "$teraio" eval trace "$work/none.tio" --hw "$work/ok.conf"
expect_one_line_error "eval trace: --hw missing a required key" \
  "$teraio" eval trace "$work/plan.tio" --hw "$work/partial.conf"
expect_one_line_error "eval trace: unknown strategy" \
  "$teraio" eval trace "$work/plan.tio" --hw "$work/ok.conf" --strategy fastest
expect_one_line_error "eval trace: plan of another trace" \
  "$teraio" eval trace "$work/plan.tio" --hw "$work/ok.conf" --plan "$work/unknown.plan"
expect_one_line_error "eval demo: gone (the demo fits in-process)" "$teraio" eval demo "$work/none.json"
printf 'teraio-trace 1\nmodel empty batch 1\ncounts 0 0 0\n' >"$work/empty.tio"
expect_one_line_error "eval trace: a trace without kernels" \
  "$teraio" eval trace "$work/empty.tio" --hw "$work/ok.conf"
if ! grep -q "no kernels" "$work/stderr"; then
  failed=$((failed + 1))
  echo "FAIL: eval trace: a trace without kernels: message does not say so" >&2
fi
expect_status "eval trace: a good trace and profile" 0 \
  "$teraio" eval trace "$work/plan.tio" --hw "$work/ok.conf" --json
expect_status "eval --help" 0 "$teraio" eval --help

# --- teraio advise -------------------------------------------------------------
# plan.tio (above) has no "tokens=" in its model text: --tokens gives them.
adv=("$teraio" advise --trace "$work/plan.tio" --hw "$work/ok.conf" --tokens 1000)
expect_status "advise --help" 0 "$teraio" advise --help
expect_one_line_error "advise: no model" "$teraio" advise --hw "$work/ok.conf"
expect_one_line_error "advise: two models" "$teraio" advise --model gpt2 --trace "$work/plan.tio" --hw "$work/ok.conf"
expect_status "advise: no --hw: the H100 NVL profile" 0 "$teraio" advise --trace "$work/plan.tio" --tokens 1 \
  --ssds 1 --host-cap 0 --gpu-mem 80GB --ssd-gbps 7,5 --pcie-gbps 25
expect_one_line_error "advise: missing --hw file" "$teraio" advise --trace "$work/plan.tio" --tokens 1 --hw "$work/none.conf"
expect_one_line_error "advise: garbled --hw" "$teraio" advise --trace "$work/plan.tio" --tokens 1 --hw "$work/garbled.conf"
expect_one_line_error "advise: missing trace" "$teraio" advise --trace "$work/none.tio" --tokens 1 --hw "$work/ok.conf"
expect_one_line_error "advise: trace without tokens" "$teraio" advise --trace "$work/plan.tio" --hw "$work/ok.conf"
expect_one_line_error "advise: --tokens with --model" "$teraio" advise --model gpt2 --tokens 5 --hw "$work/ok.conf"
expect_one_line_error "advise: --ssds 0" "${adv[@]}" --ssds 0
expect_one_line_error "advise: --ssds backwards range" "${adv[@]}" --ssds 8-1
expect_one_line_error "advise: --ssds empty item" "${adv[@]}" --ssds 1,,2
expect_one_line_error "advise: --ssds trailing comma" "${adv[@]}" --ssds 1,
expect_one_line_error "advise: --gpus huge range" "${adv[@]}" --gpus 1-1000
expect_one_line_error "advise: --gpu-mem not bytes" "${adv[@]}" --gpu-mem lots
expect_one_line_error "advise: --gpu-mem 0" "${adv[@]}" --gpu-mem 0
expect_one_line_error "advise: --host-cap negative" "${adv[@]}" --host-cap -5GB
expect_one_line_error "advise: --target above 1" "${adv[@]}" --target 1.5
expect_one_line_error "advise: --target 0" "${adv[@]}" --target 0
expect_one_line_error "advise: negative price" "${adv[@]}" --price-ssd -3
expect_one_line_error "advise: --ssd-gbps bad write" "${adv[@]}" --ssd-gbps 7,x
expect_one_line_error "advise: --dtype fp8" "${adv[@]}" --dtype fp8
expect_one_line_error "advise: --optimizer lion" "${adv[@]}" --optimizer lion
expect_one_line_error "advise: too many points" "${adv[@]}" --gpus 1-64 --ssds 1-64 --host-cap 0,1,2
expect_one_line_error "advise: unknown option" "${adv[@]}" --fast
expect_one_line_error "advise: unknown option last" "${adv[@]}" --json --fast
expect_one_line_error "advise: --trace fixes the job (--dtype)" "${adv[@]}" --dtype bf16
expect_one_line_error "advise: --trace fixes the job (--checkpointing)" "${adv[@]}" --checkpointing
expect_one_line_error "advise: --svg into a missing directory" "${adv[@]}" --svg "$work/no/dir/a.svg"
expect_one_line_error "advise: tracer that cannot start" \
  env TERAIO_PYTHON="$work/no-python" "$teraio" advise --model gpt2 --hw "$work/ok.conf"
expect_status "advise: --hw by the name of a shipped profile" 0 \
  "$teraio" advise --trace "$work/plan.tio" --tokens 5 --hw h100-nvl-paper --ssds 1 --host-cap 0
expect_one_line_error "advise: --hw name of no profile" \
  "$teraio" advise --trace "$work/plan.tio" --tokens 5 --hw h900-dream
expect_one_line_error "advise: --gpu-mem 80 (bytes? no unit)" "${adv[@]}" --gpu-mem 80
# tokens= is read as a whole word of digits (the breaker's max_tokens=4096, tokens=-5, 12abc)
for line in "x max_tokens=4096 tokens=128" "x tokens=-5" "x tokens=12abc" "x tokens=99999999999"; do
  sed "1a model $line" "$work/plan.tio" >"$work/tok.tio"
  "$teraio" advise --trace "$work/tok.tio" --ssds 1 --host-cap 0 --json >"$work/tok.json" 2>"$work/tok.err" || true
  want=$([ "$line" = "x max_tokens=4096 tokens=128" ] && echo '"tokens_per_gpu_iteration": 128' || echo "give --tokens N")
  if ! grep -q -- "$want" "$work/tok.json" "$work/tok.err"; then
    failed=$((failed + 1))
    echo "FAIL: advise: model line '$line' did not give: $want" >&2
  else
    passed=$((passed + 1))
  fi
done
expect_one_line_error "advise: stdout full" bash -c '"$0" advise --trace "$1" --tokens 5 --ssds 1 --host-cap 0 >/dev/full' "$teraio" "$work/plan.tio"
expect_status "advise: price 0.0 is no price" 0 "${adv[@]}" --ssds 1 --host-cap 0 --price-ssd 0.0
expect_status "advise: a sweep" 0 "${adv[@]}" --ssds 1-3 --gpu-mem 4000B,1000B --host-cap 0,1MB \
  --price-gpu-hour 2 --price-ssd 100 --svg "$work/advise.svg"
expect_true "advise --svg: one panel per GPU memory and host cap" \
  test "$(grep -c "GB per GPU</text>" "$work/advise.svg")" -eq 4
"${adv[@]}" --gpus 1,2 --ssds 1 --json >"$work/advise.json" 2>/dev/null || true
expect_true "advise --json: two rows" test "$(grep -c '"gpus": ' "$work/advise.json")" -eq 2

# --- teraio data ---------------------------------------------------------------
mkdir -p "$work/data-src/web" "$work/data-src/code"
for i in 1 2 3 4 5 6 7 8; do
  echo "{\"text\": \"document $i of the web, $i $i $i\"}" >>"$work/data-src/web/a.jsonl"
  echo "{\"text\": \"def f$i(): return $i\"}" >>"$work/data-src/code/b.jsonl"
done
expect_status "data ingest: JSONL to Megatron" 0 "$teraio" data ingest "$work/data-src" "$work/data"
expect_status "data inspect: ingested root" 0 "$teraio" data inspect "$work/data" --json
expect_status "data sample: save a state" 0 \
  "$teraio" data sample "$work/data" --seq-len 8 --count 3 --save "$work/data.state"
expect_status "data sample: resume it" 0 \
  "$teraio" data sample "$work/data" --seq-len 8 --count 1 --resume "$work/data.state"
expect_status "data inspect: a state" 0 "$teraio" data inspect "$work/data" --state "$work/data.state"
expect_status "data --help" 0 "$teraio" data --help
expect_one_line_error "data: no subcommand" "$teraio" data
expect_one_line_error "data: unknown subcommand" "$teraio" data frobnicate
expect_one_line_error "data inspect: missing dir" "$teraio" data inspect "$work/no-such-data"
expect_one_line_error "data inspect: dir is a file" "$teraio" data inspect "$work/a-file"
mkdir -p "$work/data-empty"
expect_one_line_error "data inspect: no sub-dataset" "$teraio" data inspect "$work/data-empty"
expect_one_line_error "data inspect: unknown option" "$teraio" data inspect "$work/data" --fast
mkdir -p "$work/data-bad/m"
cp "$work/data/web/a.bin" "$work/data-bad/m/x.bin"
printf 'NOTMAGIC\0\1\0\0\0\0\0\0\0\4' >"$work/data-bad/m/x.idx"
head -c 4096 /dev/zero >>"$work/data-bad/m/x.idx"
expect_one_line_error "data inspect: .idx with wrong magic" "$teraio" data inspect "$work/data-bad"
head -c 12 "$work/data/web/a.idx" >"$work/data-bad/m/x.idx"
expect_one_line_error "data inspect: truncated .idx" "$teraio" data inspect "$work/data-bad"
cp "$work/data/web/a.idx" "$work/data-bad/m/x.idx"
head -c 10 "$work/data/web/a.bin" >"$work/data-bad/m/x.bin"
expect_one_line_error "data inspect: .idx pointers past the end of .bin" "$teraio" data inspect "$work/data-bad"
rm -f "$work/data-bad/m/x.idx"
expect_one_line_error "data inspect: .bin that is no llm.c shard" "$teraio" data inspect "$work/data-bad"
expect_one_line_error "data inspect: state of other settings (fingerprint mismatch)" \
  "$teraio" data inspect "$work/data" --state "$work/data.state" --seed 9
expect_one_line_error "data sample: state of other settings" \
  "$teraio" data sample "$work/data" --seq-len 8 --seed 9 --resume "$work/data.state"
expect_one_line_error "data inspect: state of another dataset" \
  "$teraio" data inspect "$work/data-src" --state "$work/data.state"
expect_one_line_error "data inspect: missing state" "$teraio" data inspect "$work/data" --state "$work/none.state"
head -c 30 "$work/data.state" >"$work/short.state"
expect_one_line_error "data inspect: truncated state" "$teraio" data inspect "$work/data" --state "$work/short.state"
cp "$work/data.state" "$work/flipped.state"
printf '\377' | dd of="$work/flipped.state" bs=1 seek=44 conv=notrunc 2>/dev/null
expect_one_line_error "data inspect: state with a bad checksum" \
  "$teraio" data inspect "$work/data" --state "$work/flipped.state"
expect_one_line_error "data ingest: missing SRC" "$teraio" data ingest "$work/no-such-src" "$work/data-out"
expect_one_line_error "data ingest: no OUT" "$teraio" data ingest "$work/data-src"
expect_one_line_error "data ingest: token files are not text" "$teraio" data ingest "$work/data" "$work/data-out"
expect_one_line_error "data ingest: unknown tokenizer" \
  "$teraio" data ingest "$work/data-src" "$work/data-out" --tokenizer gpt9
expect_one_line_error "data ingest: OUT is a file" "$teraio" data ingest "$work/data-src" "$work/a-file"
# Issue 26 items 6 and 7: a.jsonl and a.parquet (or a.jsonl.zst) both went to web/a.bin, ingest
# said 3 files and 100 documents and wrote 20; OUT = SRC or inside it doubled the source.
mkdir -p "$work/data-clash/web"
echo '{"text": "one"}' >"$work/data-clash/web/a.jsonl"
gzip -c "$work/data-clash/web/a.jsonl" >"$work/data-clash/web/a.jsonl.gz"
expect_one_line_error "data ingest: two inputs, one output name" \
  "$teraio" data ingest "$work/data-clash" "$work/data-clash-out"
if ! grep -q "would both be written to web/a.bin" "$work/stderr"; then
  failed=$((failed + 1))
  echo "FAIL: data ingest: a name collision does not name the output" >&2
fi
expect_one_line_error "data ingest: OUT is SRC" "$teraio" data ingest "$work/data-src" "$work/data-src"
expect_one_line_error "data ingest: OUT inside SRC" "$teraio" data ingest "$work/data-src" "$work/data-src/out"
if [ -e "$work/data-src/out" ]; then
  failed=$((failed + 1))
  echo "FAIL: data ingest: a refused OUT inside SRC was left behind" >&2
fi
mkdir -p "$work/data-badline/t"
printf '{"text": "fine"}\n{"text": "broken\\q"}\n' >"$work/data-badline/t/x.jsonl"
expect_one_line_error "data ingest: malformed JSONL line" "$teraio" data ingest "$work/data-badline" "$work/data-out2"
expect_status "data ingest: malformed line skipped" 0 \
  "$teraio" data ingest "$work/data-badline" "$work/data-out3" --skip-bad-lines
expect_one_line_error "data ingest: --threads 0" "$teraio" data ingest "$work/data-src" "$work/data-out" --threads 0
expect_one_line_error "data bench: missing dir" "$teraio" data bench "$work/no-such-data"
expect_one_line_error "data bench: JSONL has no token counts" "$teraio" data bench "$work/data-src"
expect_one_line_error "data bench: bad --seq-len" "$teraio" data bench "$work/data" --seq-len 0
expect_status "data bench: --json" 0 "$teraio" data bench "$work/data" --seq-len 16 --seconds 0.05 --prefetch 2 --json

echo "cli: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
