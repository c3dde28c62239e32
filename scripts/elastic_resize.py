"""Growth of `lbtrain train --resume auto` under torchrun's elastic agent, two ways.

Planned (the default): three agents train the faulty workload; in epoch 2 (the workload's
marker file) each agent gets SIGTERM, as a planned stop does: the workers checkpoint where
they are and stop. Four agents then run the same command: it continues from that
checkpoint on 4 ranks. Live (`--live`): three agents of `--nnodes 1:4` train, and in epoch 2
a fourth joins; the agents stop their workers (SIGTERM: a checkpoint) and start them again
on 4 ranks. Either way the final weights are compared with a 3-rank in-process run that was
never stopped.

    PYTHONPATH=. .venv/bin/python scripts/elastic_resize.py /tmp/resize [--live]
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from lbtrain.comm import run_ranks  # noqa: E402
from lbtrain.trainer import TrainConfig, train  # noqa: E402
from tests.fixtures.faulty_runs import final_model  # noqa: E402

RDZV_CONF = "join_timeout=60,last_call_timeout=2,keep_alive_interval=1,keep_alive_max_attempt=3"
RECIPE = dict(global_batch=40, threads=1, min_batch=1, replan="off", curves=False, epochs=4,
              time_budget=0.2, devices="cpu", lr_schedule="step", lr_step_epochs=1,
              lr_gamma=0.5)  # fmt: skip


def _arguments(root: Path) -> list[str]:
    return [
        "train", "--workload", "tests.fixtures.faulty:plugin", "--global-batch", "40",
        "--threads", "1", "--min-batch", "1", "--resume", "auto", "--out", str(root / "run"),
        "--replan", "off", "--no-curves", "--epochs", "4", "--time-budget", "0.2",
        "--devices", "cpu", "--lr-schedule", "step", "--lr-step-epochs", "1", "--lr-gamma",
        "0.5", "--fault-step", "7", "--step-sleep", "0.2", "--pid-dir", str(root / "pids"),
    ]  # fmt: skip


def _world(
    root: Path, agents: int, tag: str, nodes: int | None = None, port: int | None = None
) -> list[subprocess.Popen]:
    """`agents` torchrun agents of `--nnodes 1:nodes` on one c10d rendezvous at `port` (a
    free one: the first agent hosts its store)."""
    nodes = nodes or agents
    if port is None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
           "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}  # fmt: skip
    started = []
    for index in range(agents):
        command = [
            str(Path(sys.executable).parent / "torchrun"), "--nnodes", f"1:{nodes}",
            "--nproc-per-node", "1", "--max-restarts", "1", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"job-{port}",
            "--rdzv-conf", RDZV_CONF, "--monitor-interval", "0.5", "-m", "lbtrain",
            *_arguments(root),
        ]  # fmt: skip
        log = (root / f"{tag}-{index}.log").open("w")
        _PORT[tag] = port
        started.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                        start_new_session=True, cwd=root))  # fmt: skip
        while index == 0 and tag != "joining":  # the store's host first
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.05)
    return started


_PORT: dict[str, int] = {}


def main() -> int:
    live = "--live" in sys.argv[1:]
    named = [a for a in sys.argv[1:] if a != "--live"]
    root = Path(named[0] if named else "/tmp/elastic-resize")
    root.mkdir(parents=True, exist_ok=True)
    first, began = _world(root, 3, "three", nodes=4 if live else 3), time.monotonic()
    while not list((root / "pids").glob("rank-*.step-7")):
        if time.monotonic() - began > 120:
            raise SystemExit("the workers never reached step 7; see the logs in " + str(root))
        time.sleep(0.05)
    began = time.monotonic()
    if live:  # a fourth agent joins the running job
        agents = [*first, *_world(root, 1, "joining", nodes=4, port=_PORT["three"])]
    else:
        for agent in first:
            os.kill(agent.pid, signal.SIGTERM)  # torchrun passes it on to its worker
        print("3 agents stopped:", [agent.wait(timeout=120) for agent in first], flush=True)
        began, agents = time.monotonic(), _world(root, 4, "four")
    codes = [agent.wait(timeout=240) for agent in agents]
    print(f"4 agents: {codes}, {time.monotonic() - began:.1f} s", flush=True)
    config = TrainConfig(workload="tests.fixtures.faulty:plugin", quiet=True,
                         out=str(root / "whole"), **RECIPE)  # fmt: skip
    for result in run_ranks(3, lambda comm: train(config, comm).exit_code, timeout=120):
        assert result.error is None, result.error
    ours, theirs = final_model(root / "run"), final_model(root / "whole")
    worlds = json.loads((root / "run" / "summary.json").read_text())["worlds"]
    print("worlds:", worlds)
    print("largest weight difference:", max(float((ours[k] - theirs[k]).abs().max()) for k in ours))
    return 0 if all(code == 0 for code in codes) else 1


if __name__ == "__main__":
    raise SystemExit(main())
