"""teraio.data.StreamingDataset on datasets written by the peers' own writers:
Arrow files by pyarrow the way IBM's fms-fsdp loader reads them (a ``tokens``
column, one record batch per document), llm.c shards the way llm.c's
``write_datafile`` writes them, JSONL (plain, .gz, .zst).  Checks exact tokens
through provenance, exact resume, N -> M rescale covering one epoch exactly once
(hypothesis), and the errors of the Python API."""
import gzip
import json
import shutil
import subprocess

import numpy as np
import pyarrow as pa
import pytest
import torch
from hypothesis import given, settings, strategies as st

from teraio._lib import TeraioError
from teraio.data import StreamingDataset

EOS = 60000


def doc_tokens(sub, f, d):
    n = 1 + (d * 37 + f * 11 + sub * 5) % 70
    return [1 + (sub * 1000003 + f * 7919 + d * 31 + i * 17) % 250 for i in range(n)]


def write_arrow(path, docs):
    # As fms-fsdp's ArrowHandler expects: pa.ipc.open_file(...).get_batch(i)["tokens"]
    schema = pa.schema([pa.field("tokens", pa.uint32())])
    with pa.ipc.new_file(str(path), schema) as w:
        for d in docs:
            w.write(pa.record_batch([pa.array(d, type=pa.uint32())], schema=schema))


def write_llmc(path, docs):
    # llm.c dev/data/data_common.py write_datafile(..., "gpt-2"): each document is
    # [<|endoftext|>] + tokens, header of 256 int32 (magic, version, count).
    toks = []
    for d in docs:
        toks += [50256] + d
    header = np.zeros(256, dtype=np.int32)
    header[0], header[1], header[2] = 20240520, 1, len(toks)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.array(toks, dtype=np.uint16).tobytes())


def text_of(tokens):
    return "".join(chr(32 + t % 90) for t in tokens)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    r = tmp_path_factory.mktemp("data")
    (r / "arrow").mkdir()
    write_arrow(r / "arrow" / "a.arrow", [doc_tokens(0, 0, d) for d in range(30)])
    write_arrow(r / "arrow" / "b.arrow", [doc_tokens(0, 1, d) for d in range(17)])
    (r / "llmc" / "deep").mkdir(parents=True)
    write_llmc(r / "llmc" / "deep" / "train_000.bin", [doc_tokens(1, 0, d) for d in range(40)])
    (r / "text").mkdir()
    lines = [json.dumps({"id": d, "text": text_of(doc_tokens(2, 0, d))}) for d in range(25)]
    (r / "text" / "0.jsonl").write_text("\n".join(lines) + "\n")
    lines = [json.dumps({"text": text_of(doc_tokens(2, 1, d)), "x": [1, {"y": None}]}) for d in range(9)]
    with gzip.open(r / "text" / "1.jsonl.gz", "wt") as f:
        f.write("\n".join(lines) + "\n")
    lines = [json.dumps({"text": text_of(doc_tokens(2, 2, d))}) for d in range(11)]
    (r / "text" / "2.jsonl").write_text("\n".join(lines) + "\n")
    subprocess.run(["zstd", "-q", "--rm", str(r / "text" / "2.jsonl")], check=True)
    return r


def expected(ds, sub, f, d):
    name = ds.subdatasets[sub]
    t = doc_tokens(["arrow", "llmc", "text"].index(name), f, d)
    if name == "text":
        t = [ord(c) for c in text_of(t)]
    return t + [EOS]


def check(ds, sample, spans=None):
    toks = torch.cat([sample["input_ids"], sample["labels"][-1:]]).tolist()
    at = 0
    for sub, f, d, off, n, ep in sample["provenance"].tolist():
        assert toks[at:at + n] == expected(ds, sub, f, d)[off:off + n]
        at += n
        if spans is not None and ep == 0:
            spans.append((sub, f, d, off, n))
    assert at == ds.seq_len + 1
    assert sample["labels"].tolist() == toks[1:]
    cu = sample["cu_seqlens"].tolist()
    assert cu[0] == 0 and cu[-1] == ds.seq_len
    assert all(sample["position_ids"][c].item() == 0 for c in cu[:-1])


def epoch_tokens(ds):
    return sum(len(expected(ds, s, f, d)) for s, f, d in all_docs(ds))


def all_docs(ds):
    counts = {"arrow": [30, 17], "llmc": [40], "text": [25, 9, 11]}
    return [(s, f, d) for s, name in enumerate(ds.subdatasets)
            for f, n in enumerate(counts[name]) for d in range(n)]


def assert_exactly_once(ds, spans):
    cover = {}
    for sub, f, d, off, n in spans:
        cover.setdefault((sub, f, d), []).append((off, n))
    assert set(cover) == set(all_docs(ds))
    for key, pieces in cover.items():
        at = 0
        for off, n in sorted(pieces):
            assert off == at, key
            at += n
        assert at == len(expected(ds, *key)), key


