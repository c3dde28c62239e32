"""Probe torchrun's elastic agent on one machine (issue 40): node loss, worker crash, growth.

Launches torchrun agents (c10d rendezvous on 127.0.0.1) as subprocesses, each in a
session of its own, running a tiny gloo worker that loops allreduce steps and prints
one event line per step.  The probe waits on those event lines (polling the agents'
log files against a deadline), kills or adds agents as the scenario says, and prints
a summary with timings.  All child process groups are killed at the end.

By default the agents run with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (a fresh worker
store per rendezvous round); --shared-store keeps torch's default, under which worker
restarts and scale-up fail in torch 2.13 (stale keys, DistStoreError wait timeout).

    python scripts/elastic_probe.py --scenario node-loss|crash|grow|resize|agent-only
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

WORKER = r"""
import os, sys, time, json
from datetime import timedelta
os.environ["OMP_NUM_THREADS"] = "1"
try:
    os.setsid()
    sid_note = "setsid ok"
except PermissionError:
    sid_note = "already session leader"  # torchrun Popen(start_new_session=True)
import torch
import torch.distributed as dist
torch.set_num_threads(1)

def ev(kind, **kw):
    kw.update(kind=kind, t=time.time(), pid=os.getpid(), ppid=os.getppid())
    print("EV " + json.dumps(kw), flush=True)

env = {k: v for k, v in os.environ.items()
       if k.startswith(("TORCHELASTIC", "GROUP_", "ROLE_", "LOCAL_", "MASTER_"))
       or k in ("RANK", "WORLD_SIZE", "OMP_NUM_THREADS", "TORCH_NCCL_ASYNC_ERROR_HANDLING")}
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
ev("start", rank=rank, world=world, restart=restart, session=sid_note, env=env)
steps, pace = int(os.environ["PROBE_STEPS"]), float(os.environ["PROBE_PACE"])
crash_at = int(os.environ.get("PROBE_CRASH_AT", "-1"))
try:
    dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    ev("init", rank=dist.get_rank(), world=dist.get_world_size(), restart=restart)
    for step in range(steps):
        if step == crash_at and rank == 1 and restart == 0:
            raise RuntimeError("probe: planned crash")
        t = torch.ones(1)
        dist.all_reduce(t)
        ev("step", step=step, epoch=step // 10, rank=rank, world=world,
           restart=restart, sum=int(t.item()))
        time.sleep(pace)  # stands for the compute of a step
    dist.destroy_process_group()
    ev("done", rank=rank, world=world, restart=restart)
except BaseException as exc:
    ev("exc", rank=rank, world=world, restart=restart, type=type(exc).__name__,
       msg=str(exc).splitlines()[0][:300] if str(exc) else "")
    raise
"""


@dataclass
class Agent:
    name: str
    proc: subprocess.Popen
    log: Path
    started: float
    worker_pids: set[int] = field(default_factory=set)


@dataclass
class Run:
    tmp: Path
    port: int
    args: argparse.Namespace
    agents: list[Agent] = field(default_factory=list)
    seen: dict[str, int] = field(default_factory=dict)  # log -> lines already parsed
    events: list[dict] = field(default_factory=list)
    agent_lines: list[tuple[str, str]] = field(default_factory=list)


def free_port() -> int:
    """A port the OS just handed out (the store binds it right after)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_agent(run: Run, name: str, nnodes: str, max_restarts: int, extra_env: dict) -> Agent:
    """One torchrun agent with its own session, stdout+stderr to a log file."""
    log = run.tmp / f"agent-{name}.log"
    cmd = [
        str(Path(sys.executable).with_name("torchrun")),
        "--nnodes",
        nnodes,
        "--nproc-per-node",
        "1",
        "--max-restarts",
        str(max_restarts),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{run.port}",
        "--rdzv-id",
        run.args.rdzv_id,
        "--monitor-interval",
        str(run.args.monitor_interval),
    ]
    if run.args.rdzv_conf:
        cmd += ["--rdzv-conf", run.args.rdzv_conf]
    cmd += [str(run.tmp / "worker.py")]
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
        LOGLEVEL=run.args.agent_loglevel,
        PROBE_STEPS=str(run.args.steps),
        PROBE_PACE=str(run.args.pace),
        **extra_env,
    )
    if not run.args.shared_store:
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    out = open(log, "w")
    proc = subprocess.Popen(
        cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )
    out.close()
    agent = Agent(name, proc, log, time.time())
    run.agents.append(agent)
    return agent


