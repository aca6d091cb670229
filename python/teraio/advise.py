"""`teraio advise` from Python, and the tracer the command runs.

``teraio.advise.advise(...)`` answers before a run: does the model train on
this hardware, how fast under teraio, ZeRO-Infinity and ZeRO-Offload against
unlimited memory, and what a million tokens cost (docs/advise.md).  It runs
the ``teraio advise`` command (the C library does the sharding, planning,
simulation and search) and returns its JSON document as a dict.

The command gets its trace from here: ``python -m teraio.advise trace``
runs the model's real Hugging Face code on PyTorch's meta device under
``teraio.torch.Profiler`` (shapes and lifetimes are real, nothing is
computed or allocated), times each kernel by the profile's roofline
(``teraio.paper.Roofline``), and caches the trace by everything that
changes it.  ``python -m teraio.advise models`` lists the built-in models.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys

from . import paper
from ._lib import TeraioError

# Built-in models beyond the paper's (teraio.paper.MODELS): values of each
# model's config.json on Hugging Face (openai-community/gpt2 and gpt2-xl,
# meta-llama/Llama-2-7b-hf, mistralai/Mistral-7B-v0.1, Qwen/Qwen2.5-0.5B
# and Qwen2.5-7B, meta-llama/Llama-3.1-405B).  "model_type" picks the
# transformers class, as in a config.json.
COMMON_MODELS = {
    "gpt2": dict(model_type="gpt2", n_embd=768, n_layer=12, n_head=12, vocab_size=50257,
                 n_positions=1024),
    "gpt2-xl": dict(model_type="gpt2", n_embd=1600, n_layer=48, n_head=25, vocab_size=50257,
                    n_positions=1024),
    "llama2-7b": dict(model_type="llama", hidden_size=4096, intermediate_size=11008,
                      num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
                      vocab_size=32000, max_position_embeddings=4096, rope_theta=10000.0,
                      tie_word_embeddings=False),
    "mistral-7b": dict(model_type="mistral", hidden_size=4096, intermediate_size=14336,
                       num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                       vocab_size=32000, max_position_embeddings=32768, rope_theta=10000.0,
                       sliding_window=4096, tie_word_embeddings=False),
    "qwen2.5-0.5b": dict(model_type="qwen2", hidden_size=896, intermediate_size=4864,
                         num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                         vocab_size=151936, max_position_embeddings=32768, rope_theta=1000000.0,
                         tie_word_embeddings=True),
    "qwen2.5-7b": dict(model_type="qwen2", hidden_size=3584, intermediate_size=18944,
                       num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                       vocab_size=152064, max_position_embeddings=131072, rope_theta=1000000.0,
                       tie_word_embeddings=False),
    "llama3.1-405b": dict(model_type="llama", hidden_size=16384, intermediate_size=53248,
                          num_hidden_layers=126, num_attention_heads=128, num_key_value_heads=8,
                          vocab_size=128256, max_position_embeddings=131072, rope_theta=500000.0,
                          tie_word_embeddings=False),
}

# Bumped whenever a change here changes the traces (part of the cache key).
TRACER_VERSION = 2

DTYPES = ("fp32", "bf16")
OPTIMIZERS = ("adamw", "adam", "sgd")


def models() -> dict:
    """Every built-in model's configuration (config.json keys), by name."""
    out = {name: paper.model_config(name) for name in paper.MODELS}
    out.update(COMMON_MODELS)
    return out


def _config(model: str | None, config: str | None) -> tuple[str, dict]:
    if config is not None:
        try:
            with open(config, encoding="utf-8") as f:
                d = json.load(f)
        except OSError as e:
            raise TeraioError(-(e.errno or 5), f"{config}: cannot read: {e.strerror}") from None
        except ValueError as e:
            raise TeraioError(-5001, f"{config}: not a JSON config: {e}") from None
        if not isinstance(d, dict) or not isinstance(d.get("model_type"), str):
            raise TeraioError(-5001, f"{config}: no \"model_type\" (a transformers config.json "
                                     f"names its model type)")
        return os.path.basename(os.path.dirname(os.path.abspath(config))) or "config", d
    table = models()
    if model not in table:
        raise TeraioError(-22, f"unknown model '{model}' (built in: {', '.join(sorted(table))}; "
                               f"or give a config.json)")
    return model, table[model]


build_model = paper.build_causal_lm  # the model on the meta device, as the paper tracer builds it


def _optimizer(name: str, params):
    import torch
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-4, foreach=False, fused=False)
    if name == "adam":
        return torch.optim.Adam(params, lr=1e-4, foreach=False, fused=False)
    return torch.optim.SGD(params, lr=1e-3, momentum=0.9, foreach=False)


