"""`lbtrain profile` and `balance-report` on in-process ranks: one job-wide sync time, and
user errors that stop every rank with one line. The ranks are threads (tests/ranks.py);
tests/mpi/test_profiling_mpi.py keeps what needs real processes (parsing on every rank).
"""

from __future__ import annotations

from pathlib import Path

from lbtrain.profiling import comm_cost, load_profiles
from lbtrain.workloads import toy_workload
from tests.ranks import lbtrain_ranks

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "profiles_3ranks.json"


def _assert_one_line_error(job, *needles):
    assert job.code != 0, job.output()
    assert "Traceback" not in job.stderr, job.stderr
    errors = [line for line in job.stderr.splitlines() if line.startswith("lbtrain: error:")]
    assert len(errors) == 1, job.output()  # reported once, not once per rank
    for needle in needles:
        assert needle in errors[0], (needle, errors[0])


def test_two_ranks_record_the_same_measured_sync_of_the_workloads_gradients(tmp_path):
    output = tmp_path / "p.json"
    job = lbtrain_ranks(
        2, "profile", "-o", str(output), "--workload", "toy", "--devices", "cpu",
        "--threads", "1", "--time-budget", "1", "--batch-sizes", "8,16", "--repeats", "3",
    )  # fmt: skip
    assert job.codes == [0, 0], job.output()
    profiles = load_profiles(output, world_size=2)
    model = toy_workload().build_model()
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    syncs = {(p.sync_time, p.sync_bytes, p.sync_ranks) for p in profiles}
    assert len(syncs) == 1, syncs  # one job-wide figure, not each rank's own
    ((seconds, measured_bytes, ranks),) = syncs
    assert (measured_bytes, ranks) == (nbytes, 2)
    assert seconds is not None and seconds > 0
    cost = comm_cost(profiles)
    assert cost is not None and (cost.seconds, cost.world_size) == (seconds, 2)


def test_slowdown_list_of_the_wrong_length_stops_all_three_ranks(tmp_path):
    output = tmp_path / "p.json"
    job = lbtrain_ranks(3, "profile", "-o", str(output), "--emulate-slowdown", "1,2")
    _assert_one_line_error(job, "--emulate-slowdown", "2 factors", "3 ranks")
    assert job.codes == [2, 2, 2] and not output.exists()


def test_a_bad_device_on_one_rank_only_stops_the_other_rank_too(tmp_path):
    # Rank 0 is happy with the CPU; rank 1 asks for a GPU this machine lacks (or has fewer of).
    job = lbtrain_ranks(2, "profile", "-o", str(tmp_path / "p.json"), "--devices", "cpu,cuda:7")
    _assert_one_line_error(job, "rank 1:", "cuda:7", "--devices")
    assert job.codes == [2, 2]


def test_an_output_that_cannot_be_written_is_one_line_naming_the_option(tmp_path):
    # /proc takes no new files: refused up front, or (as root, for whom every folder looks
    # writable) when rank 0 writes after profiling; one line and every rank stops either way.
    target = "/proc/lbtrain-no-such-profiles.json"
    job = lbtrain_ranks(
        2, "profile", "-o", target, "--workload", "toy", "--threads", "1", "--time-budget", "0.5"
    )
    _assert_one_line_error(job, f"--output '{target}'")
    assert job.codes == [2, 2]


def test_profile_file_from_another_world_size():
    job = lbtrain_ranks(2, "balance-report", "--profiles", str(FIXTURE))
    _assert_one_line_error(job, "recorded with 3 ranks but this run has 2", "mpiexec -n 2")
    assert job.codes == [2, 2]
