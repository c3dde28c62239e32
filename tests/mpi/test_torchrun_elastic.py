"""`lbtrain train --resume auto` under torchrun's elastic agent: a crashed worker or a lost
node costs the steps since the last checkpoint, never the run, and the model comes out the
same.

Three agents (`--nnodes 1:3 --nproc-per-node 1 --max-restarts 2`, one c10d rendezvous on
localhost) train the faulty workload. In epoch 2 rank 1 raises, once: the agents start every
worker again on 3 ranks, and the run continues from its checkpoint. In epoch 3 (found from
the workload's marker file, not a sleep) one agent that does not host the rendezvous store
is killed with its worker (torchrun starts each worker in a session of its own, so the
agent's process group alone would leave it running). The survivors' collectives fail, they
exit 75 ("restart me"), their agents start them again on a world of 2, and the same command
continues from the run's newest checkpoint, re-planned: the job ends with status 0 and the
weights of a 3-rank run that was never stopped (float32: to 1e-5; the lost steps are redone
on the same global batches, split otherwise).

The second test does the same for a user's own loop with `lbtrain.TrainState`: two agents,
one lost, the survivor continues alone from the saved state, float64 to 1e-10.

The agents run with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: torch's default store, shared
across rendezvous rounds, leaves a restarted worker connecting to the lost rank's address
(pytorch#135712; scripts/elastic_probe.py shows it).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from lbtrain.comm import SingleProcessCommunicator, run_ranks
from lbtrain.trainer import TrainConfig, train
from tests.fixtures.faulty_runs import BATCH, FAULTY, final_model
from tests.fixtures.user_loop import loop
from tests.mpi.launch import REPO, SCRIPTS, kill_job, torchrun_command

EPOCHS = 3  # the crash in epoch 2, the loss in epoch 3
# Quick recovery: a lost agent is noticed after 1 s x 3 missed keep-alives, and the
# survivors' new round closes 2 s after they join it (torch's defaults: 15 s and 30 s).
RDZV_CONF = "join_timeout=60,last_call_timeout=2,keep_alive_interval=1,keep_alive_max_attempt=3"
TRAIN = [
    "train", "--workload", FAULTY, "--global-batch", str(BATCH), "--threads", "1",
    "--min-batch", "1", "--replan", "off", "--no-curves", "--epochs", str(EPOCHS),
    "--time-budget", "0.2", "--devices", "cpu", "--lr-schedule", "step",
    "--lr-step-epochs", "1", "--lr-gamma", "0.5", "--resume", "auto", "--checkpoint-every", "1",
]  # fmt: skip


class Agents:
    """torchrun elastic agents on one c10d rendezvous, each in a session of its own, running
    `program` (`["-m", "lbtrain", ...]` or a script and its arguments) on up to `nodes`."""

    def __init__(self, folder: Path, program: list[str], nodes: int = 3) -> None:
        self.folder, self.program, self.nodes = folder, program, nodes
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.processes: dict[str, subprocess.Popen] = {}

    def start(self, name: str, host: bool = False) -> None:
        """Start agent `name`. The `host` agent hosts the rendezvous store; the others wait
        for it to listen, so all can start at once, and they join within the first round's
        last call: the round closes 2 s after the first agent joins."""
        launcher = torchrun_command(1)[:-3]  # without --nproc-per-node 1 --standalone
        command = [
            *launcher, "--nnodes", f"1:{self.nodes}", "--nproc-per-node", "1",
            "--max-restarts", "2", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{self.port}", "--rdzv-id", "elastic",
            "--rdzv-conf", f"{RDZV_CONF},is_host={int(host)}", "--monitor-interval", "0.2",
            *self.program,
        ]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
               "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}  # fmt: skip
        log = (self.folder / f"{name}.log").open("w")
        self.processes[name] = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.folder,
            start_new_session=True,
        )  # fmt: skip

    def wait_for(self, pattern: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not list(self.folder.glob(pattern)):
            ended = [n for n, p in self.processes.items() if p.poll() is not None]
            assert not ended and time.monotonic() < deadline, (
                f"{pattern} never appeared (ended: {ended})\n{self.output()}"
            )
            time.sleep(0.05)

    def kill(self, name: str) -> None:
        """SIGKILL agent `name`, its worker (a session of its own) and all below them."""
        kill_job(self.processes.pop(name).pid)

    def finish(self, timeout: float = 240) -> dict[str, int | None]:
        deadline, codes = time.monotonic() + timeout, {}
        for name, process in self.processes.items():
            try:
                codes[name] = process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                codes[name] = None
        for process in self.processes.values():
            kill_job(process.pid)  # whatever is left, on a failure
        return codes

    def output(self) -> str:
        return "\n".join(
            f"--- {log.name}\n{log.read_text(errors='replace')[-4000:]}"
            for log in sorted(self.folder.glob("*.log"))
        )


def _uninterrupted(out: Path) -> dict[str, torch.Tensor]:
    """The same recipe on 3 in-process ranks, never stopped."""
    config = TrainConfig(
        workload=FAULTY, global_batch=BATCH, threads=1, min_batch=1, replan="off",
        curves=False, epochs=EPOCHS, time_budget=0.2, devices="cpu", lr_schedule="step",
        lr_step_epochs=1, lr_gamma=0.5, quiet=True, out=str(out),
    )  # fmt: skip
    for result in run_ranks(3, lambda comm: train(config, comm).exit_code, timeout=120):
        assert result.error is None and result.value == 0, result.error
    return final_model(out)


def test_a_crashed_worker_then_a_lost_node_cost_steps_never_the_run(tmp_path):
    run, markers = tmp_path / "run", tmp_path / "markers"
    # A process's step 7: in its first start, step 2 of epoch 2, where rank 1 raises (once:
    # only in the agents' first start); started again from the checkpoint of epoch 1, it is
    # step 1 of epoch 3, the last, where one agent is lost. Slower from there, so the kill
    # lands inside the epoch.
    args = [*TRAIN, "--out", str(run), "--fault", "raise-once", "--fault-rank", "1",
            "--fault-step", "7", "--step-sleep", "0.2", "--pid-dir", str(markers)]  # fmt: skip
    agents = Agents(tmp_path, ["-m", "lbtrain", *args])
    with ThreadPoolExecutor(1) as pool:
        try:
            agents.start("A", host=True)
            agents.start("B")
            agents.start("C")
            agents.wait_for("markers/rank-*.pid")  # the first world has formed
            # The run that is never stopped, on in-process ranks, while the agents restart.
            whole = pool.submit(_uninterrupted, tmp_path / "whole")
            agents.wait_for("markers/attempt-1.rank-*")
            killed, killed_at = time.monotonic(), time.time()
            agents.kill("B")
            codes = agents.finish()
            took = time.monotonic() - killed
        finally:
            for process in agents.processes.values():
                kill_job(process.pid)
        theirs = whole.result()
    assert codes == {"A": 0, "C": 0}, agents.output()
    logs = agents.output()
    assert "InjectedFault: injected fault on rank 1 at step 7" in logs, logs
    assert "exitcode: 75" in logs and "world 3 -> 2 ranks at global step 10" in logs, logs
    summary = json.loads((run / "summary.json").read_text(encoding="utf-8"))
    assert summary["worlds"] == [{"ranks": 3, "from_step": 0}, {"ranks": 2, "from_step": 10}]
    assert summary["resumed_from"]["global_step"] == 10, summary["resumed_from"]
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["resumed_at"]["epoch"] for r in records if r["type"] == "start"
            and r["resumed_at"]] == [1, 2]  # fmt: skip
    (change,) = [r for r in records if r["type"] == "world"]
    assert len(change["old_batch_sizes"]) == 3 and len(change["batch_sizes"]) == 2, change
    ours = final_model(run)
    worst = max(float((ours[k] - theirs[k]).abs().max()) for k in ours)
    assert worst <= 1e-5, worst
    # Figures for BENCHMARKS.md (pytest -s shows them): the restart, start to first step.
    print(f"kill -> the new world's start {change['time'] - killed_at:.1f} s, -> the job's end "
          f"{took:.1f} s; weights within {worst:.1e}")  # fmt: skip


def test_a_user_loop_with_a_train_state_continues_on_the_survivor_as_one_process(tmp_path):
    """Issue 40, item 4: docs/library.md's loop with `lbtrain.TrainState`, under two agents.
    One is killed with its worker mid-run (found from the loop's marker); the survivor's
    worker fails in its next collective, its agent starts it again on a world of 1, and it
    continues from the state saved after the last whole step: the weights are one
    process's over the same global batches (float64, to 1e-10)."""
    run = tmp_path / "run"
    run.mkdir()
    agents = Agents(tmp_path, [str(SCRIPTS / "elastic_loop.py"), str(run)], nodes=2)
    try:
        agents.start("A", host=True)
        agents.start("B")
        agents.wait_for("run/first.rank-*")
        agents.kill("B")
        codes = agents.finish()
    finally:
        for process in agents.processes.values():
            kill_job(process.pid)
    assert codes == {"A": 0}, agents.output()
    (start,) = [p.name for p in run.glob("start-*")]  # one restart, on a world of 1
    epoch, step = map(int, start.split(".at-")[1].split("."))
    done = 5 * epoch + step  # 5 steps an epoch, 15 in all
    assert start.startswith("start-1.world-1.") and 3 <= done < 15, start
    # It continued where the state was saved: the restart took only the steps left.
    assert [p.name for p in run.glob("taken-*")] == [f"taken-1.{15 - done}"]
    one = loop(SingleProcessCommunicator(), [1.0], tmp_path / "none.pt")
    ours = torch.load(run / "final.pt", weights_only=True)
    worst = max(float((ours[k] - one[k]).abs().max()) for k in one)
    assert worst <= 1e-10, worst
