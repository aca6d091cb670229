"""examples/train.py — a distributed training job fed and checkpointed by teraio.

    torchrun --nproc-per-node 2 examples/train.py --steps 20 --ckpt-every 5
    torchrun --nproc-per-node 3 examples/train.py --steps 30 --resume build/train/ckpt

A Llama-style decoder (teraio.models.llama) trained with AdamW under FSDP2
(``fully_shard`` per layer, then the root) or DDP, on the gloo backend (CPU).
Its tokens come from ``teraio.data.StreamingDataset``: two JSONL sub-datasets
mixed by weight and tokenized on the fly with a built-in BPE encoding
(r50k_base by default); the data-parallel rank and size come from the
DeviceMesh that FSDP2 shards over (from the process group under DDP).

Every ``--ckpt-every`` steps ``torch.distributed.checkpoint`` (DCP) saves the
model, the optimizer, the step and the loader into ``CKPT/step-NNNNNNNN``:
one loader entry per rank (``loader.rankNNNNN``), since each rank's position
is its own.  DCP writes into ``step-NNNNNNNN.partial`` and rank 0 renames it
once every rank's bytes and the metadata are on disk, so a job killed in the
middle of a checkpoint leaves the previous one complete.  ``--resume`` (a
checkpoint, or a folder of them: the newest complete one) works on any number
of ranks: DCP reshards model and optimizer, every new rank loads the states
of all old ranks' loaders and takes over its share of their logical shards
(nothing repeated or skipped within the epoch), and the step count continues.

Checkpoints belong to their run.  A run has an identity: a random run id and
the hash of the settings that make it the run it is (model, tokenizer,
learning rate, seed, mixing, loader), saved in ``CKPT/run.json`` and in every
checkpoint's ``train.json``.  A fresh run refuses a checkpoint folder that
holds another run's checkpoints (``--overwrite`` removes them first); a
resumed run keeps its run id and checks its settings against the
checkpoint's.  ``--resume`` of a folder whose newest checkpoint is damaged (a
rank's ``.distcp`` missing or short, the metadata unreadable) says so in one
line and resumes the newest complete one; with ``--resume-strict`` it refuses.

Without ``--data`` the job writes its own corpus into ``OUT/corpus`` from the
running Python's standard library (docstrings in ``prose``, function and
class sources in ``code``), so it runs on a fresh clone.  On a terminal rank
0 shows a progress line (step, loss, tokens/s); piped, it prints only the
summary at the end.  Each rank writes one JSON line per step to
``OUT/metrics/rankN.jsonl`` (loss as an exact float; with ``--provenance``
the spans of every delivered sample), appending when it resumes.
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import sys
import sysconfig
import tempfile
import time
import uuid
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from teraio._lib import TeraioError
from teraio.data import StreamingDataset
from teraio.models.llama import Llama, LlamaConfig
from teraio.tok import Tokenizer

LOADER_KEY = "loader.rank{:05d}"
STEP_DIR = "step-{:08d}"
MODEL_ARGS = ("dim", "layers", "heads", "ffn", "seq_len", "tokenizer")
# what makes a run the run it is: a resume must keep these (the number of ranks, the
# steps and the batch may change)
CONFIG_ARGS = MODEL_ARGS + ("lr", "seed", "weights", "logical_shards", "shuffle_buffer")
RUN_FILE = "run.json"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="build/train", help="corpus, checkpoints and metrics (default %(default)s)")
    p.add_argument("--data", help="dataset root (one folder per sub-dataset); default: OUT/corpus, "
                   "written from the standard library when absent")
    p.add_argument("--weights", help="mixing weights NAME=W,...; default: equal")
    p.add_argument("--tokenizer", default="r50k_base", help="built-in encoding or tokenizer.json "
                   "(default %(default)s)")
    p.add_argument("--steps", type=int, default=20, help="train until this step (counted from the "
                   "start of training, also across --resume)")
    # small batches: the logits over r50k_base's 50257 ids are the largest tensors, and
    # with few of them half the peak stays above the largest kernel's working set
    p.add_argument("--batch-size", type=int, default=2, help="samples per rank and step")
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--ffn", type=int, default=128)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0, help="model initialisation and data order")
    p.add_argument("--parallel", choices=("fsdp", "ddp"), default="fsdp")
    p.add_argument("--logical-shards", type=int, default=64)
    p.add_argument("--shuffle-buffer", type=int, default=64)
    p.add_argument("--ckpt-dir", help="where checkpoints go (default OUT/ckpt)")
    p.add_argument("--ckpt-every", type=int, default=0, help="checkpoint every K steps (0: never)")
    p.add_argument("--resume", help="a checkpoint (step-N folder) or a folder of them (the newest "
                   "complete one; a damaged newer one is named and passed over); any number of ranks")
    p.add_argument("--resume-strict", action="store_true", help="with --resume of a folder: refuse "
                   "if its newest checkpoint is damaged, instead of resuming the newest complete one")
    p.add_argument("--overwrite", action="store_true", help="a fresh run whose checkpoint folder holds "
                   "another run's checkpoints removes them (without it, it refuses)")
    p.add_argument("--offload-capacity", type=capacity, metavar="C", help="offload tensors with "
                   "teraio: C is each rank's capacity, a share of its profiled peak (0 < C <= 1) or "
                   "bytes (an integer > 1)")
    p.add_argument("--offload-ssd", action="append", metavar="DIR", help="a directory for the "
                   "backing files, repeatable (striping); '{rank}' and '{local_rank}' in it are "
                   "this process's (default OUT/ssd, shared by all ranks: each process has its own "
                   "private files)")
    p.add_argument("--provenance", action="store_true", help="write the spans of every sample "
                   "delivered into the metrics")
    p.add_argument("--corpus-files", type=int, default=40, help="standard-library modules in the "
                   "generated corpus (default %(default)s)")
    p.add_argument("--kill-in-checkpoint", metavar="STEP:RANK", help="fault injection for tests: "
                   "rank RANK sends itself SIGKILL in checkpoint STEP, after writing its bytes and "
                   "before the checkpoint is complete")
    args = p.parse_args(argv)
    for name in ("steps", "batch_size", "seq_len", "dim", "layers", "heads", "ffn", "logical_shards"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.dim % args.heads or (args.dim // args.heads) % 2:
        p.error("--dim must be a multiple of --heads with an even head size")
    if args.ckpt_every < 0 or args.shuffle_buffer < 0:
        p.error("--ckpt-every and --shuffle-buffer must be >= 0")
    if args.overwrite and args.resume:
        p.error("--overwrite starts a fresh run: it does not go with --resume")
    if args.resume_strict and not args.resume:
        p.error("--resume-strict goes with --resume")
    args.weights = parse_weights(p, args.weights)
    args.kill_at = None
    if args.kill_in_checkpoint:
        m = re.fullmatch(r"(\d+):(\d+)", args.kill_in_checkpoint)
        if not m:
            p.error("--kill-in-checkpoint takes STEP:RANK")
        args.kill_at = (int(m[1]), int(m[2]))
    args.out = Path(args.out)
    args.data = Path(args.data) if args.data else args.out / "corpus"
    args.ckpt_dir = Path(args.ckpt_dir) if args.ckpt_dir else args.out / "ckpt"
    args.offload_ssd = args.offload_ssd or [str(args.out / "ssd")]
    return args


def capacity(text: str):
    """--offload-capacity: a share of the peak (float in (0, 1]) or bytes (int > 1)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if 0 < value <= 1:
        return value
    if value > 1 and value == int(value):
        return int(value)
    raise argparse.ArgumentTypeError(f"{text!r}: a share in (0, 1] or a whole number of bytes")


