"""teraio.data with the peers' own code: Megatron .bin/.idx written by megatron-core's
``IndexedDatasetBuilder`` (documents of several sequences, several dtypes) read back
exactly; the loader inside torchdata's ``StatefulDataLoader`` (its state in the
loader's ``state_dict``, restored together with a model by torch.distributed.checkpoint);
JSONL tokenized by a Hugging Face ``tokenizer.json`` (trained here with the
``tokenizers`` library) to exactly that library's ids, on several threads."""
import json
import subprocess
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from teraio._lib import TeraioError
from teraio.data import StreamingDataset

EOS = 7


def doc(f, d, n_seqs):
    """Document d of file f: n_seqs sequences of known tokens."""
    seqs = []
    for s in range(n_seqs):
        n = 1 + (d * 13 + s * 7 + f * 3) % 40
        seqs.append([(f * 1009 + d * 101 + s * 31 + i * 3) % 30000 for i in range(n)])
    return seqs


@pytest.fixture(scope="module")
def megatron_root(tmp_path_factory):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
    root = tmp_path_factory.mktemp("mt")
    (root / "mt").mkdir()
    docs = {}
    for f, dtype in enumerate([np.uint16, np.int32, np.int64]):
        prefix = str(root / "mt" / f"part{f}")
        b = IndexedDatasetBuilder(prefix + ".bin", dtype=dtype)
        docs[f] = []
        for d in range(20 + 5 * f):
            seqs = doc(f, d, 1 + d % 3)
            if d % 2:   # whole document at once, with its sequence lengths
                b.add_document(torch.tensor(sum(seqs, [])), [len(s) for s in seqs])
            else:       # sequence by sequence
                for s in seqs:
                    b.add_item(torch.tensor(s))
                b.end_document()
            docs[f].append(sum(seqs, []))
        b.finalize(prefix + ".idx")
    return root, docs


def test_megatron_builder_files_read_exactly(megatron_root):
    root, docs = megatron_root
    ds = StreamingDataset(str(root), seq_len=31, eos_id=EOS, provenance=True, logical_shards=4,
                          rank=0, world_size=1, fill_threads=2)
    seen = {}
    total = sum(len(x) + 1 for v in docs.values() for x in v)
    it = iter(ds)
    got = 0
    while got < total:
        s = next(it)
        toks = torch.cat([s["input_ids"], s["labels"][-1:]]).tolist()
        at = 0
        for _, f, d, off, n, ep in s["provenance"].tolist():
            want = docs[f][d] + [EOS]
            assert toks[at:at + n] == want[off:off + n]
            if ep == 0:
                seen.setdefault((f, d), 0)
                seen[(f, d)] += n
                got += n
            at += n
    assert seen == {(f, d): len(x) + 1 for f, v in docs.items() for d, x in enumerate(v)}
    ds.close()


def stack_inputs(samples):
    return {"input_ids": torch.stack([s["input_ids"] for s in samples])}


def test_stateful_dataloader_checkpoint(megatron_root, tmp_path):
    import torch.distributed.checkpoint as dcp
    from torchdata.stateful_dataloader import StatefulDataLoader

    root, _ = megatron_root

    def loader():
        ds = StreamingDataset(str(root), seq_len=16, eos_id=EOS, logical_shards=4, seed=5,
                              rank=0, world_size=1)
        return StatefulDataLoader(ds, batch_size=3, num_workers=0, collate_fn=stack_inputs)

    ref = [b["input_ids"] for _, b in zip(range(12), loader())]
    model = torch.nn.Linear(4, 2)
    dl = loader()
    it = iter(dl)
    for i in range(5):
        assert torch.equal(next(it)["input_ids"], ref[i])
    # the loader's state is part of the DataLoader's, saved with the model
    dcp.save({"model": model.state_dict(), "loader": dl.state_dict()}, checkpoint_id=str(tmp_path))
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    model2 = torch.nn.Linear(4, 2)
    dl2 = loader()
    state = {"model": model2.state_dict(), "loader": dl2.state_dict()}
    dcp.load(state, checkpoint_id=str(tmp_path))
    model2.load_state_dict(state["model"])
    dl2.load_state_dict(state["loader"])
    assert all(torch.equal(weights[k], v) for k, v in model2.state_dict().items())
    got = [b["input_ids"] for _, b in zip(range(7), dl2)]
    for i, b in enumerate(got):
        assert torch.equal(b, ref[5 + i]), i


