#!/usr/bin/env python3
"""bench/summary.py — one summary of every benchmark of a `make bench` run.

Each benchmark that wants its numbers in the summary writes one file,
``$TERAIO_BENCH_DIR/<name>.json`` (scripts/bench sets the folder, default
build/bench), holding::

    {"bench": "<name>", "title": "<one line>", "reference": "<what it is compared with>",
     "ratios": [{"name": "<what>", "value": <teraio / reference>, "higher_is_better": true}],
     "details": {...anything else...}}

This script (run by scripts/bench after the benchmarks) gathers them into
``summary.json`` (with the date and a description of the machine) and draws
``summary.svg``: one bar per ratio, a line at 1.0.  Adding a benchmark to the
summary is writing that one file; nothing here changes.

Usage: bench/summary.py [DIR]   (default: $TERAIO_BENCH_DIR or build/bench)
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from xml.sax.saxutils import escape


def machine() -> dict:
    """CPU, memory, kernel and the disk under the working directory."""
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                if line.startswith("model name")), platform.processor())
    mem_kib = next(int(line.split()[1]) for line in open("/proc/meminfo") if line.startswith("MemTotal:"))
    disk = ""
    try:
        src = subprocess.run(["findmnt", "-no", "SOURCE", "-T", "."], capture_output=True, text=True,
                             check=True).stdout.strip()
        info = subprocess.run(["lsblk", "-dno", "NAME,SIZE,ROTA,TRAN,MODEL", src], capture_output=True,
                              text=True).stdout.split()
        if info:
            name, size, rota = info[:3]
            driver = Path(f"/sys/block/{name}/device/driver")
            kind = [size, f"driver {driver.resolve().name}" if driver.exists() else "",
                    f"rotational={rota} as the kernel reports", " ".join(info[3:])]
            disk = f"{src} ({', '.join(k for k in kind if k)})"
    except (OSError, subprocess.CalledProcessError, StopIteration):
        pass
    virt = subprocess.run(["systemd-detect-virt"], capture_output=True, text=True).stdout.strip() \
        if Path("/usr/bin/systemd-detect-virt").exists() else ""
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": round(mem_kib / 2**20, 1),
            "kernel": platform.release(), "disk": disk, "virtualization": virt or "unknown"}


def bar_chart(path: Path, title: str, bars: list[tuple[str, float]]) -> None:
    """Horizontal bars of ratios, a dashed line at 1.0."""
    row, left, right, top = 22, 330, 70, 40
    width = 900
    height = top + row * len(bars) + 40
    vmax = max([1.0] + [v for _, v in bars]) * 1.1
    x = lambda v: left + (width - left - right) * v / vmax
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{width / 2}" y="22" text-anchor="middle" font-size="15">{escape(title)}</text>']
    for i, (label, v) in enumerate(bars):
        y = top + i * row
        color = "#2ca02c" if v >= 1.0 else "#1f77b4"
        out.append(f'<text x="{left - 6}" y="{y + 14}" text-anchor="end">{escape(label)}</text>')
        out.append(f'<rect x="{left}" y="{y + 3}" width="{x(v) - left:.1f}" height="{row - 6}" fill="{color}"/>')
        out.append(f'<text x="{x(v) + 4:.1f}" y="{y + 14}">{v:.2f}</text>')
    base = top + row * len(bars)
    out.append(f'<line x1="{x(1.0):.1f}" y1="{top}" x2="{x(1.0):.1f}" y2="{base}" stroke="black" '
               f'stroke-dasharray="4,3"/>')
    out.append(f'<text x="{x(1.0):.1f}" y="{base + 16}" text-anchor="middle">1.0 (reference)</text>')
    out.append("</svg>")
    path.write_text("\n".join(out) + "\n")


def main() -> int:
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("TERAIO_BENCH_DIR", "build/bench"))
    benches = []
    for f in sorted(folder.glob("*.json")):
        if f.name == "summary.json":
            continue
        b = json.loads(f.read_text())
        if not isinstance(b.get("ratios"), list) or "bench" not in b:
            print(f"summary: {f}: not a benchmark result (needs 'bench' and 'ratios'), left out",
                  file=sys.stderr)
            continue
        benches.append(b)
    summary = {"date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
               "machine": machine(), "benches": benches}
    (folder / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    bars = [(f"{b['bench']}: {r['name']}", float(r["value"])) for b in benches for r in b["ratios"]]
    bar_chart(folder / "summary.svg", f"teraio / reference, {summary['date'][:10]}", bars)
    print(f"summary: {len(benches)} benchmark(s), {len(bars)} ratio(s) -> {folder}/summary.json, "
          f"{folder}/summary.svg")
    return 0


if __name__ == "__main__":
    sys.exit(main())