def parse_weights(p, text):
    if not text:
        return None
    out = {}
    for item in text.split(","):
        name, _, w = item.partition("=")
        try:
            out[name.strip()] = float(w)
        except ValueError:
            p.error(f"--weights: {item!r} is not NAME=WEIGHT")
    return out


# ------------------------------------------------------------------ corpus ---

def stdlib_documents(n_files: int) -> dict[str, list[str]]:
    """Documents from the first `n_files` top-level modules of this Python's
    standard library (sorted by name): every docstring in ``prose``, every
    top-level function and class source in ``code``."""
    root = Path(sysconfig.get_paths()["stdlib"])
    prose, code = [], []
    for path in sorted(root.glob("*.py"))[:n_files]:
        try:
            text = path.read_text(encoding="utf-8")
            tree = ast.parse(text)
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                doc = ast.get_docstring(node)
                if doc:
                    prose.append(doc)
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                src = ast.get_source_segment(text, node)
                if src:
                    code.append(src)
    return {"prose": prose, "code": code}


def write_corpus(root: Path, n_files: int) -> None:
    """OUT/corpus/{prose,code}/stdlib.jsonl, each written to a private temporary
    file and renamed, so ranks (or nodes) that write it at once agree."""
    for name, docs in stdlib_documents(n_files).items():
        d = root / name
        d.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".stdlib.", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for text in docs:
                f.write(json.dumps({"text": text}) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, d / "stdlib.jsonl")


