"""The loader in Hugging Face loops (issue 25 item 3): samples of any
cu_seqlens batch with teraio.data.collate (flash-attn's varlen cu_seqlens over
the flattened batch, positions that restart at every document for HF's
position_ids packing); labels="hf" gives the unshifted labels HF models
expect, with the same loss as the default next-token labels; the end-of-
document id defaults to the tokenizer's own; examples/train_hf.py trains a
GPT-2 from the loader with and without offloading, with the same losses."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from teraio.data import StreamingDataset, collate

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    r = tmp_path_factory.mktemp("hfdata")
    (r / "a").mkdir()
    with open(r / "a" / "x.jsonl", "w") as f:
        for i in range(60):
            f.write(json.dumps({"text": f"document {i} " + "word " * (2 + i % 19)}) + "\n")
    return r


def test_the_docstring_batch_and_what_collate_gives(root):
    ds = StreamingDataset(root, seq_len=32, tokenizer="r50k_base", logical_shards=4)
    assert ds.eos_id == 50256                          # r50k_base's <|endoftext|>
    batch = next(iter(torch.utils.data.DataLoader(ds, batch_size=4, collate_fn=collate)))
    ds.close()
    assert batch["input_ids"].shape == batch["labels"].shape == batch["position_ids"].shape == (4, 32)
    cu = batch["cu_seqlens"]
    assert cu.dtype == torch.int32 and cu[0] == 0 and cu[-1] == 4 * 32 and bool((cu[1:] > cu[:-1]).all())
    assert batch["max_seqlen"] == int((cu[1:] - cu[:-1]).max())
    # each segment's positions start at 0 and count up: the same boundaries twice
    pos = batch["position_ids"].reshape(-1)
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
        assert pos[a:b].tolist() == list(range(b - a)) or (a % 32 == 0 and pos[a] > 0), (a, b)
    assert len(cu) > 5                                  # documents are shorter than a sample
    with pytest.raises(ValueError, match="collate: no samples"):
        collate([])
    one = StreamingDataset(root, seq_len=32, tokenizer="r50k_base", logical_shards=4, provenance=True)
    short = StreamingDataset(root, seq_len=16, tokenizer="r50k_base", logical_shards=4)
    a, b = next(iter(one)), next(iter(short))
    plain = {k: v for k, v in a.items() if k != "provenance"}
    with pytest.raises(ValueError, match="collate: sample 1 holds 16 tokens, sample 0 32"):
        collate([a, b])
    with pytest.raises(ValueError, match="collate: sample 1 lacks provenance, sample 0 has it"):
        collate([a, plain])
    with pytest.raises(ValueError, match="collate: sample 1 has provenance, sample 0 lacks it"):
        collate([plain, a])
    assert collate([a, a])["provenance"][:, 0].tolist().count(1) == len(a["provenance"])
    one.close()
    short.close()


def test_hf_labels_give_the_next_token_loss(root):
    """A Hugging Face model shifts its labels: with labels="hf" (the input ids) its
    loss is the next-token loss of the default labels, never the token two ahead."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2,
                                                                 vocab_size=50257, n_positions=32))
    kw = dict(seq_len=32, tokenizer="r50k_base", logical_shards=4, seed=3)
    hf, nxt = StreamingDataset(root, labels="hf", **kw), StreamingDataset(root, **kw)
    a, b = collate([next(iter(hf)) for _ in range(2)]), collate([next(iter(nxt)) for _ in range(2)])
    hf.close()
    nxt.close()
    assert torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(a["labels"], a["input_ids"])
    assert torch.equal(b["labels"][:, :-1], b["input_ids"][:, 1:])
    with torch.no_grad():
        out = model(input_ids=a["input_ids"], labels=a["labels"])
        want = F.cross_entropy(out.logits[:, :-1].reshape(-1, 50257).float(), b["labels"][:, :-1].reshape(-1))
    assert torch.allclose(out.loss, want, rtol=0, atol=1e-6), (out.loss, want)
    with pytest.raises(ValueError, match="labels='shifted'"):
        StreamingDataset(root, labels="shifted", **kw)


