"""Subnormal floats flushed to zero on every thread that computes (lbtrain.denormals)."""

from __future__ import annotations

import json

import pytest
import torch

from lbtrain import SingleProcessCommunicator, flush_denormals
from lbtrain.cli.entry import main
from lbtrain.denormals import flushing_threads
from tests.fixtures.faulty_runs import faulty
from tests.ranks import lbtrain_ranks


def _zeros_on_threads() -> float:
    """The share of a product with a subnormal result (1e-40 in float32) that came out 0,
    split over torch's threads: 1 where every thread flushes, 0 where none does."""
    product = torch.full((1 << 20,), 1e-30, dtype=torch.float32) * 1e-10
    return float((product == 0).float().mean())


@pytest.fixture
def two_threads():
    if not torch.set_flush_denormal(False):
        pytest.skip("this CPU has no flush-to-zero mode (torch.set_flush_denormal)")
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    _zeros_on_threads()  # torch's worker thread exists from here on
    try:
        yield
    finally:
        flush_denormals(False)
        torch.set_num_threads(threads)


def test_the_workers_that_started_before_flush_too_and_stop_again(two_threads):
    assert flush_denormals(False) and _zeros_on_threads() == 0
    # torch's own call reaches this thread alone: half the product stays subnormal.
    torch.set_flush_denormal(True)
    assert flushing_threads() is None and 0 < _zeros_on_threads() < 1
    assert flush_denormals(True) and flushing_threads() is True
    assert _zeros_on_threads() == 1
    assert flush_denormals(False) and flushing_threads() is False
    assert _zeros_on_threads() == 0


@pytest.mark.parametrize("setting", ["--flush-denormals", "--no-flush-denormals"])
def test_lbtrain_train_flushes_on_each_ranks_compute_threads_unless_told_not_to(setting, tmp_path):
    """Read on each rank's training thread, with its two worker threads, as the run ends.
    The ranks are threads started from this one, whose mode they copy: the opposite of the
    setting, so that each outcome is the flag's doing."""
    if not torch.set_flush_denormal(False):
        pytest.skip("this CPU has no flush-to-zero mode (torch.set_flush_denormal)")
    out = tmp_path / "run"
    args = faulty("--epochs", "1", "--threads", "2", setting, "--quiet",
                  "--out", str(out))  # fmt: skip
    torch.set_flush_denormal(setting.startswith("--no-"))
    try:
        job = lbtrain_ranks(2, *args)
    finally:
        flush_denormals(False)
    assert job.codes == [0, 0], job.output()
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert summary["flush_denormals"] == [not setting.startswith("--no-")] * 2


def test_a_run_hands_its_callers_thread_back_as_it_found_it(tmp_path):
    """The mode is the thread's (Python's floats too): `lbtrain train` from a user's process,
    here this one, leaves it as it was, and on torch's workers too."""
    if not torch.set_flush_denormal(False):
        pytest.skip("this CPU has no flush-to-zero mode (torch.set_flush_denormal)")
    args = faulty("--epochs", "1", "--flush-denormals", "--quiet", "--out",
                  str(tmp_path / "run"))  # fmt: skip
    assert flush_denormals(False)
    assert main(args, comm=SingleProcessCommunicator()) == 0
    assert flushing_threads() is False
    summary = json.loads((tmp_path / "run" / "summary.json").read_text(encoding="utf-8"))
    assert summary["flush_denormals"] == [True]  # it was on during the run
