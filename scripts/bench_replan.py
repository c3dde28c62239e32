"""The re-planner's decisions on synthetic rates: noise never switches, a change does, once.

Two ranks, the 81/19 `cost` plan of tests/unit/test_replan.py's speeds. First +-10% of
uniform jitter on fixed speeds (300 seeds x 100 epochs): how many runs switch at all. Then
one rank turning 4x, 2x, 1.5x or 1.3x slower from epoch 5 (0-based) with +-5% noise: the
plans per epoch, and how many switches.

    PYTHONPATH=. .venv/bin/python scripts/bench_replan.py
"""

from __future__ import annotations

import random

from lbtrain.balancer import plan_batches
from tests.unit.test_replan import SPEEDS, _run


def main() -> None:
    """Print both sweeps."""
    plan = plan_batches(SPEEDS, 100, "cost")
    switched = 0
    for seed in range(300):
        draw = random.Random(seed)
        _, _, replanner = _run(
            plan,
            lambda e: [1.0, 1.0],
            100,
            lambda e, d=draw: [d.uniform(-0.1, 0.1), 0.0 + d.uniform(-0.1, 0.1)],
        )
        switched += replanner.switches > 0
    print(f"+-10% jitter on fixed speeds: {switched} of 300 runs of 100 epochs switched")
    for factor in (4.0, 2.0, 1.5, 1.3):
        draw = random.Random(1)
        plans, _, replanner = _run(
            plan,
            lambda e, f=factor: [1.0, 1.0] if e < 5 else [f, 1.0],
            14,
            lambda e, d=draw: [d.uniform(-0.05, 0.05), d.uniform(-0.05, 0.05)],
        )
        first = next((i for i, p in enumerate(plans) if p != plans[0]), None)
        print(
            f"rank 0 {factor:g}x slower from epoch 5: new plan from epoch {first}, "
            f"{replanner.switches} switch(es): {plans}"
        )


if __name__ == "__main__":
    main()
