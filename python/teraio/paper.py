"""Paper-scale traces: one training iteration of the TERAIO paper's models.

The real Hugging Face ``transformers`` model code (``LlamaForCausalLM`` for
Llama 3 and Granite code 3B/8B, ``GPTBigCodeForCausalLM`` for Granite code
20B/34B) runs on PyTorch's ``meta`` device under ``teraio.torch.Profiler``:
shapes and tensor lifetimes are real, nothing is computed or allocated.
FP32 weights, AdamW, no activation checkpointing (TERAIO paper, section 4.1).

Kernel times come from a roofline of the H100 NVL read from the hardware
profile (``hw/h100-nvl-paper.conf``: peak rates, efficiencies and their
sources): ``max(flops / (peak x eff), bytes / (bandwidth x eff)) + overhead``.
Attention is FlashAttention (``aten._scaled_dot_product_flash_attention``),
as PyTorch's SDPA runs it on an H100, so no seq x seq score matrix is kept.

Per-GPU layout (2 GPUs, the paper's testbed), documented in docs/eval.md.
The paper states neither its parallel layout nor its micro-batch; both are
fitted to its M column.  ``SHARDS[model]``: 2 is FSDP-style sharding (each
GPU holds half of every parameter, gradient and optimizer state and runs the
optimizer on its half: those tensors' bytes and the optimizer kernels' times
halved — Llama3-8B and Llama3-70B), 1 is data parallel (each GPU holds a
full replica — Granite-8B, whose sequence sweep reaches 8192 tokens per
sequence: with sharding no whole number of such sequences lands within 10%
of its M).  The loop is TorchTitan's: forward, backward, AdamW step, then
``zero_grad(set_to_none=True)``, so gradients live from the backward pass to
the optimizer step.  Each GPU keeps its own activations for a
micro-batch of ``MICRO_BATCH[(model, batch, seq)]`` sequences; the rest of
the global batch would be gradient accumulation over the same kernels,
which does not change the peak (the trace is one micro-batch and the
optimizer step).

The profiler's trace is post-processed: kernels that only make views or read
scalars (``aten.view``, ``aten.t``, ``aten._local_scalar_dense``...) are
dropped — they move no bytes and every storage they touch is touched again by
the kernel that consumes the view — and tensors no kernel then touches are
dropped, ids renumbered.

Usage: ``python -m teraio.paper trace DIR [--hw hw/h100-nvl-paper.conf]``
(``make paper-traces``) writes the paper's configurations as a suite for
``teraio eval paper --traces DIR``: the traces (cached: a file that exists
is reused), a copy of the hardware profile (``DIR/hw.conf``) and the index
``DIR/suite.txt`` (format in include/teraio/sim.h) with the paper's M and
its published fractions of ideal.  ``python -m teraio.paper --model
llama3-8b --batch 32 --seq 2048 --hw hw/h100-nvl-paper.conf -o x.tio``
traces one configuration.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

# Model configurations: values of each model's config.json on Hugging Face
# (meta-llama/Meta-Llama-3-8B, meta-llama/Meta-Llama-3-70B,
# ibm-granite/granite-{3b,8b,20b,34b}-code-base) and the Granite Code paper
# (arXiv 2405.04324, Table 1); see /work/shared/REFERENCE.md.
MODELS = {
    "llama3-8b": dict(cls="llama", hidden_size=4096, intermediate_size=14336,
                      num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                      vocab_size=128256, max_position_embeddings=8192, rope_theta=500000.0,
                      tie_word_embeddings=False, params=8_030_261_248),
    "llama3-70b": dict(cls="llama", hidden_size=8192, intermediate_size=28672,
                       num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8,
                       vocab_size=128256, max_position_embeddings=8192, rope_theta=500000.0,
                       tie_word_embeddings=False, params=70_553_706_496),
    "granite-3b": dict(cls="llama", hidden_size=2560, intermediate_size=10240,
                       num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
                       vocab_size=49152, max_position_embeddings=2048, rope_theta=10000.0,
                       tie_word_embeddings=True, attention_bias=True, mlp_bias=True,
                       params=3_482_503_680),
    "granite-8b": dict(cls="llama", hidden_size=4096, intermediate_size=14336,
                       num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                       vocab_size=49152, max_position_embeddings=4096, rope_theta=10000.0,
                       tie_word_embeddings=True, attention_bias=True, mlp_bias=True,
                       params=8_054_910_976),
    "granite-20b": dict(cls="gpt_bigcode", n_embd=6144, n_inner=24576, n_layer=52, n_head=48,
                        multi_query=True, vocab_size=49152, n_positions=8192,
                        activation_function="gelu_pytorch_tanh", tie_word_embeddings=True,
                        params=20_066_993_152),
    "granite-34b": dict(cls="gpt_bigcode", n_embd=6144, n_inner=24576, n_layer=88, n_head=48,
                        multi_query=True, vocab_size=49152, n_positions=8192,
                        activation_function="gelu_pytorch_tanh", tie_word_embeddings=True,
                        params=33_715_603_456),
}

# Bumped whenever a change here changes the traces: part of the cache key
# (DIR/<model>-s<seq>-mb<micro>-x<shards>-t<version>.tio).
TRACER_VERSION = 2

GPUS = 2  # the paper's testbed; each GPU traced alone, its share per SHARDS

# Sequences per GPU micro-batch for each of the paper's configurations
# (model, global batch, sequence length).  The paper does not state its
# micro-batch; it is the one free parameter of the layout, chosen per
# configuration as the whole number of sequences whose traced peak memory
# per GPU comes closest to the paper's M (docs/eval.md lists both).  The
# rest of the global batch is gradient accumulation over the same kernels.
MICRO_BATCH = {
    ("llama3-8b", 32, 2048): 4, ("llama3-8b", 64, 2048): 4, ("llama3-8b", 128, 2048): 4,
    ("llama3-8b", 64, 1024): 9, ("llama3-8b", 64, 4096): 2,
    ("granite-8b", 32, 4096): 4, ("granite-8b", 64, 4096): 4, ("granite-8b", 128, 4096): 4,
    ("granite-8b", 64, 2048): 8, ("granite-8b", 64, 8192): 2,
    ("llama3-70b", 8, 2048): 3, ("llama3-70b", 16, 2048): 4, ("llama3-70b", 32, 2048): 6,
    ("llama3-70b", 16, 3072): 3, ("llama3-70b", 16, 4096): 3,
}
# GPUs each global tensor is sharded over (1: data-parallel replica).
SHARDS = {"llama3-8b": 2, "granite-8b": 1, "llama3-70b": 2}

# Other shapes (and the Granite 3B/20B/34B models, which the paper's table
# does not use): this many tokens per micro-batch.
DEFAULT_MICRO_TOKENS = 8192

# The paper's 18 configurations (DESIGN.md "Simulation and evaluation
# protocol"): model, global batch, sequence length, and M (peak memory per
# GPU / 94 GB, in %) as the paper's range gives it; within a model the
# paper's M grows with tokens per step, so each configuration's reference M
# is interpolated in tokens across the model's range.
PAPER_M_RANGE = {"llama3-8b": (188, 191), "granite-8b": (379, 387), "llama3-70b": (940, 1243)}
PAPER_RUNS = [
    ("llama3-8b", 32, 2048), ("llama3-8b", 64, 2048), ("llama3-8b", 128, 2048),
    ("llama3-8b", 64, 1024), ("llama3-8b", 64, 2048), ("llama3-8b", 64, 4096),
    ("granite-8b", 32, 4096), ("granite-8b", 64, 4096), ("granite-8b", 128, 4096),
    ("granite-8b", 64, 2048), ("granite-8b", 64, 4096), ("granite-8b", 64, 8192),
    ("llama3-70b", 8, 2048), ("llama3-70b", 16, 2048), ("llama3-70b", 32, 2048),
    ("llama3-70b", 16, 2048), ("llama3-70b", 16, 3072), ("llama3-70b", 16, 4096),
]

VIEW_OPS = {
    "aten.view.default", "aten._unsafe_view.default", "aten.t.default",
    "aten.transpose.int", "aten.expand.default", "aten.slice.Tensor",
    "aten.unsqueeze.default", "aten.squeeze.dim", "aten.squeeze.default",
    "aten.detach.default", "aten.alias.default", "aten.permute.default",
    "aten.as_strided.default", "aten.select.int", "aten.split.Tensor",
    "aten.split_with_sizes.default", "aten.unbind.int", "aten._reshape_alias.default",
    "aten.lift_fresh.default", "aten._local_scalar_dense.default", "aten.reshape.default",
    "aten.unsafe_split.Tensor", "aten.view_as.default", "aten._to_copy.default",
    "aten.scalar_tensor.default", "aten.arange.default", "aten.arange.start",
    "aten.ones.default", "aten.zeros.default", "aten.empty.memory_format",
    "aten.full.default",
}


def paper_m(model: str, batch: int, seq: int) -> float:
    """Reference M (%) of a configuration, interpolated in tokens per step."""
    lo, hi = PAPER_M_RANGE[model]
    toks = [b * s for m, b, s in PAPER_RUNS if m == model]
    t0, t1 = min(toks), max(toks)
    return lo + (hi - lo) * ((batch * seq - t0) / (t1 - t0) if t1 > t0 else 0.0)


def read_hw(path: str) -> dict:
    """The hardware profile, read by the library (tio_hw_load)."""
    from .core import load_hw
    return load_hw(path)


class Roofline:
    """Kernel time of one aten operator on the profile's GPU, in ns."""

    def __init__(self, hw: dict):
        need = ("gpu_matmul_tflops", "gpu_vector_tflops", "gpu_mem_gbps", "matmul_efficiency",
                "mem_efficiency")
        missing = [k for k in need if not hw[k] > 0]
        if missing:
            raise ValueError(f"hardware profile {hw['name']} lacks the roofline constants "
                             f"{', '.join(missing)}")
        self.mm_flops = hw["gpu_matmul_tflops"] * 1e12 * hw["matmul_efficiency"]
        self.vec_flops = hw["gpu_vector_tflops"] * 1e12
        self.bw = hw["gpu_mem_gbps"] * 1e9 * hw["mem_efficiency"]
        self.overhead_ns = hw["kernel_overhead_us"] * 1e3

    @staticmethod
    def _bytes(obj) -> int:
        import torch
        from torch.utils._pytree import tree_flatten
        flat, _ = tree_flatten(obj)
        return sum(x.numel() * x.element_size() for x in flat if isinstance(x, torch.Tensor))

    def flops(self, name: str, args, out) -> float:
        if name in ("aten.mm.default", "aten.bmm.default"):
            a, b = args[0], args[1]
            return 2.0 * a.numel() * b.shape[-1]
        if name == "aten.addmm.default":
            a, b = args[1], args[2]
            return 2.0 * a.numel() * b.shape[-1]
        if name.startswith("aten._grouped_mm"):  # MoE experts: (tokens, k) x (experts, k, n)
            a, b = args[0], args[1]
            return 2.0 * a.numel() * b.shape[-1]
        if name.startswith("aten._scaled_dot_product_flash_attention"):
            q = args[0] if "backward" not in name else args[1]
            b, h, s, d = q.shape
            fwd = 4.0 * b * h * s * s * d / 2  # causal: half the score matrix
            return fwd * (2.5 if "backward" in name else 1.0)
        return 0.0

    def __call__(self, func, args, kwargs, out) -> int:
        name = str(func)
        if name in VIEW_OPS:
            return 0
        fl = self.flops(name, args, out)
        by = self._bytes((args, kwargs)) + self._bytes(out)
        rate = self.mm_flops if fl else self.vec_flops
        return int(max(fl / rate, by / self.bw) * 1e9 + self.overhead_ns)


