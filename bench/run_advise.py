#!/usr/bin/env python3
"""bench/run_advise.py — how far `teraio advise` is from measured runs on this CPU.

teraio advise predicts from a meta-device trace (no run) timed by a
roofline of the hardware profile.  Here the hardware is this machine: the
CPU is the "device", its memory the device memory, a directory on this disk
the SSD.  The bench

1. measures this CPU's profile by microbenchmarks (build/bench-advise/cpu.conf):
   matrix-product rate, memory bandwidth, the time of one tiny operator (the
   per-kernel overhead), the disk's read and write bandwidth through the
   engine; then three numbers fitted on the demo model alone: one
   efficiency that scales every roofline kernel time so that its predicted
   ideal equals its plain loop, teraio's dispatch time per kernel (a session
   with nothing to move against the plain loop), and teraio's host time per
   migrated byte (so that the prediction at CALIBRATION of its peak equals
   the measured run — the one offloading point fitted, marked as such);
2. predicts with `teraio advise --trace` (ideal and teraio, one SSD, no host
   memory) for two models at several capacities: the demo's model
   (teraio.models.llama, the code `make demo` trains) and Hugging Face
   transformers' GPT-2 as it comes (sdpa attention) from a small config;
3. measures the same jobs: the plain loop, and teraio.torch.offload at each
   capacity (2 profiled steps, then planned steps, median).

Printed: per model and capacity, predicted over measured iteration time
(ideal and teraio) and the peak advise traced against the profiled peak;
the mean and worst error over the points not fitted.  Written to
build/bench-advise/error.json and, for `make bench`'s summary,
$TERAIO_BENCH_DIR/advise.json.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "python"))
OUT = REPO / "build" / "bench-advise"
TERAIO = REPO / "build" / "bin" / "teraio"
DEMO = dict(dim=256, n_layers=6, n_heads=4, ffn_dim=704, max_seq_len=256)  # teraio.demo's
GPT2 = dict(model_type="gpt2", n_embd=256, n_layer=6, n_head=4, vocab_size=2048, n_positions=256)
JOBS = {"demo": dict(batch=6, seq=256), "gpt2": dict(batch=8, seq=256)}
SHARES = (0.8, 0.6, 0.5, 0.4, 0.3)
CALIBRATION = ("demo", 0.5)
PROFILED = 2


def say(msg: str) -> None:
    if sys.stderr.isatty():
        print(f"\r\033[K{msg}", end="", file=sys.stderr, flush=True)


def best_of(fn, n: int = 5) -> float:
    best = float("inf")
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


# ---- 1. this CPU's profile ----------------------------------------------------

def microbenchmarks(ssd: str) -> dict:
    import torch
    from teraio.core import Engine
    a, b = torch.randn(2048, 512), torch.randn(512, 512)
    mm = 2 * 2048 * 512 * 512 / best_of(lambda: torch.mm(a, b)) / 1e12
    x, y = torch.randn(1 << 24), torch.randn(1 << 24)
    out = torch.empty_like(x)
    bw = 3 * x.numel() * 4 / best_of(lambda: torch.add(x, y, out=out)) / 1e9
    s, t = torch.ones(1), torch.ones(1)
    op_us = best_of(lambda: [torch.add(s, t) for _ in range(2000)]) / 2000 * 1e6
    with Engine([ssd], 1 << 30) as eng:
        read, write = eng.measure_gbps(256 << 20)
    return {"matmul_tflops": mm, "mem_gbps": bw, "op_us": op_us, "ssd_read_gbps": read,
            "ssd_write_gbps": write}


def write_profile(path: Path, m: dict, host_overhead_us: float, ns_per_byte: float,
                  efficiency: float = 1.0) -> None:
    path.write_text(f"""# This CPU as teraio advise's "device" (bench/run_advise.py measured it)
