"""Parquet as a loader source (issue 18), on files written by pyarrow: a text column
tokenized on the fly (ids equal tiktoken's) and a token-list column; several row groups,
a null row, the Hugging Face hub's ``data/*.parquet`` layout with README.md and
dataset_info.json beside; document counts from the footers (``teraio data inspect``);
delivered exactly once per epoch, resumed bit-identically, rescaled N -> M, mixed with
JSONL; provenance down to row group and row; bad files (truncated, a footer that lies,
wrong column type, missing column, null rows) give errors naming file, row group and
column, or with ``skip_bad_lines`` a counted skip; without the shim, Parquet is reported
unavailable with the reason while the other formats still load."""
import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import teraio
from teraio._lib import TeraioError
from teraio.data import StreamingDataset, parquet_available

REPO = Path(__file__).resolve().parents[2]
TERAIO = REPO / "build" / "bin" / "teraio"
SHIPPED = Path(teraio.__file__).resolve().parent / "tokenizers"
EOS = 50256

ok, why = parquet_available()
pytestmark = pytest.mark.skipif(not ok, reason=f"Parquet unavailable: {why}")


def text_of(f, d):
    return f"Document {d} of file {f}: " + " ".join(f"w{(d * 7 + k * 3 + f) % 97}" for k in range(d % 23))


def tokens_of(f, d):
    return [1 + (f * 1009 + d * 31 + i * 17) % 50000 for i in range(1 + (d * 13 + f) % 40)]


TEXT_FILES = [(0, 37, 5), (1, 20, 7)]      # (file, rows, row group size)
NULL_ROW = (1, 3)                            # file 1, row 3 of the text is null
TOKEN_ROWS = 45


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    r = tmp_path_factory.mktemp("parquet")
    hub = r / "wiki" / "data"
    hub.mkdir(parents=True)
    for f, rows, rg in TEXT_FILES:
        t = pa.table({"id": list(range(rows)),
                      "text": [None if (f, d) == NULL_ROW else text_of(f, d) for d in range(rows)]})
        pq.write_table(t, hub / f"train-{f:05d}-of-00002.parquet", row_group_size=rg)
    (r / "wiki" / "README.md").write_text("---\nlicense: cc\n---\n# wiki\n")
    (r / "wiki" / "dataset_info.json").write_text(json.dumps({"splits": {"train": {}}}))
    (r / "ids").mkdir()
    t = pa.table({"input_ids": pa.array([tokens_of(9, d) for d in range(TOKEN_ROWS)],
                                        type=pa.list_(pa.int64()))})
    pq.write_table(t, r / "ids" / "part.parquet", row_group_size=8)
    (r / "notes").mkdir()
    (r / "notes" / "a.jsonl").write_text(
        "".join(json.dumps({"text": text_of(5, d)}) + "\n" for d in range(15)))
    return r


@functools.lru_cache(maxsize=None)
def r50k():
    tiktoken = pytest.importorskip("tiktoken")
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", "")
    import tiktoken.load
    spec = json.loads((SHIPPED / "encodings.json").read_text())["r50k_base"]
    return tiktoken.Encoding("r50k_base", pat_str=spec["pat_str"], special_tokens=spec["special_tokens"],
                             mergeable_ranks=tiktoken.load.load_tiktoken_bpe(str(SHIPPED / "r50k_base.tiktoken")))


def expected(ds, sub, f, d):
    name = ds.subdatasets[sub]
    if name == "ids":
        return tokens_of(9, d) + [EOS]
    text = text_of(5, d) if name == "notes" else text_of(TEXT_FILES[f][0], d)
    return r50k().encode_ordinary(text) + [EOS]


def n_docs(name):
    return {"ids": [TOKEN_ROWS], "notes": [15], "wiki": [rows for _, rows, _ in TEXT_FILES]}[name]


def make(root, **kw):
    kw.setdefault("seq_len", 40)
    kw.setdefault("eos_id", EOS)
    kw.setdefault("provenance", True)
    kw.setdefault("tokenizer", "r50k_base")
    kw.setdefault("logical_shards", 6)
    kw.setdefault("skip_bad_lines", True)   # the null row: skipped and counted
    return StreamingDataset(str(root), **kw)


def check(ds, sample, spans):
    toks = torch.cat([sample["input_ids"], sample["labels"][-1:]]).tolist()
    at = 0
    for sub, f, d, off, n, ep in sample["provenance"].tolist():
        assert toks[at:at + n] == expected(ds, sub, f, d)[off:off + n], (sub, f, d)
        at += n
        if ep == 0:
            spans.append((sub, f, d, off, n))
    assert at == ds.seq_len + 1