def _flash_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                     **kwargs):
    """transformers attention function: causal FlashAttention via aten."""
    import torch
    from transformers.integrations.sdpa_attention import repeat_kv
    groups = query.shape[1] // key.shape[1]
    if groups > 1:
        key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    out = torch.ops.aten._scaled_dot_product_flash_attention(
        query, key, value, 0.0, True, False, scale=scaling)[0]
    return out.transpose(1, 2).contiguous(), None


def model_config(name: str) -> dict:
    """A built-in model's configuration as config.json keys (``model_type``
    picks the transformers class)."""
    spec = dict(MODELS[name])
    cls = spec.pop("cls")
    spec.pop("params")
    return dict(model_type="llama" if cls == "llama" else "gpt_bigcode", **spec)


def build_causal_lm(cfg: dict, dtype: str = "fp32", checkpointing: bool = False):
    """A transformers causal language model from its config.json keys, on
    the meta device, in training mode, with causal FlashAttention as an
    H100 runs it; ``dtype`` "fp32" or "bf16".  Raises TeraioError for a
    configuration transformers refuses."""
    import torch
    import transformers
    from transformers import AttentionInterface, AutoConfig, AutoModelForCausalLM
    from ._lib import TeraioError
    transformers.logging.set_verbosity_error()
    AttentionInterface.register("teraio_meta_sdpa", _flash_attention)
    d = {k: v for k, v in cfg.items() if k not in ("architectures", "torch_dtype", "dtype",
                                                  "transformers_version", "_name_or_path")}
    try:
        conf = AutoConfig.for_model(d.pop("model_type"), **d)
    except (ValueError, TypeError, KeyError) as e:
        raise TeraioError(-22, f"model config: {e}") from None
    conf.use_cache = False
    conf._attn_implementation = "teraio_meta_sdpa"
    with torch.device("meta"):
        net = AutoModelForCausalLM.from_config(conf)
    net = net.to(torch.bfloat16 if dtype == "bf16" else torch.float32)
    net.train()
    if checkpointing:
        net.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    return net


