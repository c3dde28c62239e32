"""What-if against runs here (issue 22): predict from a one-rank profile, then measure.

1. `lbtrain profile` on one rank: the demo's model (hamida, Indian Pines, patch 11, PCA 30),
   one thread, a ladder of batches 4 to 64 (no plan batch is extrapolated).
2. For each emulated cluster (2 ranks 1x,3x; 3 ranks 1x,2x,4x) and each policy (equal,
   proportional, cost), `lbtrain.whatif.predict` plans the global batch of 64 and predicts
   the step. Each rank is a device whose speed is the profile's alpha and beta times its
   slowdown (what `--emulate-slowdown` makes of it); the ranks share one machine, so the
   network is one shared-memory link (5 GB/s, 5 us: the sync of hamida's 0.67 MB of
   gradients is well under a millisecond of a step of hundreds).
3. `mpiexec -n N lbtrain train --plan <what-if's plan> --emulate-slowdown F --replan off`
   trains 4 epochs of the benchmark split (512 training pixels, 8 steps of 64 an epoch).
   Measured: each epoch's median step from epoch 2 on.
   With --together, the speeds come instead from `lbtrain profile` on the job's own ranks
   and slowdowns (each rank timed while the others run): what the model gets right once
   the ranks' contention is measured rather than assumed away.
4. The table: per configuration, the predicted and measured step and the median |error| over
   the measured epochs, against the issue's target of 15%.

With --devices (a GPU machine: `--devices cuda:0,cpu`), the clusters are those devices
instead, unslowed: each distinct device is profiled alone on one rank (`lbtrain profile
--devices D`), what-if predicts the mixed job from those profiles, and `lbtrain train
--devices ...` measures it (scripts/gpu_acceptance.sh runs this).

    .venv/bin/python scripts/bench_whatif_validation.py [--workdir DIR] [--epochs 4] [--together]
        [--devices D0,D1,...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import bench_common as bc

__all__ = ["main"]

CLUSTERS = {"2 ranks 1x,3x": (1.0, 3.0), "3 ranks 1x,2x,4x": (1.0, 2.0, 4.0)}
POLICIES = ("equal", "proportional", "cost")
SHARED_MEMORY = "intra=5GB/s,5us; inter=5GB/s,5us"
TARGET = 0.15


def _profile(workdir: Path, device: str | None = None) -> Path:
    """One rank's profile, alone on the machine (on `device`, or the default one)."""
    path = workdir / (f"profile-{device.replace(':', '')}.json" if device else "profile-1rank.json")
    if not path.exists():
        options = [*bc.DEMO_MODEL, "--batch-sizes", "4,8,16,32,64", "--repeats", "5"]
        options += ["--time-budget", "60"]  # every rung, whatever the machine's speed
        options += ["--devices", device] if device else []
        bc.run_command([*bc.lbtrain("profile", 1, options), "--output", str(path)])
    return path


def _solo(workdir: Path, devices: tuple[str, ...] | None) -> list[dict]:
    """The one-rank profiles: one for every rank of `devices` (each device's own, taken
    alone), or the default device's for the emulated clusters."""
    if not devices:
        return [json.loads(_profile(workdir).read_text())["profiles"][0]]
    return [json.loads(_profile(workdir, d).read_text())["profiles"][0] for d in devices]


def _together(workdir: Path, factors: tuple[float, ...]) -> list[dict]:
    """`lbtrain profile` on the job's own ranks and slowdowns: each rank measured while the
    others run, as in training (--together)."""
    path = workdir / f"profile-{len(factors)}ranks.json"
    if not path.exists():
        slow = ",".join(f"{f:g}" for f in factors)
        options = [*bc.DEMO_MODEL, "--batch-sizes", "4,8,16,32,64", "--repeats", "5",
                   "--time-budget", "60", "--emulate-slowdown", slow]  # fmt: skip
        bc.run_command([*bc.lbtrain("profile", len(factors), options), "--output", str(path)])
    return json.loads(path.read_text())["profiles"]


