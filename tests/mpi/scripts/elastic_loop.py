"""A user's own loop under torchrun's elastic agent, continued by `lbtrain.TrainState`.

    torchrun --nnodes 1:2 ... tests/mpi/scripts/elastic_loop.py FOLDER

The loop of tests/fixtures/user_loop.py (float64) on shares 1, 2, ... (any plan is exact),
its TrainState saved to FOLDER/state.pt after every step. In the agents' first start each
rank leaves FOLDER/first.rank-R after its third step and then sleeps 0.3 s a step, so that
a kill lands mid-run. A later start leaves FOLDER/start-N.world-W.at-E.S: its restart
count, its world size and the epoch and step it continued from. Rank 0 of the start that
finishes saves the weights to FOLDER/final.pt and leaves FOLDER/taken-N.T: the steps that
start took.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch

from lbtrain import world_communicator
from tests.fixtures.user_loop import loop


def main() -> None:
    folder = Path(sys.argv[1])
    path = folder / "state.pt"
    comm = world_communicator()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if attempt and comm.rank == 0:
        saved = torch.load(path, weights_only=False) if path.exists() else {"epoch": 0, "step": 0}
        (folder / f"start-{attempt}.world-{comm.size}.at-{saved['epoch']}.{saved['step']}").touch()

    taken = [0]

    def after_step(steps: int) -> None:
        taken[0] = steps
        if attempt == 0 and steps == 3:
            (folder / f"first.rank-{comm.rank}").touch()
        if attempt == 0 and steps >= 3:
            time.sleep(0.3)

    weights = loop(comm, [1.0 + r for r in range(comm.size)], path, after_step=after_step)
    if comm.rank == 0:
        torch.save(weights, folder / "final.pt")
        (folder / f"taken-{attempt}.{taken[0]}").touch()
    comm.close()


if __name__ == "__main__":
    main()
