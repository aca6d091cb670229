"""examples/train_trainer.py — a Hugging Face model trained from teraio's loader by the ``Trainer``.

    .venv/bin/python examples/train_trainer.py --steps 20                 # the Trainer alone
    .venv/bin/python examples/train_trainer.py --steps 20 --offload 0.6   # its tensors offloaded by teraio
    TERAIO_CAPACITY=0.6 TERAIO_SSD=/mnt/nvme0/x .venv/bin/python examples/train_trainer.py --steps 20

The model, the data and the tokenizer are examples/train_hf.py's (GPT-2 from
a small config; ``teraio.data.StreamingDataset`` over JSONL, r50k_base,
``labels="hf"``); here transformers' ``Trainer`` runs the loop, with
gradient accumulation (``--accumulate``), an evaluation every
``--eval-every`` steps on held-out batches and a checkpoint every
``--save-every`` steps (``--resume`` continues from the newest).  teraio comes in as one
callback, ``teraio.torch.trainer.OffloadCallback``: with ``--offload C``,
or with ``TERAIO_CAPACITY`` set (then ``TERAIO_SSD`` names the SSD
directories; without it OUT/ssd).  Prints the Trainer's log lines as JSON
(losses as exact floats) and, offloaded, what moved.  A step whose batches
pack documents differently can run other operators (transformers builds
the attention mask from ``position_ids``): it leaves its plan and goes on
under the pager, within the capacity, and the report counts it as
diverged.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

from teraio.data import collate

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_hf import corpus, gpt2, stream, summary  # noqa: E402  (the same model, corpus, loader, summary)


def hf_batch(samples):
    """teraio.data.collate, keeping what a Hugging Face causal LM takes."""
    b = collate(samples)
    return {k: b[k] for k in ("input_ids", "position_ids", "labels")}


class Held(torch.utils.data.Dataset):
    """The first `n` samples of a StreamingDataset, read once: an eval set."""

    def __init__(self, ds, n):
        it = iter(ds)
        self.samples = [next(it) for _ in range(n)]

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        return self.samples[i]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="build/train-trainer", help="corpus, checkpoints and SSD files "
                                                                   "(default %(default)s)")
    ap.add_argument("--data", help="dataset root (default: OUT/corpus, written when absent)")
    ap.add_argument("--steps", type=int, default=20, help="optimizer steps")
    ap.add_argument("--batch-size", type=int, default=2)
    ap.add_argument("--accumulate", type=int, default=2, help="micro-batches per optimizer step")
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--eval-every", type=int, default=5)
    ap.add_argument("--save-every", type=int, default=10)
    ap.add_argument("--optim", default="adamw_torch",
                    help="the Trainer's optimizer (default %(default)s: one kernel per parameter; the "
                         "Trainer's own default, adamw_torch_fused, updates every parameter in one kernel, "
                         "which then holds all of them and their states at once: the working-set floor)")
    ap.add_argument("--resume", action="store_true", help="continue from OUT/checkpoints' newest checkpoint")
    ap.add_argument("--offload", type=float, metavar="C", help="offload with teraio at capacity C (0 < C <= 1)")
    a = ap.parse_args(argv)
    from transformers import Trainer, TrainingArguments
    out = Path(a.out)
    data = corpus(out, a.data)
    model = gpt2(a.seq_len)
    train = stream(data, a.seq_len)
    held = stream(data, a.seq_len, seed=1)
    evals = Held(held, 2 * a.batch_size)
    held.close()
    callbacks = []
    if a.offload is not None or os.environ.get("TERAIO_CAPACITY"):
        from teraio.torch.trainer import OffloadCallback
        ssd = None
        if not os.environ.get("TERAIO_SSD"):
            ssd = str(out / "ssd")
            os.makedirs(ssd, exist_ok=True)
        callbacks.append(OffloadCallback(capacity=a.offload, ssd=ssd))
    args = TrainingArguments(output_dir=str(out / "checkpoints"), max_steps=a.steps,
                             per_device_train_batch_size=a.batch_size, per_device_eval_batch_size=a.batch_size,
                             gradient_accumulation_steps=a.accumulate, learning_rate=1e-3, optim=a.optim,
                             eval_strategy="steps", eval_steps=a.eval_every, save_steps=a.save_every,
                             logging_steps=1, report_to=[], use_cpu=True, seed=0, dataloader_num_workers=0,
                             disable_tqdm=True, log_level="warning",
                             remove_unused_columns=False)  # hf_batch picks the model's inputs itself
    trainer = Trainer(model=model, args=args, train_dataset=train, eval_dataset=evals, data_collator=hf_batch,
                      callbacks=callbacks)
    resume = None
    if a.resume:
        found = sorted((p for p in (out / "checkpoints").glob("checkpoint-*") if p.name[11:].isdigit()),
                       key=lambda p: int(p.name[11:]))
        if not found:
            print(f"train_trainer: no checkpoint under {out / 'checkpoints'} to resume from", file=sys.stderr)
            return 1
        resume = str(found[-1])
    trainer.train(resume_from_checkpoint=resume)
    for h in trainer.state.log_history:
        keep = {k: h[k] for k in ("step", "loss", "eval_loss") if k in h}
        if len(keep) > 1:
            print(json.dumps(keep), flush=True)
    if callbacks:
        r = callbacks[0].report
        print(summary(r))
    train.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
