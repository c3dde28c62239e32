"""The library takes numpy scalars wherever it takes Python numbers, and names wrong types."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

from lbtrain import SingleProcessCommunicator, balanced_loader, plan_batches, sync_gradients
from lbtrain.balancer import BalancePlan, ReplicaSpeed
from lbtrain.data import BalancedBatchSampler
from lbtrain.profiling import load_profiles

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "profiles_3ranks.json"


def dataset(n: int = 40) -> TensorDataset:
    return TensorDataset(torch.arange(n, dtype=torch.float32), torch.arange(n))


def test_numpy_scalars_work_as_batch_sizes_ranks_caps_and_speeds():
    speeds = [np.float32(100.0), np.float64(300.0)]
    plan = plan_batches(speeds, np.int64(8), "proportional", caps=[None, np.int32(5)])
    assert plan.batch_sizes == (3, 5)  # the numpy cap binds
    assert all(type(b) is int for b in plan.batch_sizes)
    json.loads(plan.to_json())  # numpy values would not serialise
    speed = ReplicaSpeed(np.float32(10.0), alpha=np.float64(0.01), cap=np.int64(7))
    assert type(speed.throughput) is float and type(speed.cap) is int
    loader = balanced_loader(speeds, dataset(), global_batch_size=np.int64(8),
                             rank=np.int64(1), seed=np.int64(3))  # fmt: skip
    assert loader.batch_sampler.rank == 1
    assert sum(len(y) for _, y in loader) > 0
    sizes = BalancePlan("equal", np.int64(4), (np.int64(2), np.int64(2)), (1.0, 1.0))
    assert sizes.batch_sizes == (2, 2) and type(sizes.global_batch_size) is int


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: plan_batches([1.0, 2.0], True), "global_batch_size"),
        (lambda: plan_batches([1.0, 2.0], 8.0), "global_batch_size"),
        (lambda: plan_batches([1.0, 2.0], "8"), "global_batch_size"),
        (lambda: plan_batches([1.0, 2.0], 8, min_batch=1.5), "min_batch"),
        (lambda: plan_batches(None, 8), "ranks"),
        (lambda: plan_batches("12", 8), "ranks"),
        (lambda: plan_batches([1.0, 2.0], 8, caps=[4, 2.5]), r"caps\[1\]"),
        (lambda: plan_batches([1.0, 2.0], 8, caps=7), "caps"),
        (lambda: BalancedBatchSampler(10, plan_batches([1.0, 2.0], 4), rank=1.0), "rank"),
        (lambda: BalancedBatchSampler(10, plan_batches([1.0, 2.0], 4), rank=True), "rank"),
        (
            lambda: balanced_loader([1.0, 2.0], dataset(), global_batch_size=8, rank=0, seed="1"),
            "seed",
        ),  # fmt: skip
        # A string is true to Python: "no" would shuffle, "False" drop the short batch.
        (
            lambda: balanced_loader([1.0], dataset(), global_batch_size=8, rank=0, shuffle="no"),
            "shuffle",
        ),
        (
            lambda: balanced_loader(
                [1.0], dataset(), global_batch_size=8, rank=0, drop_last="False"
            ),
            "drop_last",
        ),
        (
            lambda: balanced_loader([1.0], dataset(), global_batch_size=8, rank=0).set_epoch(1.7),
            "epoch",
        ),
        (lambda: ReplicaSpeed("10"), "throughput"),
        (lambda: ReplicaSpeed(10.0, alpha=None), "alpha"),
        (lambda: ReplicaSpeed(10.0, cap=True), "cap"),
        (lambda: ReplicaSpeed(10.0, cap=2.5), "cap"),
        (lambda: sync_gradients("model", 1.0, SingleProcessCommunicator()), "model"),
        (lambda: load_profiles(FIXTURE, world_size=True), "world_size"),
        (lambda: load_profiles(None), "path"),
    ],
)
def test_wrong_types_raise_a_type_error_naming_the_parameter(call, name):
    with pytest.raises(TypeError, match=rf"^{name}="):
        call()


def test_an_iterable_dataset_is_named_even_with_a_length():
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            yield from range(4)

        def __len__(self) -> int:
            return 4

    with pytest.raises(TypeError, match="dataset of type Stream is an IterableDataset"):
        balanced_loader([1.0], Stream(), global_batch_size=2, rank=0)
    # numpy's bool passes where bool does.
    balanced_loader([1.0], dataset(), global_batch_size=8, rank=0, shuffle=np.bool_(False))


def test_a_generator_of_speeds_is_read_once_like_a_list():
    plan = plan_batches((s for s in [100.0, 300.0]), 8, "proportional")
    assert plan.batch_sizes == (2, 6)


def test_a_numpy_rank_out_of_range_names_the_real_range():
    with pytest.raises(
        ValueError, match=r"Invalid rank 2, rank should be in the interval \[0, 1\]"
    ):
        BalancedBatchSampler(10, plan_batches([1.0, 2.0], 4), rank=np.int64(2))