def poll(run: Run) -> None:
    """Parse new lines of every agent log into events (workers) and agent lines."""
    for agent in run.agents:
        text = agent.log.read_text(errors="replace")
        lines = text.splitlines()
        if lines and not text.endswith("\n"):
            lines = lines[:-1]  # a partial last line waits for the next poll
        for line in lines[run.seen.get(agent.name, 0) :]:
            if line.startswith("EV "):
                try:
                    e = json.loads(line[3:])
                except ValueError:
                    continue
                e["agent"] = agent.name
                agent.worker_pids.add(e["pid"])
                run.events.append(e)
            else:
                run.agent_lines.append((agent.name, line))
        run.seen[agent.name] = len(lines)


def wait_for(run: Run, pred, what: str, timeout: float):
    """Poll logs until pred(run) returns something truthy; fail after timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        poll(run)
        got = pred(run)
        if got:
            return got
        time.sleep(0.05)
    raise TimeoutError(f"no event '{what}' within {timeout}s")


def first_event(kind: str, since: float = 0.0, **match):
    def pred(run: Run):
        for e in run.events:
            if (
                e["kind"] == kind
                and e["t"] >= since
                and all(e.get(k) == v for k, v in match.items())
            ):
                return e
        return None

    return pred


def store_listening(run: Run) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", run.port)) == 0


def store_owner(run: Run) -> str:
    """Which process holds the listening socket of the rendezvous store (ss -ltnp)."""
    out = subprocess.run(
        ["ss", "-ltnp", f"sport = :{run.port}"], capture_output=True, text=True, timeout=10
    ).stdout
    pids = {int(p) for p in re.findall(r"pid=(\d+)", out)}
    names = [a.name for a in run.agents if a.proc.pid in pids]
    return f"{names or '?'} (pids {sorted(pids)})"


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie child of ours counts as dead
        return not os.waitpid(pid, os.WNOHANG)[0]
    except ChildProcessError:
        return True


def start_world(run: Run, names: list[str], nnodes: str, max_restarts: int, env=None) -> None:
    """First agent alone until its store listens (so it hosts it), then the rest."""
    start_agent(run, names[0], nnodes, max_restarts, env or {})
    wait_for(run, store_listening, "store listening", 30)
    for n in names[1:]:
        start_agent(run, n, nnodes, max_restarts, env or {})


def wait_exit(run: Run, agents: list[Agent], timeout: float) -> dict[str, int | None]:
    deadline = time.monotonic() + timeout
    for a in agents:
        try:
            a.proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    poll(run)
    return {a.name: a.proc.returncode for a in agents}


def cleanup(run: Run) -> None:
    """SIGKILL every agent's group and every worker's group (workers have their own)."""
    for a in run.agents:
        for pg in [a.proc.pid, *a.worker_pids]:
            try:
                os.killpg(pg, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            a.proc.wait(5)
        except subprocess.TimeoutExpired:
            pass


def worlds(run: Run, since: float = 0.0) -> list[tuple]:
    """(world, restart, agent) of each worker incarnation's first step after since."""
    out, seen = [], set()
    for e in run.events:
        if e["kind"] == "step" and e["t"] >= since and e["pid"] not in seen:
            seen.add(e["pid"])
            out.append((e["agent"], e["rank"], e["world"], e["restart"], round(e["t"] - since, 2)))
    return out