def test_eos_defaults_to_the_tokenizer(root, tmp_path):
    assert StreamingDataset(root, seq_len=8).eos_id == 0                     # bytes
    assert StreamingDataset(root, seq_len=8, tokenizer="cl100k_base").eos_id == 100257
    assert StreamingDataset(root, seq_len=8, tokenizer="r50k_base", eos_id=7).eos_id == 7
    tj = tmp_path / "tokenizer.json"          # a byte-level BPE of the 256 bytes, no special token
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))   # GPT-2's byte -> char
    rest = [b for b in range(256) if b not in bs]
    vocab = {chr(b): b for b in bs} | {chr(256 + n): b for n, b in enumerate(rest)}
    tj.write_text(json.dumps({"model": {"type": "BPE", "vocab": vocab, "merges": []},
                              "pre_tokenizer": {"type": "ByteLevel"}, "added_tokens": []}))
    with pytest.raises(ValueError, match="has none of the special tokens <\\|endoftext\\|>, .*give eos_id"):
        StreamingDataset(root, seq_len=8, tokenizer=str(tj))
    assert StreamingDataset(root, seq_len=8, tokenizer=str(tj), eos_id=3).eos_id == 3


def test_train_hf_example_offloaded_has_the_plain_losses(tmp_path):
    pytest.importorskip("transformers")
    import os
    # one compute thread: at two, MKL's results vary from run to run without its reproducibility
    # settings (README, "Bit for bit on the CPU"; test_cpu_reproducible covers the default count)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    runs = {}
    for name, extra in (("plain", []), ("teraio", ["--offload", "0.6"])):
        r = subprocess.run([sys.executable, str(REPO / "examples" / "train_hf.py"), "--out", str(tmp_path / "o"),
                            "--steps", "4", *extra], capture_output=True, text=True, timeout=600, env=env)
        assert r.returncode == 0, r.stderr[-3000:]
        runs[name] = r.stdout
    losses = {k: [line for line in v.splitlines() if line.startswith("step ")] for k, v in runs.items()}
    assert len(losses["plain"]) == 4 and losses["teraio"] == losses["plain"]
    assert "2 profiled, 2 planned and 0 diverged steps" in runs["teraio"] and ", 0 kernels over" in runs["teraio"]


def test_train_trainer_example_offloaded_has_the_plain_losses(tmp_path):
    """examples/train_trainer.py: the Trainer over the loader (accumulation 2, an evaluation
    and a checkpoint every 2 steps), alone and with teraio's callback configured from the
    environment (TERAIO_CAPACITY, TERAIO_SSD): the same log lines, bit for bit."""
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    import os
    (tmp_path / "ssd").mkdir()
    base = dict(os.environ, OMP_NUM_THREADS="1")
    base.pop("TERAIO_CAPACITY", None)
    runs = {}
    for name, env in (("plain", base),
                      ("teraio", dict(base, TERAIO_CAPACITY="0.6", TERAIO_SSD=str(tmp_path / "ssd")))):
        r = subprocess.run([sys.executable, str(REPO / "examples" / "train_trainer.py"), "--out",
                            str(tmp_path / name), "--steps", "4",
                            "--seq-len", "64", "--eval-every", "2", "--save-every", "2"],
                           capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
        assert r.returncode == 0, r.stderr[-3000:]
        runs[name] = r.stdout
    logs = {k: [json.loads(line) for line in v.splitlines() if line.startswith("{\"")] for k, v in runs.items()}
    assert [x["step"] for x in logs["plain"] if "loss" in x] == [1, 2, 3, 4]
    assert [x["step"] for x in logs["plain"] if "eval_loss" in x] == [2, 4]
    assert logs["teraio"] == logs["plain"]
    assert "2 profiled, " in runs["teraio"] and ", 0 kernels over" in runs["teraio"], runs["teraio"]
    assert (tmp_path / "teraio" / "checkpoints" / "checkpoint-4").is_dir()


def test_a_bad_tokenizer_json_is_named_by_its_path(root, tmp_path):
    """Its errors said '<memory>' (the loader parsed the file's text without its name)."""
    tj = tmp_path / "tokenizer.json"
    tj.write_text(json.dumps({"model": {"type": "BPE", "vocab": {}, "merges": []}}))
    with pytest.raises(Exception, match=f"^{tj}: no pre_tokenizer: not byte-level BPE"):
        StreamingDataset(root, seq_len=8, tokenizer=str(tj))
