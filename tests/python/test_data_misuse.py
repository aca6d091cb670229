"""teraio.data.StreamingDataset used as careless users do (issue 12): from two threads,
after close(), with integers that do not fit the C fields and absurd weights, with
prefetch=2**31.  Each test is named after the bug it pins; the ones that crashed the
process run their reproducer in a child process, so a regression fails the test
instead of killing pytest."""
import json
import subprocess
import sys
import threading
import textwrap

import pytest

from teraio.data import StreamingDataset


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    r = tmp_path_factory.mktemp("misuse")
    for sub, n in [("a", 300), ("b", 200)]:
        (r / sub).mkdir()
        (r / sub / "x.jsonl").write_text(
            "".join(json.dumps({"text": f"{sub} document {d} " + "x" * (d % 37)}) + "\n"
                    for d in range(n)))
    return r


def run_child(code, root):
    """Run `code` in a fresh interpreter with ROOT set; (returncode, stdout+stderr)."""
    src = "import sys\nROOT = sys.argv[1]\nfrom teraio.data import StreamingDataset\n" + \
        textwrap.dedent(code)
    p = subprocess.run([sys.executable, "-c", src, str(root)], capture_output=True, text=True,
                       timeout=300)
    return p.returncode, p.stdout + p.stderr


def spans_of(sample):
    return [tuple(s) for s in sample["provenance"].tolist()]


def test_next_from_two_threads_delivers_each_sample_once(root):
    # Bug: 1-17 of 10,000 samples were delivered twice and as many never.  The wrapper
    # is thread-safe (a lock): the two threads' samples together are the stream.
    kw = dict(seq_len=16, logical_shards=8, seed=3, provenance=True, prefetch=4)
    ref = StreamingDataset(root, **kw)
    it = iter(ref)
    want = sorted(s for _ in range(4000) for s in spans_of(next(it)))
    ref.close()
    ds = StreamingDataset(root, **kw)
    it = iter(ds)
    got = [[], []]

    def take(k):
        for _ in range(2000):
            got[k].extend(spans_of(next(it)))

    threads = [threading.Thread(target=take, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got[0] + got[1]) == want
    ds.close()


@pytest.mark.parametrize("method", ["next", "iter", "state_dict", "position", "save",
                                    "load_state_dict", "resume"])
def test_every_method_after_close_raises(root, tmp_path, method):
    # Bug: next, iter, state_dict, position, save after close() segfaulted.
    code = f"""
    ds = StreamingDataset(ROOT, seq_len=8, logical_shards=4)
    state = ds.state_dict()
    ds.save({str(tmp_path)!r})
    ds.close()
    calls = {{"next": lambda: next(ds), "iter": lambda: iter(ds), "state_dict": ds.state_dict,
             "position": ds.position, "save": lambda: ds.save({str(tmp_path)!r}),
             "load_state_dict": lambda: ds.load_state_dict(state),
             "resume": lambda: ds.resume({str(tmp_path)!r})}}
    try:
        calls[{method!r}]()
    except RuntimeError as e:
        print("raised:", e)
    ds.close()   # a second close is fine
    """
    rc, out = run_child(code, root)
    assert rc == 0, out
    assert "raised: StreamingDataset is closed" in out


def test_prefetch_2pow31_raises(root):
    # Bug: StreamingDataset(prefetch=2**31) segfaulted in tio_loader_destroy.
    rc, out = run_child("""
    try:
        StreamingDataset(ROOT, seq_len=8, logical_shards=4, prefetch=2**31)
    except Exception as e:
        print("raised:", type(e).__name__, e)
    """, root)
    assert rc == 0, out
    assert "raised: TeraioError prefetch (2147483648 samples) must be at most 65536" in out


@pytest.mark.parametrize("kw, message", [
    (dict(seq_len=2**32 + 16), r"seq_len must be an integer in \[1, 4294967293\], got 4294967312"),
    (dict(seq_len=8, rank=-1, world_size=2), r"rank must be an integer in \[0, 1\], got -1"),
    (dict(seq_len=8, world_size=2**32 + 1), r"world_size must be an integer in \[1, 4294967295\]"),
    (dict(seq_len=8, seed=-5), r"seed must be an integer in \[0, 18446744073709551615\]"),
    (dict(seq_len=8, eos_id=2**32), r"eos_id must be an integer"),
    (dict(seq_len=8, bos_id=-1), r"bos_id must be an integer"),
    (dict(seq_len=8, shuffle_buffer=2**40), r"shuffle_buffer must be an integer"),
    (dict(seq_len=8, logical_shards=2**33), r"logical_shards must be an integer"),
    (dict(seq_len=8, tokenizer_threads=-1), r"tokenizer_threads must be an integer"),
    (dict(seq_len=8, fill_threads=2**32), r"fill_threads must be an integer"),
    (dict(seq_len=8.5), r"seq_len must be an integer, got 8.5"),
    (dict(seq_len=8, max_line_bytes=0), r"max_line_bytes must be an integer in \[1, "),
    (dict(seq_len=8, weights={"a": 1e308}), r"weight of 'a' is 1e\+308: it must be a number from 0 to 1e300"),
    (dict(seq_len=8, weights={"a": float("nan")}), r"weight of 'a' is nan"),
    (dict(seq_len=8, weights={"a": -1}), r"weight of 'a' is -1"),
])
def test_integers_out_of_range_refused_not_wrapped(root, kw, message):
    # Bug: seq_len=2**32+16 became 16 in C while ds.seq_len said 4294967312; rank -1 and
    # world_size=2**32+1 wrapped likewise; weights of 1e308 got the wrong message.
    with pytest.raises(ValueError, match=message):
        StreamingDataset(root, logical_shards=kw.pop("logical_shards", 4), **kw)


def test_line_longer_than_max_line_bytes_names_file_and_line(tmp_path):
    # Issue 12, item 11: the limit is configurable from Python too.
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "x.jsonl").write_text('{"text": "ok"}\n\n{"text": "' + "y" * 300 + '"}\n')
    with pytest.raises(Exception, match=r"t/x.jsonl: line 3 is longer than the limit of 100 bytes"):
        StreamingDataset(tmp_path, seq_len=8, logical_shards=2, max_line_bytes=100)
    ds = StreamingDataset(tmp_path, seq_len=8, logical_shards=2, max_line_bytes=1000, cache_bytes=1)
    assert next(iter(ds))["input_ids"].shape == (8,)
