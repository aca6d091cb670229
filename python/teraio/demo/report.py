"""The demo's report: summary.json, memory.svg and the printed lines (runs A,
B and V), and for --sweep sweep.json, sweep.md and sweep.svg."""
from __future__ import annotations

import json
import os
import time

from .job import say


def mib(x: float) -> str:
    return f"{x / 2**20:.1f} MiB"


def summary_of(args, a: dict, b: dict, t0: float) -> dict:
    """summary.json: runs A and B side by side (and V's numbers)."""
    n = min(len(a["losses"]), len(b["losses"]))
    s = b["stats"]
    out = {
        "mode": b.get("mode", "eager"),
        "model": "llama-demo", "n_params": a["n_params"], "corpus_bytes": a["corpus_bytes"],
        "n_kernels": a["n_kernels"],
        "peak_bytes_no_offload": a["peak_bytes"],
        "capacity_bytes": b["capacity_bytes"],
        "planned_peak_bytes": b["plan"]["planned_peak_bytes"],
        "plan_fits": b["plan"]["fits"],
        "peak_resident_bytes": s["peak_resident_bytes"],
        "rss_above_base_peak_bytes": max(b.get("rss_curve") or [0]),
        "over_capacity_kernels": s["over_capacity_kernels"],
        "rss_peak_no_offload_bytes": a["rss_peak_bytes"],
        "rss_peak_offload_bytes": b["rss_peak_bytes"],
        "rss_peak_window": "offloaded iterations (peak reset after profiling)"
        if a["rss_peak_reset"] and b["rss_peak_reset"] else "whole process",
        "iterations_compared": n,
        "losses_identical": a["loss_bits"][:n] == b["loss_bits"][:n] and n == args.iterations,
        "losses_no_offload": a["losses"], "losses_offload": b["losses"],
        "iter_time_no_offload_s": a["iter_time_s"],
        "iter_time_offload_s": b["iter_time_s"],
        "bytes_offloaded": s["bytes_offloaded"],
        "bytes_prefetched": s["bytes_prefetched"],
        "bytes_fetched_urgent": s["bytes_fetched_urgent"],
        "stalls": s["stalls"], "stall_time_s": s["stall_ns"] / 1e9,
        "deadline_wait_s": s["wait_ns"] / 1e9,
        "offloads_refused": s["offloads_refused"], "diverged": s["diverged_iterations"] > 0,
        "backend": b["backend"], "backend_reason": b["backend_reason"],
        "ssd_dirs": b["ssd_dirs"],
        "ssd_read_gbps_measured": b["ssd_read_gbps"], "ssd_write_gbps_measured": b["ssd_write_gbps"],
        "plan_migrations": b["plan"]["migrations"], "plan_seconds": b["plan"]["plan_seconds"],
        "wall_time_s": time.time() - t0,
    }
    v = b.get("validation")
    if v:
        out.update({f"validation_{k}": x for k, x in v.items() if k != "times"})
        out["validation_times_s"] = v["times"]
    return out


def memory_chart(path: str, a: dict, b: dict, capacity: int) -> None:
    from ..svg import line_chart
    to_mib = lambda ys: [y / 2**20 for y in ys]
    line_chart(path, "llama-demo: bytes resident per kernel over one iteration", "kernel index", "MiB",
               [{"label": "no offloading (M)", "y": to_mib(a["memory_curve"])},
                {"label": "as planned (M')", "y": to_mib(b["planned_curve"])},
                {"label": "as measured (offloading)", "y": to_mib(b["measured_curve"])},
                *([{"label": "process RSS above Python+PyTorch (offloading)", "y": to_mib(b["rss_curve"])}]
                  if b.get("rss_curve") else []),
                {"label": "capacity", "y": [capacity / 2**20] * len(a["memory_curve"]), "dash": True}])


