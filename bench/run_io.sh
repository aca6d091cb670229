#!/usr/bin/env bash
# bench/run_io.sh — the storage engine against fio on this machine's disk:
# sequential write and read of 1 GiB, 1 MiB requests, depth 32, 3 runs per
# side, alternating (teraio bench io; the issue's full check is the default
# 4 GiB x 5 runs: build/bin/teraio bench io --json).  Prints the engine/fio
# ratios of bandwidth and of CPU seconds per GiB.  Environment: TERAIO (the
# binary), BENCH_IO_DIR (default build/bench-io), BENCH_IO_SIZE, BENCH_IO_RUNS.
set -euo pipefail
cd "$(dirname "$0")/.."
teraio=${TERAIO:-build/bin/teraio}
json=$("$teraio" bench io ${BENCH_IO_DIR:+--dir "$BENCH_IO_DIR"} --size "${BENCH_IO_SIZE:-1GiB}" --runs "${BENCH_IO_RUNS:-3}" --json)
python3 - "$json" <<'PY'
import json, sys
j = json.loads(sys.argv[1])
print(f"backend {j['backend']} (fixed buffers {'on' if j['fixed_buffers'] else 'off'})"
      + (f": {j['backend_reason']}" if j['backend_reason'] else ""))
for op in ("write", "read"):
    m = j[op]
    print(f"{op:5s}  engine {m['engine_gbps']:.3f} GB/s  fio {m['fio_gbps']:.3f} GB/s  "
          f"ratio {m['ratio']:.3f} (target >= 0.95)  cpu ratio {m['cpu_ratio']:.3f} (target <= 1.2)")
PY