def all_docs(ds):
    """Every document of an epoch but the null row."""
    return {(s, f, d) for s, name in enumerate(ds.subdatasets) for f, n in enumerate(n_docs(name))
            for d in range(n) if not (name == "wiki" and (f, d) == NULL_ROW)}


def epoch_total(ds):
    return sum(len(expected(ds, *key)) for key in all_docs(ds))


def assert_exactly_once(ds, spans):
    cover = {}
    for sub, f, d, off, n in spans:
        cover.setdefault((sub, f, d), []).append((off, n))
    assert set(cover) == all_docs(ds)
    for key, pieces in cover.items():
        at = 0
        for off, n in sorted(pieces):
            assert off == at, key
            at += n
        assert at == len(expected(ds, *key)), key


def run_epoch(datasets, spans, total):
    its = [iter(ds) for ds in datasets]
    for _ in range(100000):
        if sum(s[4] for s in spans) >= total:
            return
        for ds, it in zip(datasets, its):
            check(ds, next(it), spans)


def test_hub_layout_found_and_counted_from_footers(root):
    ds = make(root)
    assert ds.subdatasets == ["ids", "notes", "wiki"]
    out = subprocess.run([str(TERAIO), "data", "inspect", str(root), "--json"], check=True,
                         capture_output=True, text=True).stdout
    info = {s["name"]: s for s in json.loads(out)["subdatasets"]}
    assert info["wiki"]["documents"] == 57 and info["wiki"]["files"] == 2
    assert [f["documents"] for f in info["wiki"]["file_list"]] == [37, 20]
    assert {f["format"] for f in info["wiki"]["file_list"]} == {"Parquet text"}
    assert info["ids"]["file_list"][0]["format"] == "Parquet tokens"
    assert info["ids"]["documents"] == TOKEN_ROWS


def test_epoch_exactly_once_ids_equal_tiktoken(root):
    ds = make(root, seed=4)
    spans = []
    run_epoch([ds], spans, epoch_total(ds))
    assert_exactly_once(ds, spans)
    info = ds.subdataset_info("wiki")
    assert info["lines_skipped"] >= 1 and info["documents"] == 57


@pytest.mark.parametrize("n, m, step", [(2, 3, 7), (3, 1, 4), (1, 2, 9)])
def test_rescale_n_to_m_exactly_once(root, n, m, step):
    spans, states = [], []
    for r in range(n):
        ds = make(root, rank=r, world_size=n, seed=11)
        it = iter(ds)
        for _ in range(step):
            check(ds, next(it), spans)
        states.append(ds.state_dict())
        ds.close()
    new = [make(root, rank=r, world_size=m, seed=11) for r in range(m)]
    for ds in new:
        ds.load_state_dict(states)
    run_epoch(new, spans, epoch_total(new[0]))
    assert_exactly_once(new[0], spans)


def test_resume_is_bit_identical(root, tmp_path):
    ref = make(root, seed=2, shuffle_buffer=4)
    it = iter(ref)
    want = [next(it)["input_ids"] for _ in range(30)]
    ds = make(root, seed=2, shuffle_buffer=4)
    it = iter(ds)
    for i in range(12):
        assert torch.equal(next(it)["input_ids"], want[i])
    ds.save(tmp_path)
    again = make(root, seed=2, shuffle_buffer=4)
    again.resume(tmp_path)
    it = iter(again)
    for i in range(12, 30):
        assert torch.equal(next(it)["input_ids"], want[i])


def test_provenance_names_row_group_and_row(root):
    ds = make(root)
    wiki = ds.subdatasets.index("wiki")
    # file 1 holds 20 rows in row groups of 7: document 16 is row 2 of row group 2
    assert ds.locate(wiki, 1, 16) == {"path": "wiki/data/train-00001-of-00002.parquet",
                                      "format": "Parquet text", "unit": 2, "row": 2}
    assert ds.locate(ds.subdatasets.index("ids"), 0, 8)["unit"] == 1


def bad_root(tmp_path, name, table=None, raw=None, rg=2):
    r = tmp_path / name
    (r / "s").mkdir(parents=True)
    path = r / "s" / "x.parquet"
    if table is not None:
        pq.write_table(table, path, row_group_size=rg)
    if raw is not None:
        path.write_bytes(raw(path.read_bytes() if path.exists() else b""))
    return r


def good_bytes(tmp_path):
    p = tmp_path / "good.parquet"
    pq.write_table(pa.table({"text": [f"row {i}" for i in range(10)]}), p, row_group_size=3)
    return p.read_bytes()