name = this-cpu
capacity_bytes = {1 << 30}
pcie_h2d_gbps = 10
pcie_d2h_gbps = 10
ssd_count = 1
ssd_read_gbps = {m['ssd_read_gbps']:.4f}
ssd_write_gbps = {m['ssd_write_gbps']:.4f}
ssd_latency_us = 0
host_latency_us = 0
host_cap_bytes = 0
cpu_adam_params_per_s = 1e9
gpu_matmul_tflops = {m['matmul_tflops']:.6f}
gpu_vector_tflops = {m['matmul_tflops']:.6f}
gpu_mem_gbps = {m['mem_gbps']:.4f}
matmul_efficiency = {efficiency:.6f}
mem_efficiency = {efficiency:.6f}
kernel_overhead_us = {m['op_us'] / efficiency:.4f}
host_overhead_us = {host_overhead_us:.4f}
migration_host_ns_per_byte = {ns_per_byte:.6f}
""")


# ---- the two jobs, on the meta device and for real ------------------------------

def build(kind: str, meta: bool = False):
    """The model and its AdamW, on the meta device (what advise traces) or
    for real on the CPU (GPT-2 then as transformers builds it, sdpa attention)."""
    import torch
    from teraio.models.llama import Llama, LlamaConfig
    from teraio.paper import build_causal_lm
    torch.manual_seed(0)
    if kind == "demo":
        with torch.device("meta" if meta else "cpu"):
            net = Llama(LlamaConfig(**DEMO))
    elif meta:
        net = build_causal_lm(GPT2)
    else:
        from transformers import AutoConfig, AutoModelForCausalLM
        d = dict(GPT2)
        net = AutoModelForCausalLM.from_config(AutoConfig.for_model(d.pop("model_type"), **d))
    return net, torch.optim.AdamW(net.parameters(), lr=3e-4, foreach=False)


def train_step(kind: str, net, opt, ids) -> None:
    """One iteration as the advise tracer's loop: gradients set to None after the step."""
    loss = net(ids[:, :-1], ids[:, 1:]) if kind == "demo" else net(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def meta_trace(kind: str, profile: Path) -> tuple[Path, int]:
    import torch
    from teraio.advise import trace_module
    from teraio.paper import Roofline, read_hw
    job = JOBS[kind]
    net, opt = build(kind, meta=True)
    extra = 1 if kind == "demo" else 0
    ids = torch.zeros(job["batch"], job["seq"] + extra, dtype=torch.long, device="meta")
    tokens = job["batch"] * job["seq"]
    path = OUT / f"{kind}.tio"
    trace_module(net, opt, lambda: train_step(kind, net, opt, ids), f"bench {kind} tokens={tokens}",
                 Roofline(read_hw(str(profile))), str(path))
    return path, tokens


def advise(trace: Path, profile: Path, capacities: list[int]) -> list[dict]:
    r = subprocess.run([str(TERAIO), "advise", "--trace", str(trace), "--hw", str(profile),
                        "--gpu-mem", ",".join(f"{c}B" for c in capacities), "--ssds", "1",
                        "--host-cap", "0", "--json"], capture_output=True, text=True, check=True)
    return json.loads(r.stdout)["rows"]


def measure(kind: str, capacities: list[int], ssd: str, steps: int) -> dict:
    """Plain loop, a session with nothing to move, and one session per capacity."""
    import torch
    import teraio.torch
    from teraio import TeraioError
    job = JOBS[kind]
    g = torch.Generator().manual_seed(1)
    vocab = 256 if kind == "demo" else GPT2["vocab_size"]
    extra = 1 if kind == "demo" else 0
    batches = [torch.randint(0, vocab, (job["batch"], job["seq"] + extra), generator=g)
               for _ in range(PROFILED + steps)]

    def run(label: str, capacity: int | None) -> dict:
        net, opt = build(kind)
        sess = None if capacity is None else teraio.torch.offload(net, opt, capacity=capacity,
                                                                  ssd=[ssd])
        times = []
        try:
            for i, ids in enumerate(batches):
                say(f"bench advise: {kind} {label}: step {i + 1}/{len(batches)}")
                t0 = time.perf_counter()
                if sess is None:
                    train_step(kind, net, opt, ids)
                else:
                    with sess.step():
                        train_step(kind, net, opt, ids)
                times.append(time.perf_counter() - t0)
        except TeraioError as e:
            return {"refused": str(e)}
        out = {"iteration_s": statistics.median(times[PROFILED:])}
        if sess is not None:
            rep = sess.report()
            out.update(kernels=sess.trace.n_kernels, peak_bytes=sess.lifetime.peak_bytes,
                       over_capacity_kernels=rep.get("over_capacity_kernels"),
                       bytes_to_ssd=sess.plan.bytes_to_ssd)
            sess.close()
        return out

    res = {"plain": run("plain", None), "unlimited": run("nothing to move", 1 << 40)}
    res["capacities"] = {c: run(f"capacity {c / 2**20:.0f} MiB", c) for c in capacities}
    return res


# ---- 2 and 3: predict, measure, compare -----------------------------------------

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=5, help="planned steps measured per run (>= 3)")
    a = ap.parse_args()
    from teraio.demo.job import setup_process
    setup_process()
    import torch
    torch.set_num_threads(1)
    OUT.mkdir(parents=True, exist_ok=True)
    ssd = str(OUT / "ssd")
    os.makedirs(ssd, exist_ok=True)
    say("bench advise: microbenchmarks")
    micro = microbenchmarks(ssd)
    profile = OUT / "cpu.conf"
    write_profile(profile, micro, 0.0, 0.0)
    traces = {k: meta_trace(k, profile) for k in JOBS}
    caps, measured, pred = {}, {}, {}
    for kind, (path, _) in traces.items():
        from teraio.core import Lifetime, Trace
        peak = Lifetime(Trace.load(str(path))).peak_bytes
        caps[kind] = [int(s * peak) for s in SHARES]
        measured[kind] = measure(kind, caps[kind], ssd, a.steps)
    # The calibration, all on the demo model: one efficiency scales every
    # roofline kernel time so that its ideal equals its plain loop (the
    # traces are made again with it); teraio's dispatch per kernel from its
    # session that moves nothing; host time per byte fitted at CALIBRATION.
    d = measured["demo"]
    ideal0 = advise(traces["demo"][0], profile, caps["demo"][:1])[0]["strategies"]["ideal"]
    efficiency = ideal0["iteration_s"] / d["plain"]["iteration_s"]
    write_profile(profile, micro, 0.0, 0.0, efficiency)
    traces = {k: meta_trace(k, profile) for k in JOBS}
    host_us = max(0.0, (d["unlimited"]["iteration_s"] - d["plain"]["iteration_s"]) /
                  d["unlimited"]["kernels"] * 1e6)
    cal_kind, cal_share = CALIBRATION
    cal_cap = caps[cal_kind][SHARES.index(cal_share)]
    cal_meas = measured[cal_kind]["capacities"][cal_cap]["iteration_s"]
    sims = []
    for ns in (0.0, 1.0):
        write_profile(profile, micro, host_us, ns, efficiency)
        sims.append(advise(traces[cal_kind][0], profile, [cal_cap])[0]["strategies"]["teraio"]
                    ["iteration_s"])
    ns_per_byte = max(0.0, (cal_meas - sims[0]) / (sims[1] - sims[0])) if sims[1] > sims[0] else 0.0
    write_profile(profile, micro, host_us, ns_per_byte, efficiency)
    rows, errors, ideal_errors = [], [], []
    for kind, (path, _) in traces.items():
        adv = advise(path, profile, caps[kind])
        m = measured[kind]
        ideal_pred = adv[0]["strategies"]["ideal"]["iteration_s"]
        ideal_err = ideal_pred / m["plain"]["iteration_s"] - 1
        if kind != CALIBRATION[0]:
            ideal_errors.append(abs(ideal_err))
        for share, cap, row in zip(SHARES, caps[kind], adv):
            got = m["capacities"][cap]
            pred_s = row["strategies"]["teraio"]["iteration_s"]
            fitted = (kind, share) == CALIBRATION
            r = {"model": kind, "share": share, "capacity_bytes": cap, "fitted": fitted,
                 "predicted_s": pred_s, "predicted_ideal_s": ideal_pred,
                 "measured_plain_s": m["plain"]["iteration_s"], "traced_peak_bytes": row["peak_bytes"],
                 "profiled_peak_bytes": m["unlimited"]["peak_bytes"], **got}
            if "iteration_s" in got and pred_s:
                r["error"] = pred_s / got["iteration_s"] - 1
                if not fitted:
                    errors.append(abs(r["error"]))
            rows.append(r)
    summary = {"profile": micro | {"efficiency": efficiency, "host_overhead_us": host_us,
                                   "migration_host_ns_per_byte": ns_per_byte},
               "rows": rows, "teraio_mean_abs_error": statistics.mean(errors) if errors else None,
               "teraio_max_abs_error": max(errors) if errors else None,
               "ideal_max_abs_error": max(ideal_errors) if ideal_errors else None,
               "points_not_fitted": len(errors)}
    say("")
    print(f"bench advise: this CPU as the device: {micro['matmul_tflops'] * 1e3:.1f} GFLOPS matmul, "
          f"{micro['mem_gbps']:.1f} GB/s memory, {micro['op_us']:.1f} us per tiny operator, disk "
          f"{micro['ssd_read_gbps']:.2f}/{micro['ssd_write_gbps']:.2f} GB/s read/write; fitted on "
          f"the demo model: roofline efficiency {efficiency:.3f} (its plain loop), teraio "
          f"{host_us:.1f} us per kernel, {ns_per_byte:.3f} ns per migrated byte (fitted at "
          f"{cal_kind} {cal_share})")
    print(f"{'model':6s} {'share':>5s} {'capacity':>10s} {'traced peak':>11s} {'profiled':>9s} "
          f"{'ideal pred/meas':>15s} {'teraio pred':>11s} {'measured':>9s} {'pred/meas':>9s}")
    for r in rows:
        meas = r.get("iteration_s")
        print(f"{r['model']:6s} {r['share']:5.2f} {r['capacity_bytes'] / 2**20:6.0f} MiB "
              f"{r['traced_peak_bytes'] / 2**20:7.0f} MiB {r['profiled_peak_bytes'] / 2**20:5.0f} MiB "
              f"{r['predicted_ideal_s'] / r['measured_plain_s']:15.2f} "
              f"{r['predicted_s'] or float('nan'):9.3f} s "
              + (f"{meas:7.3f} s {r['predicted_s'] / meas:9.2f}" if meas else f"refused: {r['refused']}")
              + ("  (fitted)" if r["fitted"] else ""))
    if errors:
        print(f"teraio's iteration time: mean |error| {summary['teraio_mean_abs_error']:.1%}, worst "
              f"{summary['teraio_max_abs_error']:.1%} over {len(errors)} points not fitted; ideal "
              f"(no offloading) of the model not fitted: {summary['ideal_max_abs_error']:.1%}")
    (OUT / "error.json").write_text(json.dumps(summary, indent=1))
    bench_dir = os.environ.get("TERAIO_BENCH_DIR")
    if bench_dir and errors:
        Path(bench_dir, "advise.json").write_text(json.dumps({
            "bench": "advise", "title": "teraio advise's prediction against measured runs (this CPU)",
            "reference": "the same jobs measured in this run (plain loop and teraio.torch.offload)",
            "ratios": [{"name": f"{r['model']} at {r['share']:g}: predicted / measured",
                        "value": r["predicted_s"] / r["iteration_s"], "higher_is_better": False}
                       for r in rows if r.get("iteration_s") and not r["fitted"]],
            "details": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