def vocabulary(spec: str) -> tuple[int, int]:
    """Vocabulary size and end-of-text id of a built-in encoding or a tokenizer.json."""
    tok = Tokenizer.huggingface(spec) if spec.endswith(".json") else Tokenizer.encoding(spec)
    try:
        return tok.vocab_size, tok.special_id("<|endoftext|>")
    except Exception as e:
        raise SystemExit(f"train.py: tokenizer {spec} has no <|endoftext|> token to end documents "
                         f"with ({e})") from None
    finally:
        tok.close()


# ------------------------------------------------------------- processes ---

def init_distributed(tmp: Path):
    """The gloo process group from torchrun's environment, or a group of one
    when the script runs as a plain process."""
    if "RANK" in os.environ:
        dist.init_process_group("gloo")
    else:
        tmp.mkdir(parents=True, exist_ok=True)
        store = dist.FileStore(str(tmp / f"store.{os.getpid()}"), 1)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    return dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0"))


def build_model(args, vocab_size: int, world: int):
    """The model, wrapped for data parallelism, and the mesh its data ranks come from."""
    torch.manual_seed(args.seed)
    cfg = LlamaConfig(vocab_size=vocab_size, dim=args.dim, n_layers=args.layers,
                      n_heads=args.heads, ffn_dim=args.ffn, max_seq_len=args.seq_len)
    model = Llama(cfg)
    if args.parallel == "ddp":
        return torch.nn.parallel.DistributedDataParallel(model), None
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    # FSDP2 frees each layer's gathered parameters after forward (resizing their storage
    # to 0) and gathers them again for backward.  teraio's runtime does not see storage
    # resizes, so when it offloads, the layers keep them and teraio moves them to SSD
    # between forward and backward instead.
    for layer in model.layers:
        fully_shard(layer, mesh=mesh, reshard_after_forward=args.offload_capacity is None)
    fully_shard(model, mesh=mesh)
    return model, mesh


def open_dataset(args, mesh, rank: int, world: int, eos_id: int):
    common = dict(seq_len=args.seq_len, seed=args.seed, weights=args.weights,
                  logical_shards=args.logical_shards, shuffle_buffer=args.shuffle_buffer,
                  eos_id=eos_id, tokenizer=args.tokenizer, provenance=args.provenance)
    if mesh is not None:
        return StreamingDataset(args.data, device_mesh=mesh, mesh_dim="dp", **common)
    return StreamingDataset(args.data, rank=rank, world_size=world, **common)


def next_batch(it, batch_size: int):
    samples = [next(it) for _ in range(batch_size)]
    batch = {k: torch.stack([s[k] for s in samples]) for k in ("input_ids", "labels")}
    if "provenance" in samples[0]:
        batch["spans"] = [row for s in samples for row in s["provenance"].tolist()]
    return batch


# ------------------------------------------------------------ checkpoints ---

class _KillingWriter(dcp.FileSystemWriter):
    """Fault injection: SIGKILL this process once its part of the checkpoint is
    written, while the coordinator still waits for it to write the metadata."""

    def write_data(self, plan, planner):
        fut = super().write_data(plan, planner)
        fut.wait()
        os.kill(os.getpid(), signal.SIGKILL)
        return fut


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def run_config(args) -> dict:
    return {k: getattr(args, k) for k in CONFIG_ARGS}


