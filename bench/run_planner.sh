#!/usr/bin/env bash
# bench/run_planner.sh — planning time of the default planner (teraio)
# against the faithful Algorithm 1 (--planner alg1, src/plan/planner_alg1.c) on
# one paper-scale trace, both run here on the same trace and profile with
# `teraio plan --hw`; prints each planner's seconds, whether its plan fits,
# and the ratio (the paper's Algorithm 1 took 31.2 s on Llama3-8B).  The
# trace is Llama3-8B, batch 64, sequence 2048 from the paper tracer
# (python -m teraio.paper), cached under build/paper-traces/.
# Environment: TERAIO (the binary, default build/bin/teraio), BENCH_HW
# (profile, default hw/h100-nvl-paper.conf), BENCH_TRACE (any trace file).
set -euo pipefail
cd "$(dirname "$0")/.."
teraio=${TERAIO:-build/bin/teraio}
hw=${BENCH_HW:-hw/h100-nvl-paper.conf}
py=${TERAIO_PYTHON:-.venv/bin/python}
trace=${BENCH_TRACE:-}
if [ -z "$trace" ]; then
  trace=build/paper-traces/bench-llama3-8b-b64-s2048.tio
  if [ ! -f "$trace" ]; then
    lib=$(cd "$(dirname "$teraio")/../lib" && pwd)/libteraio.so
    PYTHONPATH=python TERAIO_LIBRARY="$lib" "$py" -m teraio.paper --model llama3-8b --batch 64 \
      --seq 2048 --hw "$hw" -o "$trace" >/dev/null
  fi
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for planner in teraio alg1; do
  "$teraio" plan "$trace" --hw "$hw" --planner "$planner" -o "$out/$planner.plan" \
    >"$out/$planner.txt" || true
done
python3 - "$out/teraio.txt" "$out/alg1.txt" <<'PY'
import sys
def read(path):
    get = lambda key: next(v.strip() for k, v in ((l[:16].strip(), l[16:]) for l in open(path)) if k == key)
    return float(get("planning time").split()[0]), get("fits"), get("planned peak")
(ft, ff, fp), (at, af, ap) = read(sys.argv[1]), read(sys.argv[2])
print(f"teraio  plan {ft:.3f} s  fits {ff}  planned peak {fp}")
print(f"alg1    plan {at:.3f} s  fits {af}  planned peak {ap}")
print(f"planning time ratio alg1/teraio {at / max(ft, 1e-9):.1f}x")
PY