def report_common(run: Run, since: float) -> None:
    for e in run.events:
        if e["kind"] == "exc":
            print(
                f"  worker exc  agent={e['agent']} rank={e['rank']} world={e['world']} "
                f"+{e['t'] - since:.2f}s {e['type']}: {e['msg']}"
            )
    starts = [e for e in run.events if e["kind"] == "start"]
    for e in starts[:1] + [x for x in starts if x["t"] >= since][:1]:
        print(f"  env of a worker (agent {e['agent']}, {e['session']}):", e["env"])
    print("  new incarnations (agent, rank, world, restart, +s after mark):")
    for w in worlds(run, since):
        print("   ", w)
    keys = (
        "FAILED",
        "attempts left",
        "Detected",
        "Rendezvous complete",
        "ERROR",
        "Error",
        "Timeout",
        "timed out",
        "has joined round",
        "Closing",
        "closed",
        "exitcode",
        "SUCCEEDED",
        "Traceback",
    )
    for name, line in run.agent_lines:
        if any(k in line for k in keys) and not line.startswith("  File"):
            print(f"  [{name}] {line[:240]}")


def print_breakdown(run: Run, since: float, **match) -> None:
    """Times after since of the first survivor exception, new worker start, init, step."""
    parts = []
    for kind in ("exc", "start", "init", "step"):
        m = match if kind != "exc" else {}
        e = first_event(kind, since=since, **m)(run)
        parts.append(f"{kind} +{e['t'] - since:.2f}s" if e else f"{kind} -")
    print("  breakdown:", ", ".join(parts))


def scenario_node_loss(run: Run) -> None:
    """Kill -9 agent B and its worker in epoch 2; survivors should regroup as world 2."""
    start_world(run, ["A", "B", "C"], "1:3", 2)
    print("store host:", store_owner(run))
    e = wait_for(run, first_event("step", epoch=2, world=3), "epoch 2 at world 3", 120)
    b = next(a for a in run.agents if a.name == "B")
    wb = next(x["pid"] for x in run.events if x["agent"] == "B" and x["kind"] == "start")
    t_kill = time.time()
    os.killpg(b.proc.pid, signal.SIGKILL)
    b.proc.wait(5)
    print(
        f"kill -9 agent B group at step {e['step']}; B's worker {wb} alive after "
        f"agent-group kill: {alive(wb)}"
    )
    os.killpg(wb, signal.SIGKILL)
    n = wait_for(
        run, first_event("step", since=t_kill, world=2), "first step world 2", run.args.recover_wait
    )
    print(f"kill -> first step of world 2: {n['t'] - t_kill:.2f}s")
    print_breakdown(run, t_kill, world=2)
    codes = wait_exit(run, [a for a in run.agents if a.name != "B"], 180)
    print("agent exit codes:", codes)
    report_common(run, t_kill)


def scenario_agent_only(run: Run) -> None:
    """Kill -9 agent B's group only: its worker (own session) lives on."""
    start_world(run, ["A", "B", "C"], "1:3", 2)
    wait_for(run, first_event("step", epoch=2, world=3), "epoch 2 at world 3", 120)
    b = next(a for a in run.agents if a.name == "B")
    wb = next(x["pid"] for x in run.events if x["agent"] == "B" and x["kind"] == "start")
    t_kill = time.time()
    os.killpg(b.proc.pid, signal.SIGKILL)
    b.proc.wait(5)
    print(f"killed agent B only; its worker {wb} alive: {alive(wb)}")
    codes = wait_exit(run, [a for a in run.agents if a.name != "B"], 60)
    print(
        "agent exit codes after 60 s (None: still waiting in the exit barrier for B):",
        codes,
        "| B's orphan worker alive:",
        alive(wb),
    )
    report_common(run, t_kill)


def scenario_crash(run: Run) -> None:
    """Rank 1 raises once at step 5 (restart 0); --max-restarts 1 should recover at world 3."""
    t0 = time.time()
    start_world(run, ["A", "B", "C"], "1:3", 1, {"PROBE_CRASH_AT": "5"})
    c = wait_for(run, first_event("exc", type="RuntimeError"), "planned crash", 120)
    n = wait_for(
        run,
        first_event("step", since=c["t"], world=3),
        "first step after crash",
        run.args.recover_wait,
    )
    print(f"crash -> first step of new world 3: {n['t'] - c['t']:.2f}s")
    codes = wait_exit(run, run.agents, 180)
    print("agent exit codes:", codes)
    report_common(run, t0)


