"""Shared fixtures: a tiny Llama-style model and a deterministic training step."""
import os

import pytest
import torch

from teraio.models.llama import Llama, LlamaConfig

TINY = LlamaConfig(dim=64, n_layers=2, n_heads=4, ffn_dim=128, max_seq_len=32)


class TinyJob:
    def __init__(self, seed=0, iterations=6, batch=4):
        torch.manual_seed(seed)
        self.model = Llama(TINY)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3, foreach=False)
        g = torch.Generator().manual_seed(seed + 1)
        self.batches = [torch.randint(0, 256, (batch, TINY.max_seq_len + 1), generator=g)
                        for _ in range(iterations)]

    def step(self, i):
        b = self.batches[i]
        self.opt.zero_grad(set_to_none=False)
        loss = self.model(b[:, :-1], b[:, 1:])
        loss.backward()
        self.opt.step()
        return loss


@pytest.fixture
def tiny_job():
    torch.use_deterministic_algorithms(True)
    return TinyJob()


@pytest.fixture
def reference_losses():
    job = TinyJob()
    return [job.step(i).item() for i in range(len(job.batches))], job


@pytest.fixture
def ssd_dir(tmp_path):
    d = tmp_path / "ssd"
    d.mkdir()
    return str(d)


def pytest_configure(config):
    torch.set_num_threads(1)
    os.environ.setdefault("TERAIO_TEST", "1")


# ---- skip policy -------------------------------------------------------------
# `make test` skips nothing this machine can run.  The only skips allowed are
# tests that need a GPU (no device here), opt-in runs that a variable turns
# on, and the two-node test where network namespaces are refused (it needs
# root or CAP_NET_ADMIN); their reasons start with one of these prefixes.
# Any other skip fails the run, and the summary names the test and its reason.
# A memory cgroup (test_cgroup.py) needs root or a delegated cgroup: its
# skip ("cgroups cannot be made here") is allowed only when not root (CI
# runs as root, so there the test runs).
ALLOWED_SKIP_PREFIXES = ("needs a CUDA device", "needs a GPU", "opt-in:", "needs ip netns")
CGROUP_SKIP_PREFIX = "cgroups cannot be made here"
_forbidden_skips = []


def pytest_runtest_logreport(report):
    if not report.skipped or hasattr(report, "wasxfail"):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    reason = reason.removeprefix("Skipped: ")
    allowed = ALLOWED_SKIP_PREFIXES + ((CGROUP_SKIP_PREFIX,) if os.geteuid() != 0 else ())
    if not reason.startswith(allowed):
        _forbidden_skips.append((report.nodeid, reason))


def pytest_terminal_summary(terminalreporter):
    if _forbidden_skips:
        terminalreporter.section("skips that are not allowed", sep="=", red=True)
        for nodeid, reason in _forbidden_skips:
            terminalreporter.line(f"{nodeid}: {reason}")
        terminalreporter.line("only GPU tests and opt-in runs may skip "
                              f"(reasons starting with {', '.join(ALLOWED_SKIP_PREFIXES)})")


def pytest_sessionfinish(session, exitstatus):
    if _forbidden_skips and session.exitstatus == 0:
        session.exitstatus = 1