def config_hash(config: dict) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]


def checkpoints_in(folder: Path) -> list[Path]:
    """The step-N folders of `folder` (complete or not, not .partial), oldest first."""
    return sorted(p for p in folder.glob("step-*") if re.fullmatch(r"step-\d+", p.name))


def checkpoint_run(path: Path) -> str | None:
    """The run id a checkpoint was saved by (None: unreadable, or saved before run ids)."""
    try:
        return json.loads((path / "train.json").read_text()).get("run_id")
    except (OSError, ValueError, AttributeError):
        return None


def claim_ckpt_dir(args, run_id: str, rank: int) -> None:
    """Make the checkpoint folder this run's, or refuse (every rank raises the same
    SystemExit): a fresh run may not write beside another run's checkpoints."""
    why = None
    if rank == 0:
        folder = args.ckpt_dir
        try:
            owner = json.loads((folder / RUN_FILE).read_text()).get("run_id")
        except FileNotFoundError:
            owner = None
        except (OSError, ValueError, AttributeError) as e:
            owner = f"unreadable {RUN_FILE} ({e})"
        # (a resumed run whose checkpoints predate run ids adopts them)
        others = [p for p in checkpoints_in(folder) if checkpoint_run(p) != run_id
                  and not (args.resume and checkpoint_run(p) is None)]
        if args.overwrite:
            for stale in [*folder.glob("step-*"), folder / RUN_FILE]:
                if stale.is_dir():
                    shutil.rmtree(stale)
                elif stale.exists():
                    stale.unlink()
        elif (owner is not None and owner != run_id) or others:
            named = others[-1].name if others else RUN_FILE
            what = f"{folder} holds another run's checkpoints (run {owner or checkpoint_run(others[-1])}, {named})"
            if args.resume:
                why = f"train.py: {what}, not the resumed run's ({run_id}): give another --out or --ckpt-dir"
            else:
                why = (f"train.py: {what}: pass --resume {folder} to continue that run, --overwrite to replace "
                       f"them, or another --out or --ckpt-dir")
        if why is None:
            folder.mkdir(parents=True, exist_ok=True)
            tmp = folder / (RUN_FILE + ".tmp")
            tmp.write_text(json.dumps({"run_id": run_id, "config_hash": config_hash(run_config(args)),
                                       "config": run_config(args)}))
            tmp.rename(folder / RUN_FILE)
    box = [why]
    dist.broadcast_object_list(box, src=0)
    if box[0]:
        raise SystemExit(box[0])


def save_checkpoint(args, step: int, model, optimizer, ds, rank: int, run_id: str) -> Path:
    final = args.ckpt_dir / STEP_DIR.format(step)
    partial = final.with_name(final.name + ".partial")
    if rank == 0:
        for stale in (partial, final):
            shutil.rmtree(stale, ignore_errors=True)
        partial.mkdir(parents=True)
        config = run_config(args)
        (partial / "train.json").write_text(json.dumps({**{k: getattr(args, k) for k in MODEL_ARGS},
                                                        "run_id": run_id, "config": config,
                                                        "config_hash": config_hash(config)}))
    dist.barrier()
    msd, osd = get_state_dict(model, optimizer)
    state = {"model": msd, "optim": osd, "step": step, LOADER_KEY.format(ds.rank): ds.state_dict()}
    writer_cls = _KillingWriter if args.kill_at == (step, rank) else dcp.FileSystemWriter
    dcp.save(state, storage_writer=writer_cls(str(partial)))
    dist.barrier()                     # every rank's bytes and the metadata are on disk
    if rank == 0:
        partial.rename(final)
        fsync_dir(final.parent)
    dist.barrier()
    return final