def report_limit(limited: dict | None) -> bool:
    """Print what the runs inside a memory limit did; False if run B (run L)
    did not train there with run A's losses."""
    if not limited:
        return True
    if "skipped" in limited:
        say(f"  memory limit                    {limited['skipped']}")
        return True
    lim = limited["limit_bytes"]
    if "a_survived_halfway_bytes" in limited and lim == limited["need_b_bytes"]:
        say(f"  memory limit (cgroup v{limited['cgroup_version']})        {mib(lim)}: what teraio's run (run L) needs (run A lived "
            f"through {mib(limited['a_survived_halfway_bytes'])}, halfway between its peak "
            f"{mib(limited['peak_a_bytes'])} and that, by giving up page cache and library pages)")
    else:
        say(f"  memory limit (cgroup v{limited['cgroup_version']})        {mib(lim)}: halfway between run A's peak "
            f"{mib(limited['peak_a_bytes'])} (the cgroup's count, not RSS: page cache in, library pages "
            f"cached before out) and what teraio's run (run L) needs, {mib(limited['need_b_bytes'])}")
    say(f"    teraio's capacity there       {mib(limited['capacity_bytes'])} (x{limited['capacity_share']:.2f})")
    a_says = ("killed by the kernel (over the limit)" if limited["a_killed"] else
              "NOT killed: the kernel reclaimed page cache and library pages instead, so this limit does not "
              "show the point (a larger model would)")
    say(f"    without teraio                {a_says}, peak {mib(limited['peak_a_limited_bytes'])}")
    if limited["b_trained"]:
        say(f"    with teraio                   trained, peak {mib(limited['peak_b_limited_bytes'])}, losses "
            f"identical {limited['b_losses_identical']}, kernels over the capacity "
            f"{limited['b_over_capacity_kernels']}")
        return limited["b_losses_identical"]
    say(f"    with teraio                   killed by the kernel, peak {mib(limited['peak_b_limited_bytes'])}")
    return False


def report_demo(args, a: dict, b: dict, t0: float, limited: dict | None = None) -> int:
    """Write summary.json and memory.svg, print the report; 0 if the losses
    are identical (and, inside a memory limit, run B trained there)."""
    summary = summary_of(args, a, b, t0)
    if limited is not None:
        summary["memory_limit"] = limited
    path = os.path.join(args.out, "summary.json")
    with open(path, "w") as f:
        json.dump(summary, f, indent=2)
    capacity = summary["capacity_bytes"]
    memory_chart(os.path.join(args.out, "memory.svg"), a, b, capacity)
    s, n = b["stats"], summary["iterations_compared"]
    say(f"teraio demo ({summary['mode']}): {a['n_params'] / 1e6:.1f}M-parameter Llama-style model, {n} "
        f"iterations on {a['corpus_bytes'] / 1e6:.1f} MB of Python stdlib source")
    say(f"  peak memory without offloading  {mib(a['peak_bytes'])}")
    say(f"  {'capacity (x' + format(args.capacity_fraction, 'g') + ')':<32}{mib(capacity)}")
    say(f"  peak resident with offloading   {mib(s['peak_resident_bytes'])}"
        f" (planned {mib(b['plan']['planned_peak_bytes'])}; kernels over the capacity: "
        f"{s['over_capacity_kernels']})")
    say(f"  process peak RSS                {mib(a['rss_peak_bytes'])} -> {mib(b['rss_peak_bytes'])}")
    say(f"  moved per run                   {mib(s['bytes_offloaded'])} offloaded, "
        f"{mib(s['bytes_prefetched'])} prefetched, {mib(s['bytes_fetched_urgent'])} fetched on demand")
    say(f"  stalls                          {s['stalls']} ({s['stall_ns'] / 1e9:.3f} s)")
    say(f"  iteration time                  {a['iter_time_s']:.3f} s -> {b['iter_time_s']:.3f} s "
        f"(backend {b['backend']}, SSD {b['ssd_write_gbps']:.2f} GB/s write, {b['ssd_read_gbps']:.2f} GB/s read)")
    say(f"  losses identical                {summary['losses_identical']} over {n} iterations "
        f"(first {a['losses'][0]:.4f}, last {a['losses'][-1]:.4f})")
    check = b["validation"]["sim_check"] if b.get("validation") else None
    if check and "error" in check:
        say(f"  simulator check                 {check['error']}")
    elif check:
        say(f"  simulator check                 simulated {check['simulated_s']:.3f} s, measured "
            f"{check['measured_s']:.3f} s per offloaded iteration ({100 * check['sim_vs_measured_error']:.1f}% "
            f"off; host costs fitted in-process)")
    limit_ok = report_limit(limited)
    say(f"  wrote {path} and {os.path.join(args.out, 'memory.svg')}")
    return 0 if summary["losses_identical"] and limit_ok else 1


