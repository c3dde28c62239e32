"""Profiling under mpiexec: one job-wide sync time, and user errors stopping every rank once."""

from __future__ import annotations

from pathlib import Path

import pytest

from lbtrain.profiling import comm_cost, load_profiles
from lbtrain.workloads import toy_workload
from tests.mpi.launch import run_mpi

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "profiles_3ranks.json"


def _assert_one_line_error(result, *needles):
    assert result.returncode != 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("lbtrain: error:")]
    assert len(errors) == 1, result.stderr  # reported once, not once per rank
    for needle in needles:
        assert needle in errors[0], (needle, errors[0])


def test_two_ranks_record_the_same_measured_sync_of_the_workloads_gradients(tmp_path):
    output = tmp_path / "p.json"
    result = run_mpi(
        "lbtrain",
        2,
        "profile",
        "-o",
        str(output),
        "--workload",
        "toy",
        "--devices",
        "cpu",
        "--time-budget",
        "1",
        "--batch-sizes",
        "8,16",
        "--repeats",
        "3",
        module=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    profiles = load_profiles(output, world_size=2)
    model = toy_workload().build_model()
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    syncs = {(p.sync_time, p.sync_bytes, p.sync_ranks) for p in profiles}
    assert len(syncs) == 1, syncs  # one job-wide figure, not each rank's own
    ((seconds, measured_bytes, ranks),) = syncs
    assert (measured_bytes, ranks) == (nbytes, 2)
    assert seconds is not None and seconds > 0  # real messages between two processes
    cost = comm_cost(profiles)
    assert cost is not None and (cost.seconds, cost.world_size) == (seconds, 2)


def test_slowdown_list_of_the_wrong_length_stops_all_three_ranks(tmp_path):
    output = tmp_path / "p.json"
    result = run_mpi(
        "lbtrain",
        3,
        "profile",
        "-o",
        str(output),
        "--emulate-slowdown",
        "1,2",
        module=True,
        timeout=120,
    )
    _assert_one_line_error(result, "--emulate-slowdown", "2 factors", "3 ranks")
    assert not output.exists()


def test_a_bad_device_on_one_rank_only_stops_the_other_rank_too(tmp_path):
    # Rank 0 is happy with the CPU; rank 1 asks for a GPU this machine lacks (or has fewer of).
    result = run_mpi(
        "lbtrain",
        2,
        "profile",
        "-o",
        str(tmp_path / "p.json"),
        "--devices",
        "cpu,cuda:7",
        module=True,
        timeout=120,
    )
    _assert_one_line_error(result, "rank 1:", "cuda:7", "--devices")


def test_an_output_that_cannot_be_written_is_one_line_naming_the_option(tmp_path):
    # /proc takes no new files: refused up front, or (as root, for whom every folder looks
    # writable) when rank 0 writes after profiling; one line and every rank stops either way.
    target = "/proc/lbtrain-no-such-profiles.json"
    result = run_mpi(
        "lbtrain", 2, "profile", "-o", target, "--workload", "toy", "--threads", "1",
        "--time-budget", "0.5", module=True, timeout=120,
    )  # fmt: skip
    _assert_one_line_error(result, f"--output '{target}'")


@pytest.mark.parametrize("ranks", [2])
def test_profile_file_from_another_world_size(ranks):
    result = run_mpi(
        "lbtrain",
        ranks,
        "balance-report",
        "--profiles",
        str(FIXTURE),
        module=True,
        timeout=120,
    )
    _assert_one_line_error(result, "recorded with 3 ranks but this run has 2", "mpiexec -n 2")


def test_a_command_line_mistake_is_reported_once_not_per_rank():
    result = run_mpi(
        "lbtrain", 3, "balance-report", "--global-batch", "0", module=True, timeout=120
    )
    assert result.returncode != 0
    assert result.stderr.count("error: argument --global-batch: 0 must be >= 1") == 1
    assert result.stderr.count("usage: lbtrain balance-report") == 1