def checkpoint_damage(path: Path) -> str | None:
    """Why checkpoint `path` cannot be resumed (None: complete): its metadata, its
    train.json and every byte range the metadata names in the ranks' files."""
    if not (path / ".metadata").is_file():
        return "no .metadata: it was never completed"
    try:
        json.loads((path / "train.json").read_text())
    except (OSError, ValueError) as e:
        return f"train.json unreadable ({e})"
    try:
        md = dcp.FileSystemReader(str(path)).read_metadata()
    except Exception as e:  # noqa: BLE001 (whatever unpickling a damaged file raises)
        return f".metadata unreadable ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
    need: dict[str, int] = {}
    for info in (md.storage_data or {}).values():
        end = info.offset + info.length
        need[info.relative_path] = max(need.get(info.relative_path, 0), end)
    for rel, end in sorted(need.items()):
        f = path / rel
        if not f.is_file():
            return f"{rel} is missing"
        if f.stat().st_size < end:
            return f"{rel} holds {f.stat().st_size} bytes, the metadata needs {end}"
    return None


def find_checkpoint(path: Path, strict: bool = False) -> Path:
    """`path` itself when it is a checkpoint, else its newest complete step-N folder: a
    damaged newer one is named in one line and passed over (refused when `strict`)."""
    if (path / ".metadata").exists() or (path / "train.json").exists() or re.fullmatch(r"step-\d+", path.name):
        why = checkpoint_damage(path)
        if why:
            raise SystemExit(f"train.py: {path}: damaged checkpoint: {why}")
        return path
    if not path.is_dir():
        raise SystemExit(f"train.py: --resume {path}: no such checkpoint or folder")
    damaged = []
    for p in reversed(checkpoints_in(path)):
        why = checkpoint_damage(p)
        if why is None:
            if damaged:
                print(f"train.py: {damaged[0][0]} is damaged ({damaged[0][1]}): resuming {p.name}, the newest "
                      f"complete checkpoint", file=sys.stderr, flush=True)
            return p
        if strict:
            raise SystemExit(f"train.py: {p}: damaged checkpoint: {why} (--resume-strict; without it the "
                             f"newest complete one is resumed)")
        damaged.append((p, why))
    raise SystemExit(f"train.py: {path}: no complete checkpoint (step-N folder with .metadata)"
                     + "".join(f"; {p.name}: {why}" for p, why in damaged))


def saved_loader_ranks(path: Path) -> list[int]:
    """The ranks whose loader states checkpoint `path` holds (the world size that saved it)."""
    keys = dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata
    return sorted(int(m[1]) for k in keys if (m := re.fullmatch(r"loader\.rank(\d+)\.state", k)))


def load_checkpoint(args, path: Path, model, optimizer, ds) -> tuple[int, str]:
    """Restore model, optimizer and loader from `path`; return its step and run id (a
    new one for a checkpoint saved before run ids)."""
    saved = json.loads((path / "train.json").read_text())
    config = saved.get("config", {k: saved.get(k) for k in MODEL_ARGS})
    wrong = [f"--{k.replace('_', '-')} {config[k]} (not {getattr(args, k)})" for k in config
             if k in CONFIG_ARGS and config[k] != getattr(args, k)]
    if wrong:
        raise SystemExit(f"train.py: {path} was trained with " + ", ".join(wrong))
    old_ranks = saved_loader_ranks(path)
    msd, osd = get_state_dict(model, optimizer)
    state = {"model": msd, "optim": osd, "step": 0}
    for r in old_ranks:
        state[LOADER_KEY.format(r)] = {"rank": 0, "world_size": 0, "state": b""}
    try:
        dcp.load(state, checkpoint_id=str(path))
    except Exception as e:  # noqa: BLE001 (DCP gathers every rank's error into one)
        first = next((line for line in str(e).splitlines() if line.strip()), type(e).__name__)
        raise SystemExit(f"train.py: {path}: the checkpoint cannot be loaded: {first[:300]}") from None
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    ds.load_state_dict([state[LOADER_KEY.format(r)] for r in old_ranks])
    return int(state["step"]), saved.get("run_id") or uuid.uuid4().hex


# ---------------------------------------------------------------- output ---

class Progress:
    """Rank 0's progress line on a terminal; nothing when piped."""

    def __init__(self, rank: int):
        self.rank0 = rank == 0
        self.on = self.rank0 and sys.stdout.isatty()

    def show(self, text: str) -> None:
        if self.on:
            sys.stdout.write("\r\033[K" + text)
            sys.stdout.flush()

    def say(self, text: str) -> None:
        """A line that stays, from rank 0, on a terminal or not."""
        if self.on:
            sys.stdout.write("\r\033[K")
        if self.rank0:
            print(text, flush=True)


