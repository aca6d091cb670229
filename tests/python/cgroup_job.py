"""A Hugging Face GPT-2 (transformers' code, a small config, no download)
trained for a few steps with AdamW, plainly or under teraio.torch.offload;
run by test_cgroup.py inside a memory cgroup.  Writes its losses, a hash of
its final parameters and what it measured as JSON to argv[1].

    cgroup_job.py OUT.json plain|teraio [--capacity 0.25] [--ssd DIR] [--globals] [--compile] [--batch N]
    torchrun --nproc-per-node 2 cgroup_job.py OUT.json plain|teraio --ddp ...

--globals: a wider model on short sequences, whose parameters, gradients
and AdamW states are most of its peak; its gradients are kept between steps
(zero_grad(set_to_none=False)), so they are global tensors like the rest.
--compile: the model compiled (plain: ``model.compile(dynamic=False)``;
teraio: ``offload(compile=True)``, which compiles it with teraio's backend).
--ddp: each torchrun rank trains the model under DistributedDataParallel
(gloo) on batches of its own and writes OUT.json with ".rankN" before
".json"; teraio profiles three steps (DDP rebuilds its buckets in step 2).
"""
import argparse
import hashlib
import json
import os

import torch


def status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("mode", choices=["plain", "teraio"])
    ap.add_argument("--capacity", type=float, default=0.25)
    ap.add_argument("--ssd")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--globals", action="store_true")
    ap.add_argument("--ddp", action="store_true")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--batch", type=int, help="sequences per batch (default 8; 4 with --globals)")
    a = ap.parse_args()
    rank = 0
    if a.ddp:
        import torch.distributed as dist
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        a.out = a.out.replace(".json", f".rank{rank}.json")
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    from transformers import GPT2Config, GPT2LMHeadModel
    if a.globals:
        cfg = GPT2Config(n_layer=8, n_embd=1024, n_head=8, vocab_size=2048, n_positions=64)
        batch, seq = 4, 64
    else:
        cfg = GPT2Config(n_layer=6, n_embd=256, n_head=4, vocab_size=2048, n_positions=256)
        batch, seq = 8, 256
    batch = a.batch or batch
    torch.manual_seed(0)
    model = GPT2LMHeadModel(cfg)
    if a.ddp:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1 + rank)
    batches = [torch.randint(0, cfg.vocab_size, (batch, seq), generator=g) for _ in range(a.steps)]
    off = None
    if a.compile and a.mode == "plain":
        model.compile(dynamic=False)
    if a.mode == "teraio":
        import teraio.torch
        # the activations evicted while profiling are more than the default SSD space (32 times
        # the model's tensors): space_bytes gives room for the job's peak
        off = teraio.torch.offload(model, opt, capacity=a.capacity, ssd=a.ssd, space_bytes=2 << 30,
                                   profile_iterations=3 if a.ddp else 2, compile=a.compile)
    rss_before = status_kb("VmRSS") * 1024
    losses = []
    after_first = None
    for b in batches:
        with off.step() if off is not None else torch.enable_grad():
            loss = model(input_ids=b, labels=b).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=not a.globals)
        losses.append(loss.item())
        if after_first is None:
            # the process once its code is compiled: its RSS, and the tensor bytes in it
            # (an evicted storage has none)
            from teraio.torch._ids import global_tensors
            held = sum(t.untyped_storage().nbytes() for t, _, _ in global_tensors(model, opt))
            after_first = (status_kb("VmRSS") * 1024, held + b.untyped_storage().nbytes())
    out = {"losses": losses, "rss_before_bytes": rss_before, "peak_rss_bytes": status_kb("VmHWM") * 1024,
           "rss_after_first_bytes": after_first[0], "tensor_bytes_after_first": after_first[1]}
    if off is not None:
        rep = off.report()
        out["report"] = {k: v for k, v in rep.items() if isinstance(v, (int, float, str, bool)) or v is None}
        out["report"]["profiling"] = rep["profiling"]
        out["report"]["plans"] = rep["plans"]
    h = hashlib.sha256()
    for p in model.parameters():
        # detach() is an operator: between steps it fetches an offloaded parameter first
        h.update(p.detach().contiguous().numpy().tobytes())
    out["params_sha256"] = h.hexdigest()
    with open(a.out, "w") as f:
        json.dump(out, f)
    if a.ddp:
        dist.barrier()
    if off is not None:
        # close() would bring every tensor back, the optimizer's states too: more than the limit.
        # The backing file goes with the process (a later engine removes a stale one).
        os._exit(0)


if __name__ == "__main__":
    main()
