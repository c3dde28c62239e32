"""TrainState: a user's own loop saved on 2 ranks continues on 3, exactly (issue 40, item 4).

The loop is the one docs/library.md shows (tests/fixtures/user_loop.py): balanced_loader,
BalancedDataParallel, SGD with momentum (its state must travel). Stopped mid-epoch on 2
ranks with unequal shares and continued on 3 with another plan, it must end on the weights
one process reaches over the same global batches (float64: to 1e-10). In-process ranks.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lbtrain.comm import SingleProcessCommunicator, run_ranks
from lbtrain.comm.local import RankAborted
from tests.fixtures.user_loop import loop


def _ranks(count: int, shares: list[float], path: Path, stop_after: int | None = None) -> list:
    results = run_ranks(count, lambda comm: loop(comm, shares, path, stop_after), timeout=60)
    errors = [result.error for result in results if result.error is not None]
    if errors:  # a rank's own error, not another's RankAborted from the race that follows it
        raise next((e for e in errors if not isinstance(e, RankAborted)), errors[0])
    return [result.value for result in results]


def test_a_loop_saved_on_two_ranks_continues_on_three_as_one_process_trains(tmp_path):
    one = loop(SingleProcessCommunicator(), [1.0], tmp_path / "none.pt")
    path = tmp_path / "state.pt"
    assert _ranks(2, [1.0, 3.0], path, stop_after=7) == [{}, {}]  # epoch 2, its 3rd step next
    saved = torch.load(path, weights_only=False)
    assert (saved["epoch"], saved["step"], saved["world_size"]) == (1, 2, 2)
    for weights in _ranks(3, [1.0, 1.0, 2.0], path):
        assert all(torch.allclose(weights[k], one[k], rtol=0, atol=1e-10) for k in one)
    # The check can fail: restarting the epoch from its first step instead trains otherwise.
    torch.save({**saved, "step": 0}, path)
    again = _ranks(3, [1.0, 1.0, 2.0], path)[0]
    assert not all(torch.allclose(again[k], one[k], rtol=0, atol=1e-10) for k in one)


def test_a_state_of_another_global_batch_is_refused_on_every_rank(tmp_path):
    path = tmp_path / "state.pt"
    assert _ranks(2, [1.0, 1.0], path, stop_after=2) == [{}, {}]
    saved = torch.load(path, weights_only=False)
    torch.save({**saved, "global_batch": 16}, path)
    with pytest.raises(ValueError, match="saved with global batch 16 and seed 3"):
        _ranks(2, [1.0, 1.0], path)
    # Over another dataset the step once landed in another permutation, silently.
    torch.save({**saved, "samples": saved["samples"] - 8}, path)
    with pytest.raises(ValueError, match=r"saved with a dataset of \d+, this loader has \d+"):
        _ranks(2, [1.0, 1.0], path)
    torch.save({**saved, "shuffle": not saved["shuffle"]}, path)
    with pytest.raises(ValueError, match=r"saved with shuffle=(True|False), this loader"):
        _ranks(2, [1.0, 1.0], path)
    path.write_text("not a state")
    with pytest.raises(ValueError, match="cannot be read as a TrainState"):
        loop(SingleProcessCommunicator(), [1.0], path)