def ranks(n: int) -> str:
    return f"{n} rank" + ("" if n == 1 else "s")


def human(n: float) -> str:
    for unit in ("", "k", "M", "G"):
        if abs(n) < 1000:
            return f"{n:.1f}{unit}"
        n /= 1000
    return f"{n:.1f}T"


# ------------------------------------------------------------------ main ---

def start_offload(args, model, optimizer):
    """teraio's one-call offloading for this rank (None without --offload-capacity): it
    profiles this rank's first steps, plans for this rank's capacity and moves tensors
    to this process's own backing files under the --offload-ssd directories."""
    if args.offload_capacity is None:
        return None
    from teraio.torch import offload
    if args.offload_ssd == [str(args.out / "ssd")]:
        (args.out / "ssd").mkdir(parents=True, exist_ok=True)     # the default; others must exist
    # DDP rebuilds its gradient buckets in its second step, so that step's operators never
    # recur: profile three steps and plan on the third.
    profile = 3 if args.parallel == "ddp" else 2
    return offload(model, optimizer, capacity=args.offload_capacity, ssd=args.offload_ssd,
                   profile_iterations=profile)


def offload_summary(off, rank: int) -> dict | None:
    """This rank's offloading: its capacity and planned peak (of the plan in use), the
    resident peak the runtime measured, bytes moved, stalls, and the whole report."""
    if off is None:
        return None
    rep = off.report()
    plan = rep["plans"][-1] if rep["plans"] else {}
    return {"rank": rank, "capacity_bytes": plan.get("capacity_bytes"),
            "planned_peak_bytes": plan.get("planned_peak_bytes"), "fits": plan.get("fits"),
            "peak_resident_bytes": rep["peak_resident_bytes"], "bytes_offloaded": rep["bytes_offloaded"],
            "bytes_prefetched": rep["bytes_prefetched"], "stalls": rep["stalls"], "report": rep}


def mib(n) -> str:
    return "-" if n is None else f"{n / 2**20:.1f} MiB"


def train_step(model, optimizer, batch, off):
    with off.step() if off is not None else contextlib.nullcontext():
        optimizer.zero_grad(set_to_none=True)
        loss = model(batch["input_ids"], batch["labels"])
        loss.backward()
        optimizer.step()
    return loss.detach()