def scenario_grow(run: Run) -> None:
    """A 4th agent joins a running 3-agent job (--nnodes 1:4) in epoch 2."""
    start_world(run, ["A", "B", "C"], "1:4", 2)
    wait_for(run, first_event("step", epoch=2, world=3), "epoch 2 at world 3", 120)
    t_join = time.time()
    start_agent(run, "D", "1:4", 2, {})
    try:
        n = wait_for(
            run,
            first_event("step", since=t_join, world=4),
            "first step world 4",
            run.args.grow_wait,
        )
        print(f"4th agent start -> first step of world 4: {n['t'] - t_join:.2f}s")
    except TimeoutError as exc:
        print("GROW FAILED:", exc)
    codes = wait_exit(run, run.agents, 180)
    print("agent exit codes:", codes)
    report_common(run, t_join)


def scenario_resize(run: Run) -> None:
    """Planned resize: SIGTERM all 3 agents in epoch 2, start 4 with the same rdzv-id."""
    start_world(run, ["A", "B", "C"], "1:4", 2)
    wait_for(run, first_event("step", epoch=2, world=3), "epoch 2 at world 3", 120)
    t_stop = time.time()
    for a in run.agents:
        a.proc.send_signal(signal.SIGTERM)
    codes = wait_exit(run, list(run.agents), 60)
    left = [p for a in run.agents for p in a.worker_pids if alive(p)]
    print(
        f"SIGTERM -> all agents exited {time.time() - t_stop:.2f}s, codes {codes}, "
        f"workers still alive: {left}"
    )
    t_new = time.time()
    start_world(run, ["A2", "B2", "C2", "D2"], "1:4", 2)
    n = wait_for(run, first_event("step", since=t_new, world=4), "first step world 4", 180)
    print(f"restart 4 agents -> first step of world 4: {n['t'] - t_new:.2f}s")
    codes = wait_exit(run, run.agents[3:], 180)
    print("new agent exit codes:", codes)
    report_common(run, t_stop)


SCENARIOS = {
    "node-loss": scenario_node_loss,
    "crash": scenario_crash,
    "grow": scenario_grow,
    "resize": scenario_resize,
    "agent-only": scenario_agent_only,
}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scenario", choices=sorted(SCENARIOS), required=True)
    p.add_argument("--steps", type=int, default=40, help="steps per worker incarnation")
    p.add_argument("--pace", type=float, default=0.1, help="seconds of 'compute' per step")
    p.add_argument(
        "--rdzv-conf",
        default="join_timeout=60,last_call_timeout=2,close_timeout=10,keep_alive_interval=1,keep_alive_max_attempt=3",
    )
    p.add_argument("--rdzv-id", default=f"probe{os.getpid()}")
    p.add_argument("--monitor-interval", type=float, default=0.5)
    p.add_argument("--grow-wait", type=float, default=90)
    p.add_argument("--recover-wait", type=float, default=120, help="deadline for the new world")
    p.add_argument(
        "--shared-store",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="let workers reuse the agents' shared TCPStore (torch default); off "
        "sets TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: a fresh store per round",
    )
    p.add_argument("--agent-loglevel", default="INFO", help="LOGLEVEL of the torchrun agents")
    p.add_argument("--keep", action="store_true", help="print the temp dir and keep logs")
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="elastic-probe-"))
    (tmp / "worker.py").write_text(WORKER)
    run = Run(tmp, free_port(), args)
    t0 = time.time()
    print(
        f"scenario {args.scenario}: port {run.port}, rdzv-conf '{args.rdzv_conf}', "
        f"monitor-interval {args.monitor_interval}, shared store {args.shared_store}, logs {tmp}"
    )
    try:
        SCENARIOS[args.scenario](run)
        return 0
    except TimeoutError as exc:
        poll(run)
        print("PROBE TIMEOUT:", exc)
        report_common(run, t0)
        return 1
    finally:
        cleanup(run)


if __name__ == "__main__":
    sys.exit(main())