def test_stateful_dataloader_workers_refused(megatron_root):
    from torchdata.stateful_dataloader import StatefulDataLoader
    root, _ = megatron_root
    ds = StreamingDataset(str(root), seq_len=16, logical_shards=4, rank=0, world_size=1)
    with pytest.raises(Exception, match="num_workers=0"):
        next(iter(StatefulDataLoader(ds, batch_size=2, num_workers=1)))


TEXTS = ["The quick brown fox jumps over the lazy dog.", "naïve café — déjà vu 🙂 x",
         "def f(x):\n    return x * 2\n", "   spaces   and\ttabs", "数据加载器", "a" * 300]


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    from tokenizers import ByteLevelBPETokenizer
    d = tmp_path_factory.mktemp("bpe")
    t = ByteLevelBPETokenizer()
    t.train_from_iterator(TEXTS * 20, vocab_size=400, min_frequency=1, show_progress=False)
    path = d / "tokenizer.json"
    t.save(str(path))
    from tokenizers import Tokenizer
    ref = Tokenizer.from_file(str(path))
    root = d / "root"
    (root / "text").mkdir(parents=True)
    lines = [TEXTS[i % len(TEXTS)] + f" line {i}" for i in range(300)]
    (root / "text" / "a.jsonl").write_text("\n".join(json.dumps({"text": x}) for x in lines) + "\n")
    return path, root, [ref.encode(x, add_special_tokens=False).ids for x in lines]


@pytest.mark.parametrize("threads", [1, 3])
def test_jsonl_through_hf_tokenizer(bpe, threads):
    path, root, want = bpe
    ds = StreamingDataset(str(root), seq_len=64, eos_id=399, provenance=True, logical_shards=2,
                          tokenizer=str(path), tokenizer_threads=threads, rank=0, world_size=1)
    assert ds.tokenizer.startswith("hf:")
    it = iter(ds)
    covered = 0
    while covered < sum(len(w) + 1 for w in want):
        s = next(it)
        toks = torch.cat([s["input_ids"], s["labels"][-1:]]).tolist()
        at = 0
        for _, _, d, off, n, ep in s["provenance"].tolist():
            assert toks[at:at + n] == (want[d] + [399])[off:off + n]
            covered += n if ep == 0 else 0
            at += n
    state = ds.state_dict()
    ds.close()
    # the tokenizer is part of the settings: a state of another one fails loudly
    other = StreamingDataset(str(root), seq_len=64, eos_id=399, logical_shards=2, rank=0,
                             world_size=1)
    with pytest.raises(TeraioError, match="fingerprint"):
        other.load_state_dict(state)


def test_unknown_tokenizer(bpe):
    _, root, _ = bpe
    with pytest.raises(TeraioError, match="unknown tokenizer 'gpt9'"):
        StreamingDataset(str(root), seq_len=8, tokenizer="gpt9")


def teraio_cli():
    from teraio._lib import lib
    lib_path = Path(lib._name).resolve()
    for cand in (lib_path.parent.parent / "bin" / "teraio", lib_path.parent.parent / "_bin" / "teraio"):
        if cand.exists():
            return str(cand)
    pytest.skip(f"no teraio command beside {lib_path}")


def test_ingest_output_read_by_megatron(bpe, tmp_path):
    """`teraio data ingest` with the tokenizer.json writes Megatron files that
    megatron-core's IndexedDataset reads back as exactly the tokenizers library's ids."""
    path, root, want = bpe
    out = tmp_path / "out"
    r = subprocess.run([teraio_cli(), "data", "ingest", str(root), str(out), "--tokenizer",
                        str(path), "--threads", "2"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""   # no progress line when stderr is not a terminal
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.indexed_dataset import IndexedDataset
    d = IndexedDataset(str(out / "text" / "a"))
    assert len(d) == len(want)
    assert [d[i].tolist() for i in range(len(d))] == want
    assert d[0].dtype == np.uint16       # the vocabulary (400) fits
    rows = (out / "counts.csv").read_text().splitlines()[1:]
    assert rows == [f"text/a.bin,{len(want)},{sum(map(len, want))}"]
