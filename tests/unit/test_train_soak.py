"""A long run of short epochs holds steady: checkpoints and memory do not grow with epochs.

Per-epoch records stream to metrics.jsonl; a checkpoint keeps only what resuming needs (the
re-planner's window, running totals), so its size and rank 0's resident memory stay flat.
Before, the epoch history lived in memory and in every checkpoint: about 9.5 KB of RSS per
epoch, and a checkpoint of 56 MB at 40,000 epochs.
"""

from __future__ import annotations

import os
from pathlib import Path

from lbtrain.comm import run_ranks
from lbtrain.trainer import Callback, TrainConfig, train
from lbtrain.trainer.checkpoint import list_checkpoints
from tests.fixtures.faulty_runs import FAULTY
from tests.fixtures.run_files import epoch_records

EPOCHS = 800


def _rss_kib() -> int:
    """This process's resident set size now (not its peak), in KiB."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") // 1024


class Watch(Callback):
    """Rank 0 notes its RSS and its newest checkpoint's size at some epochs."""

    order = 70  # after the checkpoint of the epoch

    def __init__(self, folder: Path, at: tuple[int, ...]) -> None:
        self.folder, self.at, self.seen = folder, at, {}

    def on_epoch_end(self, engine, record) -> None:
        if engine.comm.rank == 0 and engine.state.epoch in self.at:
            newest = list_checkpoints(self.folder / "checkpoints")[-1]
            self.seen[engine.state.epoch] = (_rss_kib(), newest.stat().st_size)


def _plan(folder: Path) -> Path:
    from lbtrain.balancer import plan_batches

    path = folder / "plan.json"
    path.write_text(plan_batches([1.0, 3.0], 200, "proportional").to_json())
    return path


def test_checkpoint_size_and_rss_stay_flat_over_many_short_epochs(tmp_path):
    watch = Watch(tmp_path / "run", at=(400, EPOCHS))
    config = TrainConfig(
        workload=FAULTY, global_batch=200, threads=1, min_batch=1, epochs=EPOCHS,
        lr_schedule="constant", lr=1e-3, replan="auto", quiet=True, checkpoint_every=100,
        curves=False,
        plan=str(_plan(tmp_path)),
        out=str(tmp_path / "run"), eval_every=0,
    )  # fmt: skip
    results = run_ranks(
        2, lambda comm: train(config, comm, callbacks=[watch] if comm.rank == 0 else []),
        timeout=300,
    )  # fmt: skip
    for result in results:
        if result.error is not None:
            raise result.error
    (rss_a, size_a), (rss_b, size_b) = watch.seen[400], watch.seen[EPOCHS]
    assert len(epoch_records(tmp_path / "run")) == EPOCHS  # every epoch is on file
    # Flat: the re-planner's window (at most 8 epochs of per-rank figures, a few KB) is all
    # that may differ; the old history added about 1.4 KB per epoch, 560 KB over these 400.
    assert abs(size_b - size_a) < 8192, (size_a, size_b)
    # 400 epochs at the old 9.5 KB each would be 3.8 MB; allow 2 MB of allocator noise.
    assert rss_b - rss_a < 2048, (rss_a, rss_b)
