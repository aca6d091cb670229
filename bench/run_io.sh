#!/usr/bin/env bash
# bench/run_io.sh — the storage engine against fio at its best on this
# machine's disk (teraio bench io): sequential write and read of 1 GiB in
# 1 MiB requests at depth 32, random reads of 4/32/128 KiB, striping over 2
# and 4 directories, 5 interleaved rounds on the same files (medians).
# Prints the table and writes $TERAIO_BENCH_DIR/io.json (bench/summary.py):
# engine/fio_best bandwidth per pass, and engine/fio_best CPU s/GiB.
# Environment: TERAIO (the binary), BENCH_IO_DIR (default build/bench-io),
# BENCH_IO_SIZE (1GiB), BENCH_IO_RUNS (5), TERAIO_BENCH_DIR (build/bench).
set -euo pipefail
cd "$(dirname "$0")/.."
teraio=${TERAIO:-build/bin/teraio}
out=${TERAIO_BENCH_DIR:-build/bench}
mkdir -p "$out"
json=$("$teraio" bench io ${BENCH_IO_DIR:+--dir "$BENCH_IO_DIR"} --size "${BENCH_IO_SIZE:-1GiB}" \
       --runs "${BENCH_IO_RUNS:-5}" --json)
python3 - "$json" "$out/io.json" <<'PY'
import json, sys
j = json.loads(sys.argv[1])
print(f"engine: {j['backend']}, fixed buffers {'on' if j['fixed_buffers'] else 'off'}, checksums off"
      + (f"; {j['backend_reason']}" if j['backend_reason'] else ""))
print(f"fio_best memory: {j['fio_best_memory']}")
print(f"{'GB/s':14s} {'engine':>8s} {'fio_best':>9s} {'fio_dflt':>9s} {'ratio':>6s} "
      f"{'CPU s/GiB':>10s} {'fio_best':>9s} {'ratio':>6s}")
ratios = []
for p in j["passes"]:
    e, b, d = p["engine"], p["fio_best"], p["fio_default"]
    print(f"{p['name']:14s} {e['gbps']:8.3f} {b['gbps']:9.3f} {d['gbps']:9.3f} {p['ratio']:6.3f} "
          f"{e['cpu_s_per_gib']:10.4f} {b['cpu_s_per_gib']:9.4f} {p['cpu_ratio']:6.3f}")
    ratios.append({"name": f"{p['name']} GB/s vs fio_best", "value": round(p["ratio"], 4),
                   "higher_is_better": True})
for p in j["passes"]:
    if "engine_crc" in p:
        c = p["engine_crc"]
        print(f"CRC32C on, {p['name']}: {c['gbps']:.3f} GB/s ({p['crc_ratio']:.3f} of off), "
              f"+{p['crc_cpu_s_per_gib']:.4f} CPU s/GiB")
for p in j["passes"]:
    if p["pattern"] == "sequential" and p["dirs"] == j["dirs"]:
        ratios.append({"name": f"{p['name']} CPU s/GiB vs fio_best", "value": round(p["cpu_ratio"], 4),
                       "higher_is_better": False})
json.dump({"bench": "io", "title": "teraio engine against fio at its best, same files",
           "reference": "fio_best (io_uring, direct, fixed buffers and files, huge pages)",
           "ratios": ratios, "details": j}, open(sys.argv[2], "w"), indent=1)
PY