def build_model(name: str):
    """A built-in model (MODELS), fp32, on the meta device."""
    return build_causal_lm(model_config(name))


def micro_batch(model: str, batch: int, seq: int) -> int:
    """Sequences per GPU micro-batch (never more than the global batch)."""
    mb = MICRO_BATCH.get((model, batch, seq), max(1, DEFAULT_MICRO_TOKENS // seq))
    return max(1, min(mb, batch))


def trace_config(model: str, batch: int, seq: int, hw_path: str, out_path: str) -> dict:
    """Trace one iteration and write it; returns a summary dict."""
    import torch
    from .core import Trace
    from .torch import Profiler

    hw = read_hw(hw_path)
    net = build_model(model)
    n_params = sum(p.numel() for p in net.parameters())
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4, foreach=False, fused=False)
    mb = micro_batch(model, batch, seq)
    ids = torch.zeros(mb, seq, dtype=torch.long, device="meta")

    def step():  # TorchTitan's loop: gradients freed after the step (set_to_none)
        out = net(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()  # creates gradients and optimizer states
    shards = SHARDS.get(model, GPUS)
    prof = Profiler(net, opt, f"{model} batch={batch} seq={seq} micro={mb}x{seq} shards={shards}",
                    kernel_time=Roofline(hw))
    with prof.iteration():
        step()
    tensors, kernels = shard_and_prune(*prof.records(), shards=shards)
    tr = Trace.build(prof.name, tensors, kernels)
    tmp = out_path + ".part"
    tr.save(tmp)
    os.replace(tmp, out_path)
    return {"model": model, "batch": batch, "seq": seq, "micro_batch": mb, "shards": shards,
            "params": n_params, "kernels": len(kernels), "tensors": len(tensors),
            "trace": out_path}


def shard_and_prune(tensors: list, kernels: list, shards: int = GPUS):
    """Gradients named, global tensors and gradients sharded over `shards`
    GPUs (1: unchanged), view kernels dropped, untouched tensors dropped and
    ids renumbered.

    With ``zero_grad(set_to_none=True)`` the gradients are born in the
    backward pass, so the profiler sees them as intermediate tensors.  The
    optimizer step is the tail of the iteration from the first kernel that
    touches an optimizer state; a gradient is an intermediate tensor that
    exists before that kernel and is read by a kernel that also touches an
    optimizer state (AdamW's ``lerp_``/``addcmul_`` on the moments).  The
    optimizer kernels work on this GPU's shard only: their time is divided
    by `shards`."""
    keep = [(n, d, acc) for n, d, acc in kernels if n not in VIEW_OPS]
    is_state = [kind == "optimizer_state" for _, kind, _, _ in tensors]
    opt_start = next((k for k, (_, _, acc) in enumerate(keep)
                      if any(is_state[t] for t, _ in acc)), len(keep))
    born_before = {t for _, _, acc in keep[:opt_start] for t, _ in acc}
    grads = {t for _, _, acc in keep[opt_start:] if any(is_state[t] for t, _ in acc)
             for t, _ in acc if not tensors[t][2] and t in born_before}
    used = sorted({t for _, _, acc in keep for t, _ in acc})
    remap = {old: new for new, old in enumerate(used)}
    out_t = []
    for old in used:
        nbytes, kind, glob, name = tensors[old]
        if old in grads:
            kind, name = "gradient", name or f"grad.{old}"
        if glob or old in grads:
            nbytes = max(1, -(-nbytes // shards))
        out_t.append((nbytes, kind, glob, name))
    out_k = []
    for k, (n, d, acc) in enumerate(keep):
        if k >= opt_start:
            d = d // shards
        out_k.append((n, d, [(remap[t], m) for t, m in acc]))
    return out_t, out_k


# The paper's published fractions of ideal (arXiv 2506.06472, section 4 and
# DESIGN.md): TERAIO's average over the configurations and on Llama3-70B —
# the figures our faithful Algorithm 1 (strategy teraio-alg1) reproduces —
# and the ZeRO baselines'.  "all": the mean over every configuration.
REFERENCES = [
    ("all", "teraio-alg1", 0.807),
    ("llama3-70b", "teraio-alg1", 0.597),
    ("llama3-70b", "zero-infinity", 0.430),
    ("llama3-8b", "zero-offload", 0.659),
    ("granite-8b", "zero-offload", 0.655),
]


def trace_file(model: str, batch: int, seq: int) -> str:
    """The cache key of a configuration's trace inside a suite directory."""
    return (f"{model}-s{seq}-mb{micro_batch(model, batch, seq)}-x{SHARDS.get(model, GPUS)}"
            f"-t{TRACER_VERSION}.tio")


def write_suite(out_dir: str, hw_path: str, log=None) -> str:
    """Trace the paper's configurations into `out_dir` (reusing traces that
    exist) and write its hw.conf and suite.txt; returns suite.txt's path."""
    hw = read_hw(hw_path)
    os.makedirs(out_dir, exist_ok=True)
    hw_copy = os.path.join(out_dir, "hw.conf")
    with open(hw_path, "rb") as f:
        profile = f.read()
    if os.path.exists(hw_copy):
        with open(hw_copy, "rb") as f:
            if f.read() != profile:
                raise SystemExit(f"teraio paper: {out_dir} holds traces for another profile "
                                 f"({hw_copy} differs from {hw_path}): use another directory")
    else:
        _write_atomic(hw_copy, profile)
    lines = ["teraio-suite 1", f"hw {hw['name']}",
             "# config MODEL BATCH SEQ MICRO_BATCH SHARDS REFERENCE_M_PCT TRACE"]
    for m, b, s in PAPER_RUNS:
        name = trace_file(m, b, s)
        path = os.path.join(out_dir, name)
        if not os.path.exists(path):
            if log:
                log(f"tracing {m} batch {b} seq {s} -> {path}")
            trace_config(m, b, s, hw_path, path)
        lines.append(f"config {m} {b} {s} {micro_batch(m, b, s)} {SHARDS.get(m, GPUS)} "
                     f"{paper_m(m, b, s):.1f} {name}")
    lines.append("# reference MODEL STRATEGY FRACTION_OF_IDEAL (published)")
    lines += [f"reference {m} {st} {f}" for m, st, f in REFERENCES]
    index = os.path.join(out_dir, "suite.txt")
    _write_atomic(index, ("\n".join(lines) + "\n").encode())
    return index


def _write_atomic(path: str, data: bytes) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["trace"]:
        ap = argparse.ArgumentParser(prog="python -m teraio.paper trace",
                                     description="trace the paper's configurations into DIR")
        ap.add_argument("dir", metavar="DIR")
        ap.add_argument("--hw", default="hw/h100-nvl-paper.conf")
        a = ap.parse_args(argv[1:])
        print(write_suite(a.dir, a.hw, log=lambda msg: print(msg, file=sys.stderr, flush=True)))
        return 0
    ap = argparse.ArgumentParser(prog="python -m teraio.paper", description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=sorted(MODELS), required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--hw", default="hw/h100-nvl-paper.conf")
    ap.add_argument("-o", "--output", required=True)
    a = ap.parse_args(argv)
    if os.path.exists(a.output):
        print(json.dumps({"trace": a.output, "cached": True}))
        return 0
    os.makedirs(os.path.dirname(os.path.abspath(a.output)), exist_ok=True)
    print(json.dumps(trace_config(a.model, a.batch, a.seq, a.hw, a.output)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