def test_null_row_is_an_error_or_a_counted_skip(tmp_path):
    r = bad_root(tmp_path, "nulls", pa.table({"text": ["a b", None, "c d", "e"]}))
    ds = make(r, tokenizer="bytes", seq_len=4, skip_bad_lines=False)
    with pytest.raises(TeraioError, match=r"s/x.parquet: row group 0, row 1: column 'text' is null"):
        it = iter(ds)
        for _ in range(20):
            next(it)
    ds = make(r, tokenizer="bytes", seq_len=4, skip_bad_lines=True)
    it = iter(ds)
    seen = set()
    for _ in range(20):
        seen |= {tuple(p[:3]) for p in next(it)["provenance"].tolist()}
    assert seen == {(0, 0, 0), (0, 0, 2), (0, 0, 3)}


@pytest.mark.parametrize("case, message", [
    ("truncated", r"s/x.parquet: .*(magic|size|footer|Parquet)"),
    ("footer_lies", r"s/x.parquet: the footer says 11 rows, its row groups hold 10"),
    ("wrong_type", r"s/x.parquet: column 'text' is int64, not a string"),
    ("missing", r"s/x.parquet: no column 'text' \(text\) nor 'tokens' or 'input_ids'"),
    ("tokens_type", r"s/x.parquet: column 'tokens' is list<element: double>, not a list of integers"),
    ("negative_id", r"s/x.parquet: row group 0, row 1: column 'tokens': token -3 is not an id"),
    ("uint64_id", r"s/x.parquet: row group 0, row 0: column 'tokens': token 9223372036854775808 is not an id"),
])
def test_bad_files_named_with_row_group_and_column(tmp_path, case, message):
    if case == "truncated":
        g = good_bytes(tmp_path)
        r = bad_root(tmp_path, case, raw=lambda _: g[:len(g) // 2])
    elif case == "footer_lies":
        g = good_bytes(tmp_path)
        footer_len = int.from_bytes(g[-8:-4], "little")
        start = len(g) - 8 - footer_len
        footer = g[start:-8]
        # FileMetaData field 3 (num_rows, i64 = 10, zigzag 20) before field 4 (row groups)
        assert footer.count(b"\x16\x14\x19") == 1
        lie = footer.replace(b"\x16\x14\x19", b"\x16\x16\x19")
        r = bad_root(tmp_path, case, raw=lambda _: g[:start] + lie + g[-8:])
    elif case == "wrong_type":
        r = bad_root(tmp_path, case, pa.table({"text": [1, 2, 3]}))
    elif case == "missing":
        r = bad_root(tmp_path, case, pa.table({"body": ["a", "b"]}))
    elif case == "tokens_type":
        r = bad_root(tmp_path, case, pa.table({"tokens": [[1.5], [2.0]]}))
    elif case == "uint64_id":  # issue 26 item 14: printed as unsigned, not as -2^63
        r = bad_root(tmp_path, case, pa.table({"tokens": pa.array([[2 ** 63]], type=pa.list_(pa.uint64()))}))
    else:
        r = bad_root(tmp_path, case, pa.table({"tokens": pa.array([[1, 2], [4, -3]],
                                                                  type=pa.list_(pa.int32()))}))
    with pytest.raises(TeraioError, match=message):
        ds = make(r, tokenizer="bytes", seq_len=4, skip_bad_lines=False)
        it = iter(ds)
        for _ in range(10):
            next(it)
    p = subprocess.run([str(TERAIO), "data", "sample", str(r), "--seq-len", "4", "--count", "10"],
                       capture_output=True, text=True)
    assert p.returncode != 0 and len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_unavailable_without_the_shim_says_why(root, tmp_path):
    code = ("import sys\nfrom teraio.data import StreamingDataset, parquet_available\n"
            "print(parquet_available())\n"
            "try:\n    StreamingDataset(sys.argv[1], seq_len=8)\n"
            "except Exception as e:\n    print('raised:', e)\n"
            "ds = StreamingDataset(sys.argv[2], seq_len=8, logical_shards=2)\n"
            "print('jsonl ok', next(iter(ds))['input_ids'].shape)\n")
    env = dict(os.environ, TERAIO_PARQUET_LIBRARY=str(tmp_path / "missing.so"))
    (tmp_path / "j" / "t").mkdir(parents=True)
    (tmp_path / "j" / "t" / "a.jsonl").write_text('{"text": "hello world"}\n')
    p = subprocess.run([sys.executable, "-c", code, str(root), str(tmp_path / "j")], env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert f"(False, '{tmp_path}/missing.so: no such file (TERAIO_PARQUET_LIBRARY)')" in p.stdout
    assert "raised: ids/part.parquet: Parquet is unavailable: " in p.stdout
    assert "jsonl ok torch.Size([8])" in p.stdout


BOMB_ROWS, BOMB_ROW_BYTES = 20000, 10000   # 200 MB of text in one row group


def bomb_text(d):
    base = "the quick brown fox jumps over the lazy dog " * (BOMB_ROW_BYTES // 44 + 1)
    return (f"{d:08d} " + base)[:BOMB_ROW_BYTES]


def check_bytes_samples(ds, count, text) -> set:
    """`count` samples of a bytes-tokenized dataset with provenance: every span
    is its document's bytes (`text(d)`) and the EOS 0; the documents seen."""
    seen, it = set(), iter(ds)
    for _ in range(count):
        s = next(it)
        toks = torch.cat([s["input_ids"], s["labels"][-1:]]).tolist()
        at = 0
        for _, _, d, off, n, _ in s["provenance"].tolist():
            assert toks[at:at + n] == (list(text(d).encode()) + [0])[off:off + n], d
            at += n
            seen.add(d)
    return seen


def bomb_root(tmp_path, dictionary):
    r = tmp_path / ("dict" if dictionary else "plain")
    (r / "s").mkdir(parents=True)
    rows = [bomb_text(0)] * BOMB_ROWS if dictionary else [bomb_text(d) for d in range(BOMB_ROWS)]
    pq.write_table(pa.table({"text": rows}), r / "s" / "x.parquet", row_group_size=BOMB_ROWS,
                   compression="zstd", use_dictionary=dictionary)
    del rows
    return r


def test_parquet_bomb_costs_a_window_not_the_row_group(tmp_path):
    """Issue 26 item 5: a small file whose one row group holds 200 MB of text.
    Decoding it whole took 1.5 GB of RSS in `teraio data sample`; read a
    slice of rows at a time it takes a window's memory, and every sample is
    the rows' own bytes."""
    r = bomb_root(tmp_path, dictionary=False)
    assert (r / "s" / "x.parquet").stat().st_size < 4 << 20
    wrap = ("import resource, subprocess, sys\n"
            "p = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
            "print(p.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
            "sys.stdout.write(p.stdout + p.stderr)\n")
    p = subprocess.run([sys.executable, "-c", wrap, str(TERAIO), "data", "sample", str(r), "--count", "40",
                        "--seq-len", "64"], capture_output=True, text=True, timeout=300)
    rc, peak_kib = map(int, p.stdout.split("\n", 1)[0].split())
    assert rc == 0, p.stdout
    assert peak_kib < 640 << 10, peak_kib               # was 1.5 GB; 387 MB measured
    ds = StreamingDataset(str(r), seq_len=64, tokenizer="bytes", eos_id=0, provenance=True,
                          logical_shards=4)
    check_bytes_samples(ds, 30, bomb_text)
    # the rows of a slice are named by their own row group and row
    assert ds.locate(0, 0, BOMB_ROWS - 1) == {"path": "s/x.parquet", "format": "Parquet text",
                                              "unit": 0, "row": BOMB_ROWS - 1}


def test_parquet_bomb_whose_footer_understates_it_is_refused_by_name(tmp_path):
    """A dictionary-encoded column declares a few kilobytes for 200 MB of
    text: what the rows really hold is bounded (max(cache_bytes,
    max_line_bytes)), and the error names the file, row group and rows."""
    r = bomb_root(tmp_path, dictionary=True)
    ds = StreamingDataset(str(r), seq_len=64, tokenizer="bytes", eos_id=0, cache_bytes=16 << 20,
                          max_line_bytes=1 << 20)
    with pytest.raises(TeraioError, match=r"s/x.parquet: row group 0, rows 0 to \d+: column 'text' holds "
                                          r"more than 16777216 bytes, the most one window may decode"):
        next(iter(ds))


def test_dictionary_typed_text_column_is_text(tmp_path):
    """A pandas categorical is a dictionary<values=string> column: it was refused
    as 'not a string'; its rows are their values."""
    r = tmp_path / "cat"
    (r / "t").mkdir(parents=True)
    texts = [f"value {d % 3} " * (1 + d % 3) for d in range(12)]
    pq.write_table(pa.table({"text": pa.array(texts).dictionary_encode()}), r / "t" / "b.parquet",
                   row_group_size=5)
    ds = StreamingDataset(str(r), seq_len=16, tokenizer="bytes", provenance=True, logical_shards=2)
    assert check_bytes_samples(ds, 40, texts.__getitem__) == set(range(12))
