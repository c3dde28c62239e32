"""The `lbtrain` command run the way a user runs it: as a program, alone or under mpiexec."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.mpi.launch import lbtrain_command, mpiexec_path

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "profiles_3ranks.json"
GPU_CPU = ROOT / "tests" / "fixtures" / "profiles_gpu_cpu.json"


def _run(command: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        command, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env
    )


def test_env_prints_versions_and_world():
    result = _run([*lbtrain_command(), "env"])
    assert result.returncode == 0, result.stderr
    for needle in ("torch:", "mpi4py:", "MPI library:", "world size:", "rank 0:"):
        assert needle in result.stdout, needle


def test_profile_under_mpiexec_writes_one_record_per_rank(tmp_path):
    output = tmp_path / "profiles.json"
    result = _run(
        [
            mpiexec_path(),
            "-n",
            "2",
            *lbtrain_command(),
            "profile",
            "--time-budget",
            "1",
            "--workload",
            "toy",
            "--batch-sizes",
            "16,32,64",
            "--repeats",
            "3",
            "--output",
            str(output),
        ],
        timeout=180,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads(output.read_text())
    assert data["world_size"] == 2
    assert [p["rank"] for p in data["profiles"]] == [0, 1]
    # Two ranks on this node share its cores (lbtrain.devices.default_threads).
    cores = len(os.sched_getaffinity(0))
    for profile in data["profiles"]:
        assert profile["threads"] == max(1, cores // 2)
        assert profile["reference_batch"] == data["profiles"][0]["reference_batch"]
        assert profile["alpha"] >= 0 and profile["beta"] > 0
    assert "wrote 2 profiles" in result.stdout


def test_a_reader_that_leaves_ends_the_command_quietly():
    """`lbtrain ... | head`: the pipe closes before the output is written."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    command = [*lbtrain_command(), "balance-report", "--profiles", str(FIXTURE),
               "--global-batch", "300", "--format", "json"]  # fmt: skip
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env
    )
    process.stdout.close()  # the reader is gone before lbtrain has written a byte
    _, stderr = process.communicate(timeout=120)
    assert stderr == ""  # no traceback, no "error: [Errno 32] Broken pipe"
    assert process.returncode == 141  # as a shell reports `yes | head`


def test_a_short_training_runs_through_every_documented_way_in(tmp_path):
    """`lbtrain` and `python -m lbtrain` (docs/cli.md) each train and end with status 0 and
    the run's summary: a third way in, `python -m lbtrain.cli.main`, once trained and then
    failed with a NameError, its `__main__` guard above the helpers it calls at the end, and
    is gone (issue 39). The ways start together, so the test takes about one run's time."""
    import sys
    from concurrent.futures import ThreadPoolExecutor

    train = ["train", "--workload", "tests.fixtures.faulty:plugin", "--global-batch", "40",
             "--threads", "1", "--time-budget", "0.3", "--quiet", "--epochs", "1",
             "--no-curves", "--devices", "cpu"]  # fmt: skip
    ways = {
        "lbtrain": lbtrain_command(),
        "python -m lbtrain": [sys.executable, "-m", "lbtrain"],
    }
    folders = {way: tmp_path / way.replace(" ", "_") for way in ways}
    with ThreadPoolExecutor(len(ways)) as pool:
        runs = {
            way: pool.submit(_run, [*command, *train, "--out", str(folders[way])])
            for way, command in ways.items()
        }
        results = {way: run.result() for way, run in runs.items()}
    for way, result in results.items():
        assert result.returncode == 0, (way, result.stderr[-2000:])
        summary = json.loads((folders[way] / "summary.json").read_text())
        assert summary["epochs_run"] == 1, way
