"""Two hosts: examples/train.py as a job of two nodes (``torchrun --nnodes 2``, c10d
rendezvous), each node in a network namespace of its own, joined by a veth pair, one
rank per node.  Its checkpoint then resumes on one node of 2 ranks and gives the
two-node job's losses bit for bit.

Slow and needs ``ip netns`` (root or CAP_NET_ADMIN): run by ``make test-slow``, and by
``make test`` when TERAIO_SLOW=1."""
import os
import shutil
import subprocess
import sys

import pytest

from train_job import EXAMPLE, SMALL, metrics, torchrun, write_corpus

SUBNET = "10.213.{}.{}"


def ip(*args):
    return subprocess.run(["ip", *args], capture_output=True, text=True)


@pytest.fixture
def namespaces():
    """Two network namespaces joined by a veth pair: [(name, interface, address)] * 2."""
    if not os.environ.get("TERAIO_SLOW"):
        pytest.skip("opt-in: set TERAIO_SLOW=1 (or run make test-slow) for the two-node job "
                    "in network namespaces")
    if shutil.which("ip") is None:
        pytest.skip("needs ip netns: the ip command (Debian package iproute2) is missing")
    tag, net = os.getpid(), os.getpid() % 250 + 1
    nodes = [(f"tio{tag}n{i}", f"tio{tag}v{i}", SUBNET.format(net, i + 1)) for i in range(2)]
    made = []
    try:
        for name, _, _ in nodes:
            r = ip("netns", "add", name)
            if r.returncode:
                pytest.skip(f"needs ip netns: `ip netns add` was refused ({r.stderr.strip()})")
            made.append(name)
        (n0, v0, a0), (n1, v1, a1) = nodes
        steps = [("link", "add", v0, "type", "veth", "peer", "name", v1),
                 ("link", "set", v0, "netns", n0), ("link", "set", v1, "netns", n1)]
        for name, dev, addr in nodes:
            steps += [("-n", name, "addr", "add", f"{addr}/24", "dev", dev),
                      ("-n", name, "link", "set", dev, "up"), ("-n", name, "link", "set", "lo", "up")]
        for s in steps:
            r = ip(*s)
            assert r.returncode == 0, (s, r.stderr)
        yield nodes
    finally:
        for name in made:
            ip("netns", "delete", name)      # takes its end of the veth pair with it


def node_command(ns, dev, addr, host, endpoint, args, tmp):
    """torchrun of one node inside namespace `ns`.  The rendezvous store's host is named
    (is_host): torchrun would look for the endpoint among the machine's host name's
    addresses, which are not the namespace's.  Gloo binds to the veth (GLOO_SOCKET_IFNAME)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", TMPDIR=str(tmp), GLOO_SOCKET_IFNAME=dev)
    cmd = ["ip", "netns", "exec", ns, sys.executable, "-m", "torch.distributed.run",
           "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
           "--rdzv-endpoint", endpoint, "--rdzv-id", "teraio-two-nodes",
           "--rdzv-conf", f"is_host={int(host)}", "--local-addr", addr, "--max-restarts", "0",
           str(EXAMPLE), *map(str, args)]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_two_nodes_in_network_namespaces(namespaces, tmp_path):
    corpus = tmp_path / "corpus"
    sizes = write_corpus(corpus)
    (tmp_path / "tmp").mkdir()
    common = ["--data", corpus, "--provenance", *SMALL]
    two = tmp_path / "two-nodes"
    endpoint = f"{namespaces[0][2]}:29511"
    procs = [node_command(ns, dev, addr, i == 0, endpoint,
                          ["--out", two, "--steps", 4, "--ckpt-every", 2, *common], tmp_path / "tmp")
             for i, (ns, dev, addr) in enumerate(namespaces)]
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=300))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, (out[-2000:], err[-4000:])
    assert "on 2 ranks (fsdp, gloo)" in "".join(o for o, _ in outs)
    # the two ranks read disjoint samples
    spans = [{tuple(s) for r in metrics(two, rank) for s in r["spans"]} for rank in (0, 1)]
    assert spans[0] and spans[1] and not spans[0] & spans[1]
    assert {s[:3] for s in spans[0] | spans[1]} <= set(sizes)
    # one node, 2 ranks, from the two-node checkpoint of step 2: the same steps 3-4
    one = tmp_path / "one-node"
    torchrun(2, "--out", one, "--steps", 4, "--resume", two / "ckpt" / "step-00000002", *common,
             tmp=tmp_path / "tmp")
    for rank in (0, 1):
        assert [r["loss"] for r in metrics(one, rank)] == [r["loss"] for r in metrics(two, rank)[2:]]
