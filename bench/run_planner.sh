#!/usr/bin/env bash
# bench/run_planner.sh — planning time of the fast planner (strategy teraio)
# against the faithful Algorithm 1 (teraio-alg1, src/plan/planner.c) on one
# paper-scale trace, both run here on the same trace and profile; prints
# each planner's seconds and the ratio (the paper's Algorithm 1 took 31.2 s
# on Llama3-8B).  The trace is Llama3-8B, batch 64, sequence 2048 from the
# paper tracer (python -m teraio.paper), cached under build/paper-traces/.
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
fast=$("$teraio" eval trace "$trace" --hw "$hw" --strategy teraio --json)
alg1=$("$teraio" eval trace "$trace" --hw "$hw" --strategy teraio-alg1 --json)
python3 - "$fast" "$alg1" <<'PY'
import json, sys
f, a = (json.loads(x)["results"][0] for x in sys.argv[1:3])
print(f"teraio       plan {f['plan_seconds']:.3f} s  fraction of ideal {f['fraction_of_ideal']:.3f}")
print(f"teraio-alg1  plan {a['plan_seconds']:.3f} s  fraction of ideal {a['fraction_of_ideal']:.3f}")
print(f"planning time ratio alg1/teraio {a['plan_seconds'] / max(f['plan_seconds'], 1e-9):.1f}x")
PY
