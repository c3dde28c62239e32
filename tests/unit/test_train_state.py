"""TrainState: a user's own loop saved on 2 ranks continues on 3, exactly (issue 40, item 4).

The loop is the one docs/library.md shows: balanced_loader, BalancedDataParallel, SGD with
momentum (its state must travel). Stopped mid-epoch on 2 ranks with unequal shares and
continued on 3 with another plan, it must end on the weights one process reaches over the
same global batches (float64: to 1e-10). In-process ranks.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from lbtrain import BalancedDataParallel, TrainState, balanced_loader
from lbtrain.comm import SingleProcessCommunicator, run_ranks
from lbtrain.comm.local import RankAborted

EPOCHS, BATCH, SEED = 3, 12, 3
generator = torch.Generator().manual_seed(0)
DATA = TensorDataset(
    torch.randn(60, 5, generator=generator, dtype=torch.float64),
    torch.randint(0, 3, (60,), generator=generator),
)


def loop(comm, shares: list[float], path: Path, stop_after: int | None = None) -> dict:
    """docs/library.md's loop with a TrainState; saves and returns after `stop_after` steps."""
    torch.manual_seed(0)
    model = nn.Linear(5, 3).double()
    loader = balanced_loader(shares, DATA, global_batch_size=BATCH, rank=comm.rank, seed=SEED)
    wrapped = BalancedDataParallel(model, comm, loader)
    optimizer = torch.optim.SGD(wrapped.parameters(), lr=0.1, momentum=0.9)
    state = TrainState(model, optimizer, loader, comm)
    taken = 0
    for epoch in range(state.restore(path), EPOCHS):
        loader.set_epoch(epoch)
        for inputs, targets in loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(wrapped(inputs), targets).backward()
            optimizer.step()
            taken += 1
            if taken == stop_after:
                state.save(path)
                return {}
    return {k: v.clone() for k, v in model.state_dict().items()}


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
    path.write_text("not a state")
    with pytest.raises(ValueError, match="cannot be read as a TrainState"):
        loop(SingleProcessCommunicator(), [1.0], path)