class _Roofline16(paper.Roofline):
    """The roofline with 16-bit matrix products on the tensor cores."""

    def __init__(self, hw: dict):
        super().__init__(hw)
        rate = hw.get("gpu_matmul_16bit_tflops", 0)
        if not rate > 0:
            raise TeraioError(-22, f"hardware profile {hw['name']} has no gpu_matmul_16bit_tflops "
                                   f"(the tensor-core rate a bf16 model's matrix products run at)")
        self.mm_flops = rate * 1e12 * hw["matmul_efficiency"]


def cache_key(name: str, cfg: dict, batch: int, seq: int, dtype: str, optimizer: str,
              checkpointing: bool, hw: dict) -> str:
    """The trace's file name: the model's name and a hash of all that shapes it."""
    import torch
    import transformers
    roof = {k: hw[k] for k in ("gpu_matmul_tflops", "gpu_vector_tflops", "gpu_mem_gbps",
                               "matmul_efficiency", "mem_efficiency", "kernel_overhead_us",
                               "gpu_matmul_16bit_tflops")}
    blob = json.dumps([cfg, batch, seq, dtype, optimizer, checkpointing, roof, TRACER_VERSION,
                       paper.TRACER_VERSION, torch.__version__, transformers.__version__],
                      sort_keys=True)
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in name)[:40]
    return f"{safe}-{hashlib.sha256(blob.encode()).hexdigest()[:16]}.tio"


def default_cache() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "teraio", "advise")