def make(root, **kw):
    kw.setdefault("seq_len", 24)
    kw.setdefault("eos_id", EOS)
    kw.setdefault("provenance", True)
    return StreamingDataset(str(root), **kw)


def test_sources_read_exactly(root):
    ds = make(root, logical_shards=4, seed=1)
    assert ds.subdatasets == ["arrow", "llmc", "text"]
    it = iter(ds)
    for _ in range(50):
        check(ds, next(it))


@settings(max_examples=12, deadline=None)
@given(n=st.integers(1, 4), m=st.integers(1, 4), seed=st.integers(0, 2**32), L=st.integers(4, 20),
       step=st.integers(0, 30), seq_len=st.integers(5, 70), shuffle=st.integers(0, 6))
def test_rescale_covers_epoch_exactly_once(root, n, m, seed, L, step, seq_len, shuffle):
    kw = dict(seed=seed, logical_shards=L, seq_len=seq_len, shuffle_buffer=shuffle)
    spans, states = [], []
    for r in range(n):
        ds = make(root, rank=r, world_size=n, **kw)
        it = iter(ds)
        for _ in range(step):
            check(ds, next(it), spans)
        states.append(ds.state_dict())
        ds.close()
    new = [make(root, rank=r, world_size=m, **kw) for r in range(m)]
    for ds in new:
        ds.load_state_dict(states)
    its = [iter(ds) for ds in new]
    total = epoch_tokens(new[0])
    for _ in range(100000):
        if sum(s[4] for s in spans) >= total:
            break
        for ds, it in zip(new, its):
            check(ds, next(it), spans)
    assert_exactly_once(new[0], spans)


def test_resume_is_bit_identical(root, tmp_path):
    kw = dict(seed=5, logical_shards=8, rank=1, world_size=2, shuffle_buffer=4)
    ref = make(root, **kw)
    it = iter(ref)
    ref_samples = [next(it)["input_ids"] for _ in range(60)]
    ds = make(root, **kw)
    it = iter(ds)
    for i in range(20):
        assert torch.equal(next(it)["input_ids"], ref_samples[i])
    ds.save(tmp_path)
    ds2 = make(root, **kw)
    ds2.resume(tmp_path)
    it2 = iter(ds2)
    for i in range(20, 60):
        assert torch.equal(next(it2)["input_ids"], ref_samples[i])


def test_load_after_iteration_is_an_error(root):
    ds = make(root, logical_shards=4)
    state = ds.state_dict()
    next(iter(ds))
    with pytest.raises(RuntimeError, match="after a sample was delivered"):
        ds.load_state_dict(state)


def test_state_of_other_settings_fails_loudly(root):
    state = make(root, logical_shards=4, seed=1).state_dict()
    with pytest.raises(TeraioError, match="fingerprint mismatch"):
        make(root, logical_shards=4, seed=2).load_state_dict(state)


def test_dataloader_workers_refused(root):
    ds = make(root, logical_shards=4)
    with pytest.raises(RuntimeError, match="num_workers=0"):
        next(iter(torch.utils.data.DataLoader(ds, batch_size=2, num_workers=2)))


def test_dataloader_batches(root):
    ds = make(root, logical_shards=4, provenance=False)
    batch = next(iter(torch.utils.data.DataLoader(ds, batch_size=3, collate_fn=list)))
    assert [b["input_ids"].shape for b in batch] == [torch.Size([24])] * 3


def test_bad_options(root):
    with pytest.raises(TeraioError, match="unknown sub-dataset 'nope'"):
        make(root, weights={"nope": 1.0})
    with pytest.raises(TeraioError, match="logical_shards"):
        make(root, logical_shards=2, world_size=3, rank=0)


def test_subdataset_added_on_restart_is_mixed_in(root, tmp_path):
    small = tmp_path / "root"
    small.mkdir()
    shutil.copytree(root / "arrow", small / "arrow")
    # (samples in the shuffle buffer at the restart keep the old mixture)
    ds = make(small, logical_shards=4, weights={"arrow": 1.0}, shuffle_buffer=2)
    it = iter(ds)
    for _ in range(10):
        next(it)
    state = ds.state_dict()
    shutil.copytree(root / "llmc", small / "llmc")
    ds2 = make(small, logical_shards=4, shuffle_buffer=2)
    ds2.load_state_dict(state)
    seen = {0: 0, 1: 0}
    it = iter(ds2)
    for _ in range(3):
        next(it)
    for _ in range(200):
        for sub, _, _, _, n, _ in next(it)["provenance"].tolist():
            seen[sub] += n
    share = seen[1] / (seen[0] + seen[1])
    assert abs(share - 0.5) < 0.05