def _predict(profiles: list[dict], factors: tuple[float, ...], policy: str):
    from lbtrain.whatif.cluster import Cluster, DeviceGroup, parse_network
    from lbtrain.whatif.devices import DeviceSpec
    from lbtrain.whatif.predict import SpeedModel, predict

    ranks = len(factors)
    # One device per rank (peaks unused: every speed comes from the profile).
    devices = [DeviceSpec(f"rank{i}-{f:g}x", "cpu", 1.0, 1.0) for i, f in enumerate(factors)]
    cluster = Cluster(tuple(DeviceGroup(1, d, ranks) for d in devices))
    # One profile for all (the solo rank's, times each slowdown), or each rank's own.
    scale = factors if len(profiles) == 1 else (1.0,) * ranks
    chosen = profiles * ranks if len(profiles) == 1 else profiles
    speeds = {
        d.name: SpeedModel(p["alpha"] * f, p["beta"] * f, f"profile x {f:g}")
        for d, p, f in zip(devices, chosen, scale, strict=True)
    }
    gradient = int(chosen[0].get("sync_bytes") or 0)
    return predict(cluster, parse_network(SHARED_MEMORY), speeds, bc.DEMO_BATCH, policy, gradient)


def _plan_file(path: Path, result, policy: str, factors: tuple[float, ...]) -> Path:
    from lbtrain.balancer import BalancePlan, ReplicaSpeed

    sizes = tuple(g.batch_max for g in result.groups)
    speeds = tuple(ReplicaSpeed(1.0 / g.speed.beta, alpha=g.speed.alpha) for g in result.groups)
    path.write_text(BalancePlan(policy, sum(sizes), sizes, speeds).to_json() + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    """Profile, predict, run and print the table; exit 1 when a configuration misses 15%."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, help="keep the runs here (default: a temp dir)")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument(
        "--together", action="store_true", help="profile on the job's ranks, not one alone"
    )
    parser.add_argument(
        "--devices", help="one device per rank (cuda:0,cpu): predict and run that job, unslowed"
    )
    args = parser.parse_args(argv)
    devices = tuple(d.strip() for d in args.devices.split(",")) if args.devices else None
    if devices and (args.together or len(devices) < 2 or not all(devices)):
        parser.error("--devices takes two or more devices (cuda:0,cpu), without --together")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="lbtrain-whatif-"))
    workdir.mkdir(parents=True, exist_ok=True)
    solo = _solo(workdir, devices)
    split = bc.bench_split(workdir)
    clusters = {f"devices {args.devices}": (1.0,) * len(devices)} if devices else CLUSTERS
    rows, missed = [], 0
    for name, factors in clusters.items():
        for policy in POLICIES:
            profiles = _together(workdir, factors) if args.together else solo
            result = _predict(profiles, factors, policy)
            tag = f"{len(factors)}r-{policy}{'-together' if args.together else ''}"
            plan = _plan_file(workdir / f"plan-{tag}.json", result, policy, factors)
            options = [
                *bc.DEMO_MODEL, "--global-batch", str(bc.DEMO_BATCH), "--epochs",
                str(args.epochs), "--no-map", "--replan", "off", "--split-file", str(split),
                "--plan", str(plan),
            ]  # fmt: skip
            if devices:
                options += ["--devices", args.devices]
            else:
                options += ["--emulate-slowdown", ",".join(f"{f:g}" for f in factors)]
            run = bc.train(len(factors), options, workdir)
            measured = [e["step_seconds"] for e in bc.measured_epochs(bc.epochs_of(run.out))]
            errors = [abs(result.step - m) / m for m in measured]
            error = statistics.median(errors)
            missed += error > TARGET
            batches = "/".join(str(g.batch_max) for g in result.groups)
            rows.append(
                f"| {name} | {policy} | {batches} | {1e3 * result.step:.1f} | "
                f"{1e3 * statistics.median(measured):.1f} | {100 * error:.1f}% | "
                f"{'yes' if error <= TARGET else 'NO'} |"
            )
    how = "each rank profiled with the others" if args.together else "scaled by slowdown"
    shown = dict(zip(devices or ("the default device",), solo, strict=True))  # once a device
    for device, one in shown.items():
        print(f"\nsolo profile on {device}: alpha {1e3 * one['alpha']:.2f} ms, beta "
              f"{1e3 * one['beta']:.3f} ms/sample, one rank alone, --threads 1 ({workdir})"
              + ("" if devices else f"; {how}"))  # fmt: skip
    print("\n| cluster | policy | batches | predicted step (ms) | measured step (ms) | "
          "median abs error | <= 15% |")  # fmt: skip
    print("|---|---|---|---:|---:|---:|---|")
    print("\n".join(rows))
    print("\ncommands:\n" + "\n".join(bc.COMMANDS))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