def trace(model: str | None = None, config: str | None = None, *, hw: str, batch: int = 1,
          seq: int = 2048, dtype: str = "fp32", optimizer: str = "adamw",
          checkpointing: bool = False, cache: str | None = None) -> tuple[str, int]:
    """Trace one GPU's iteration (cached); returns (path, tokens per iteration)."""
    import torch

    if dtype not in DTYPES or optimizer not in OPTIMIZERS:
        raise TeraioError(-22, f"dtype must be one of {DTYPES} and optimizer one of {OPTIMIZERS}")
    if batch < 1 or seq < 1:
        raise TeraioError(-22, f"batch and seq must be >= 1 (got {batch}, {seq})")
    name, cfg = _config(model, config)
    hwd = paper.read_hw(hw)
    cache = cache or default_cache()
    path = os.path.join(cache, cache_key(name, cfg, batch, seq, dtype, optimizer, checkpointing,
                                         hwd))
    tokens = batch * seq
    if os.path.exists(path):
        from .core import Trace
        try:
            Trace.load(path)
            return path, tokens
        except TeraioError:  # a damaged cache entry: made again
            os.unlink(path)
    try:
        roof = _Roofline16(hwd) if dtype == "bf16" else paper.Roofline(hwd)
    except (ValueError, TeraioError) as e:
        raise TeraioError(-22, f"{hw}: {e}") from None
    net = build_model(cfg, dtype, checkpointing)
    limit = getattr(net.config, "max_position_embeddings", None) or \
        getattr(net.config, "n_positions", None)
    if isinstance(limit, int) and seq > limit:
        raise TeraioError(-22, f"--seq {seq} is longer than {name}'s {limit} positions "
                               f"(max_position_embeddings)")
    opt = _optimizer(optimizer, net.parameters())
    ids = torch.zeros(batch, seq, dtype=torch.long, device="meta")
    label = "".join(c if c.isalnum() or c in "._-" else "_" for c in name)[:64]
    text = (f"advise {label} batch={batch} seq={seq} dtype={dtype} optimizer={optimizer} "
            f"checkpointing={int(checkpointing)} tokens={tokens}")
    def step():  # gradients live from the backward pass to the step, as in TorchTitan
        net(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    trace_module(net, opt, step, text, roof, path)
    return path, tokens


def trace_module(net, opt, step, text: str, kernel_time, path: str) -> None:
    """Trace one training iteration of a meta-device model and save it to
    `path` (atomically).  `step()` runs one iteration (forward, backward,
    optimizer step, zero_grad) of `net` and `opt`; it runs once untraced,
    to create the gradients and optimizer states, then once traced.
    `kernel_time` times each kernel (a teraio.paper.Roofline); `text` is the
    trace's model line (``tokens=N`` in it tells teraio advise the tokens
    per iteration)."""
    from .core import Trace
    from .torch import Profiler

    step()
    prof = Profiler(net, opt, text, kernel_time=kernel_time)
    with prof.iteration():
        step()
    tensors, kernels = paper.shard_and_prune(*prof.records(), shards=1)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.part.{os.getpid()}"
    try:
        Trace.build(text, tensors, kernels).save(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _list(v, unit: str = "") -> str:
    """A list argument in the command's syntax; `unit` is appended to
    integers (byte counts given as ints are bytes)."""
    items = [v] if isinstance(v, (str, int, float)) else list(v)
    return ",".join(f"{x}{unit}" if isinstance(x, int) and not isinstance(x, bool) else str(x)
                    for x in items)


def advise(model: str | None = None, *, config: str | None = None, trace_path: str | None = None,
           hw: str = "h100-nvl-paper", batch: int = 1, seq: int = 2048, dtype: str = "fp32",
           optimizer: str = "adamw", checkpointing: bool = False, gpus=None, gpu_mem=None,
           ssds=None, host_cap=None, ssd_gbps=None, pcie_gbps=None, price_gpu_hour=None,
           price_ssd=None, price_host_gb=None, amortize_years=None, target: float = 0.9,
           tokens: int | None = None, cache: str | None = None, threads: int | None = None,
           svg: str | None = None) -> dict:
    """Run ``teraio advise --json`` and return its document (docs/advise.md).

    ``hw`` is a profile file or the name of one shipped in hw/.

    Lists (gpus, gpu_mem, ssds, host_cap) take a sequence or the command's
    syntax ("1-8", "80GB,141GB"); sizes are bytes or strings with units.
    Raises TeraioError with the command's one-line message on bad input."""
    from .__main__ import _binary
    for what, v in (("hw", hw), ("dtype", dtype), ("optimizer", optimizer)):
        if not isinstance(v, str):
            raise TeraioError(-22, f"teraio.advise: {what} must be a string, got {v!r}")
    if not isinstance(checkpointing, bool):
        raise TeraioError(-22, f"teraio.advise: checkpointing must be True or False, "
                               f"got {checkpointing!r}")
    argv = [_binary(), "advise", "--json", "--hw", hw, "--batch", str(batch), "--seq", str(seq),
            "--dtype", dtype, "--optimizer", optimizer, "--target", str(target)]
    for flag, v in (("--model", model), ("--config", config), ("--trace", trace_path),
                    ("--gpus", gpus), ("--ssds", ssds), ("--ssd-gbps", ssd_gbps), ("--pcie-gbps", pcie_gbps),
                    ("--price-gpu-hour", price_gpu_hour), ("--price-ssd", price_ssd),
                    ("--price-host-gb", price_host_gb), ("--amortize-years", amortize_years),
                    ("--tokens", tokens), ("--cache", cache), ("--threads", threads),
                    ("--svg", svg)):
        if v is not None:
            argv += [flag, _list(v)]
    for flag, v in (("--gpu-mem", gpu_mem), ("--host-cap", host_cap)):
        if v is not None:
            argv += [flag, _list(v, "B")]
    if checkpointing:
        argv.append("--checkpointing")
    env = dict(os.environ, TERAIO_PYTHON=sys.executable)
    r = subprocess.run(argv, capture_output=True, text=True, env=env)
    if r.returncode:
        lines = r.stderr.strip().splitlines()
        msg = lines[-1] if lines else f"teraio advise failed (exit {r.returncode})"
        raise TeraioError(-22 if r.returncode == 2 else -5,
                          msg.replace(" (try 'teraio advise --help')", ""))
    return json.loads(r.stdout)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["models"]:
        for name, cfg in sorted(models().items()):
            print(f"{name:16s} {cfg['model_type']}")
        return 0
    if argv[:1] != ["trace"]:
        print("usage: python -m teraio.advise trace (--model NAME | --config FILE) --hw PROFILE "
              "[...] | python -m teraio.advise models", file=sys.stderr)
        return 2
    ap = argparse.ArgumentParser(prog="python -m teraio.advise trace",
                                 description="trace one GPU's iteration for teraio advise; "
                                             "prints 'TOKENS PATH'")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--model")
    src.add_argument("--config")
    ap.add_argument("--hw", required=True)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--dtype", choices=DTYPES, default="fp32")
    ap.add_argument("--optimizer", choices=OPTIMIZERS, default="adamw")
    ap.add_argument("--checkpointing", action="store_true")
    ap.add_argument("--cache")
    a = ap.parse_args(argv[1:])
    what = a.model or a.config
    try:
        path, tokens = trace(a.model, a.config, hw=a.hw, batch=a.batch, seq=a.seq, dtype=a.dtype,
                             optimizer=a.optimizer, checkpointing=a.checkpointing, cache=a.cache)
    except TeraioError as e:
        print(f"teraio advise: {e}", file=sys.stderr)
        return 1
    except ImportError as e:
        print(f"teraio advise: tracing needs torch and transformers in {sys.executable} "
              f"(TERAIO_PYTHON picks another): {e}", file=sys.stderr)
        return 1
    except Exception as e:  # noqa: BLE001 - any failure of the model's code is one line
        lines = [x.strip() for x in str(e).splitlines() if x.strip()]
        why = "; ".join(lines[:2])[:300]
        if "Expected inputs of BF16" in why:
            why += " (a mixture-of-experts model traces in bf16: --dtype bf16)"
        print(f"teraio advise: tracing {what} failed: {type(e).__name__}: {why}",
              file=sys.stderr)
        return 1
    print(f"{tokens} {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