def sweep_rows(a: dict, s: dict) -> list[dict]:
    """Run S's rows, each share's losses (and all before them) checked
    against run A's."""
    rows = []
    for r in s["rows"]:
        r = dict(r)
        if "skipped" not in r:
            end = r["first_iteration"] + r["n_iterations"]
            r["losses_identical"] = s["losses"][:end] == a["losses"][:end]
            r["iter_time_ratio"] = r["iter_time_s"] / r["iter_time_no_offload_s"]
        rows.append(r)
    return rows


def sweep_table(rows: list[dict]) -> str:
    """The README's table (markdown)."""
    out = ["| capacity (share of peak) | planned peak | measured resident peak | moved per iteration "
           "| stalls | iteration time vs no offloading | simulated / measured iteration | losses identical |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        head = f"| {mib(r['capacity_bytes'])} ({r['share']:g})"
        if "skipped" in r:
            out.append(f"{head} | {r['skipped']} | | | | | | |")
            continue
        sim = r["simulator"]
        sim_text = (f"{sim['simulated_s']:.3f} s / {r['iter_time_s']:.3f} s "
                    f"({100 * sim['sim_vs_measured_error']:+.1f}%)" if "error" not in sim
                    else "no fit (sweep.json says why)")
        fit = "" if r["fits"] else " (does not fit)"
        out.append(f"{head} | {mib(r['planned_peak_bytes'])}{fit} | {mib(r['peak_resident_bytes'])} | "
                   f"{mib(r['bytes_moved_per_iteration'])} | {r['stalls']} ({r['stall_s']:.3f} s) | "
                   f"{r['iter_time_ratio']:.2f}x ({r['iter_time_s']:.2f} s / {r['iter_time_no_offload_s']:.2f} s) | "
                   f"{sim_text} | {r['losses_identical']} |")
    return "\n".join(out) + "\n"


def report_sweep(args, a: dict, s: dict, t0: float) -> int:
    """Write sweep.json, sweep.md and sweep.svg and print the table; 0 if
    every share fitted, stayed within its capacity and kept the losses."""
    from ..svg import line_chart
    rows = sweep_rows(a, s)
    ran = [r for r in rows if "skipped" not in r]
    table = sweep_table(rows)
    out = {"peak_bytes_no_offload": a["peak_bytes"], "floor_bytes": s["floor_bytes"],
           "rows": rows, "backend": s["backend"],
           "ssd_read_gbps_measured": s["ssd_read_gbps"], "ssd_write_gbps_measured": s["ssd_write_gbps"],
           "wall_time_s": time.time() - t0}
    with open(os.path.join(args.out, "sweep.json"), "w") as f:
        json.dump(out, f, indent=2)
    with open(os.path.join(args.out, "sweep.md"), "w") as f:
        f.write(table)
    shares = [r["share"] for r in ran]
    series = [{"label": "measured", "x": shares, "y": [r["iter_time_ratio"] for r in ran], "points": True}]
    sim = [r for r in ran if "error" not in r["simulator"]]
    if sim:
        series.append({"label": "simulated", "x": [r["share"] for r in sim], "points": True, "dash": True,
                       "y": [r["simulator"]["simulated_s"] / r["iter_time_no_offload_s"] for r in sim]})
    series.append({"label": "no offloading", "x": [min(shares), max(shares)], "y": [1.0, 1.0], "dash": True})
    line_chart(os.path.join(args.out, "sweep.svg"),
               "llama-demo: iteration time against capacity (ratio to no offloading)",
               "capacity (share of the peak without offloading)", "iteration time / no offloading", series)
    say(f"teraio demo --sweep: peak {mib(a['peak_bytes'])} without offloading, working-set floor "
        f"{mib(s['floor_bytes'])}; backend {s['backend']}, SSD {s['ssd_write_gbps']:.2f} GB/s write, "
        f"{s['ssd_read_gbps']:.2f} GB/s read")
    say(table.rstrip())
    say(f"  wrote {os.path.join(args.out, 'sweep.json')}, sweep.md and sweep.svg")
    ok = all(r["fits"] and r["peak_resident_bytes"] <= r["capacity_bytes"] and r["losses_identical"]
             for r in ran)
    return 0 if ok else 1
