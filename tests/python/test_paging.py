"""compile.paging: Inductor's wrapper paged statement by statement.

On a wrapper written like Inductor's (straight-line ``call(self, args)``,
``empty_strided`` buffers, kernels called with the tensors they touch,
aliases, ``del``s): a call goes before each statement that touches tensor
memory, naming exactly the local tensors it names (not an attribute such as
``extern_kernels.bmm``, not a name deleted before); under a pager of two
tensors' capacity the code evicts and brings back, and returns what the
plain code returns; code it does not follow is not paged, and says why.
"""
import types

import torch

from teraio.core import Engine
from teraio.torch.compile.paging import PagedCode
from teraio.torch.pager import Pager

N = 1024  # floats per tensor: 4 KiB

SOURCE = '''
import torch

def empty_strided(size, stride, dtype):
    return torch.empty_strided(size, stride, dtype=dtype)

def kern(a, b, out):
    torch.add(a, b, out=out)

class extern_kernels:
    @staticmethod
    def mul(a, b, out):
        torch.mul(a, b, out=out)

class Runner:
    def __init__(self, partitions):
        self.partitions = partitions

    def call(self, args):
        x, w = args
        args.clear()
        buf0 = empty_strided((N,), (1,), torch.float32)
        # Topologically Sorted Source Nodes: [add], Original ATen: [aten.add]
        kern(x, w, buf0)
        buf1 = empty_strided((N,), (1,), torch.float32)
        extern_kernels.mul(buf0, w, out=buf1)
        del buf0
        buf2 = empty_strided((N,), (1,), torch.float32)
        kern(buf1, x, buf2)
        mul = buf2; del buf2  # reuse
        del x
        # Topologically Sorted Source Nodes: [mul_1], Original ATen: [aten.mul]
        extern_kernels.mul(mul, w, out=mul)
        return (mul, buf1, )

runner = Runner(partitions=[])
call = runner.call
'''.replace("(N,)", f"({N},)")


def _code(source: str):
    mod = types.ModuleType("plain")
    exec(compile(source, "<plain>", "exec"), mod.__dict__)
    plain = types.SimpleNamespace(source_code=source, current_callable=mod.call)
    info = types.SimpleNamespace(gid=0, key="test", n_kernels=3,
                                 kernel_nodes=[types.SimpleNamespace(name=n) for n in ("add", "mul", "mul_1")])
    return plain, info


def _inputs():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(N, generator=g), torch.randn(N, generator=g)]


def test_the_paged_wrapper_moves_tensors_and_computes_the_same(tmp_path):
    plain, info = _code(SOURCE)
    paged = PagedCode(info, plain)
    assert paged.call is not None, paged.why
    # four kernels and three allocations; no call before the aliases, dels, args or the return
    assert len(paged.alloc) == 7 and paged.alloc.count(N * 4) == 3
    want = plain.current_callable(_inputs())
    engine = Engine([str(tmp_path)], 64 << 20)
    pager = Pager(engine, 3 * N * 4)
    try:
        x, w = _inputs()
        for t in (x, w):
            pager.track(t.untyped_storage())
        paged.start(pager)
        got = paged.call([x, w])
        times = paged.finish()
        stats = pager.stats()
        assert stats["evictions"] > 0 and stats["fetches"] > 0
        assert stats["over_capacity_kernels"] == 0
        pager.fetch_all()
        assert all(torch.equal(a, b) for a, b in zip(want, got))
        assert len(times) == 3 and all(t >= 0 for t in times)
    finally:
        pager.close()
        engine.close()


def test_names_are_the_statements_own_locals():
    plain, info = _code(SOURCE)
    paged = PagedCode(info, plain)
    text = paged.source
    points = [line.strip() for line in text.splitlines() if "_teraio_point" in line]
    assert "_teraio_point(1, (x, w, buf0, ))" in points
    assert "_teraio_point(3, (buf0, w, buf1, ))" in points   # not extern_kernels or mul
    assert "_teraio_point(6, (mul, w, ))" in points          # mul is a local here, an attribute too
    # the commented kernels carry their graph nodes; the fused one between them the one between
    assert paged.nodes[1] == [0] and paged.nodes[6] == [2]


def test_code_it_does_not_follow_is_not_paged():
    nested = SOURCE.replace("        args.clear()\n", "        args.clear()\n        if x is None:\n            x = w\n")
    plain, info = _code(nested)
    paged = PagedCode(info, plain)
    assert paged.call is None and "nested" in paged.why
    plain, info = _code(SOURCE)
    plain.current_callable = lambda args: None   # wrapped: not Inductor's call
    assert PagedCode(info, plain).call is None