def train(args) -> int:
    rank, world, local_rank = init_distributed(args.out / "tmp")
    if local_rank == 0 and not args.data.exists():
        write_corpus(args.data, args.corpus_files)
    dist.barrier()
    vocab, eos_id = vocabulary(args.tokenizer)
    model, mesh = build_model(args, vocab, world)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    ds = open_dataset(args, mesh, rank, world, eos_id)
    start = 0
    run_id = uuid.uuid4().hex
    if args.resume:
        path = find_checkpoint(Path(args.resume), strict=args.resume_strict)
        start, run_id = load_checkpoint(args, path, model, optimizer, ds)
    # every rank draws its own id: rank 0's is the run's
    box = [run_id]
    dist.broadcast_object_list(box, src=0)
    run_id = box[0]
    if args.ckpt_every:
        claim_ckpt_dir(args, run_id, rank)
    off = start_offload(args, model, optimizer)
    (args.out / "metrics").mkdir(parents=True, exist_ok=True)
    # a resumed run appends to the metrics of the run it continues (lines carry their step)
    metrics = open(args.out / "metrics" / f"rank{rank}.jsonl", "a" if args.resume else "w")
    progress = Progress(rank)
    if args.resume:
        progress.say(f"train: resumed {path} (step {start}, saved by {len(saved_loader_ranks(path))} "
                     f"ranks) on {ranks(world)}")
    it = iter(ds)
    losses, t_start, last = [], time.perf_counter(), None
    tokens_per_step = world * args.batch_size * args.seq_len
    for step in range(start + 1, args.steps + 1):
        t0 = time.perf_counter()
        batch = next_batch(it, args.batch_size)
        loss = train_step(model, optimizer, batch, off)
        mean = loss.clone()
        dist.all_reduce(mean)
        mean = mean.item() / world
        dt = time.perf_counter() - t0
        losses.append(mean)
        row = {"step": step, "loss": loss.item(), "loss_mean": mean, "tokens": tokens_per_step,
               "time_s": dt}
        moved = ""
        if off is not None:
            row["bytes_offloaded"] = off.report()["bytes_offloaded"]
            moved = f"  offloaded {mib(row['bytes_offloaded'])} (rank 0)"
        if "spans" in batch:
            row["spans"] = batch["spans"]
        metrics.write(json.dumps(row) + "\n")
        metrics.flush()
        progress.show(f"step {step}/{args.steps}  loss {mean:.4f}  "
                      f"{human(tokens_per_step / dt)} tokens/s{moved}")
        if args.ckpt_every and step % args.ckpt_every == 0:
            last = save_checkpoint(args, step, model, optimizer, ds, rank, run_id)
    metrics.close()
    elapsed = time.perf_counter() - t_start
    if losses:
        progress.say(f"train: steps {start + 1}-{args.steps} on {ranks(world)} ({args.parallel}, gloo), "
                     f"loss {losses[0]:.4f} -> {losses[-1]:.4f}, "
                     f"{human(tokens_per_step * len(losses) / elapsed)} tokens/s"
                     + (f", last checkpoint {last}" if last else ""))
    else:
        progress.say(f"train: nothing to do, the checkpoint is at step {start} >= --steps {args.steps}")
    summary = offload_summary(off, rank)
    if off is not None:
        if off.trace is not None:    # for `teraio analyze` and the tests
            off.trace.save(str(args.out / "metrics" / f"trace-rank{rank}.tio"))
        off.close()
        (args.out / "metrics" / f"offload-rank{rank}.json").write_text(json.dumps(summary))
    summaries = [None] * world if rank == 0 else None
    dist.gather_object(summary, summaries, dst=0)
    for s in summaries or []:
        if s is not None:
            fit = {True: "fits", False: "does not fit", None: "none"}[s["fits"]]
            progress.say(f"train: rank {s['rank']}: peak resident {mib(s['peak_resident_bytes'])}, "
                         f"capacity {mib(s['capacity_bytes'])} (plan {mib(s['planned_peak_bytes'])}, "
                         f"{fit}), offloaded {mib(s['bytes_offloaded'])}, prefetched "
                         f"{mib(s['bytes_prefetched'])}, stalls {s['stalls']}")
    ds.close()
    dist.destroy_process_group()
    # Keep the model (DDP's Reducer holds the last reference to the process group) alive
    # until exit_now: freeing it here destroys ProcessGroupGloo in this thread, holding the
    # GIL, while a gloo thread that holds the group's lock waits for the GIL to free a
    # finished gather's tensors: a deadlock (seen here, 1 in about 12 DDP runs).
    _KEEP_ALIVE.extend([model, optimizer, off])
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    watchdog = os.environ.get("TERAIO_TRAIN_WATCHDOG_S")
    if watchdog:                   # tests: a hung rank prints its Python stacks and exits
        import faulthandler
        faulthandler.dump_traceback_later(float(watchdog), exit=True)
    try:
        return train(args)
    except TeraioError as e:       # bad data, state or settings: one line, not a traceback
        raise SystemExit(f"train.py: {e}") from None
    except ValueError as e:        # offloading refused its settings (a capacity too small)
        if not str(e).startswith("teraio.torch.offload:"):
            raise
        raise SystemExit(f"train.py: {e}") from None


_KEEP_ALIVE: list = []   # objects whose destruction must wait for exit_now (train's end)


def exit_now(rc: int) -> None:
    """Leave without Python's finalization.  Gloo's worker threads destroy finished
    collectives, and with them their tensors' Python objects, which needs the GIL; a
    thread that asks for it while the interpreter shuts down aborts the process
    ("terminate called without an active exception", ProcessGroupGloo::runLoop in
    ~AsyncGatherWork; seen here in about 1 of 10 runs, pytorch/pytorch#179291).  By now
    the process group is destroyed and every file is closed: there is nothing left for
    finalization to do."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)


if __name__ == "__main__":
    exit_now(main())
