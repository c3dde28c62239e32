"""The plan a run starts with: a checkpoint's on the same ranks, a plan file's, or one measured.

Every function here is collective: all ranks call it and get the same plan.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from lbtrain.balancer import BalancePlan, idle_ranks_note, min_batch_note, subset_note
from lbtrain.collective import agree, root_value
from lbtrain.comm import Communicator
from lbtrain.profiling import ReplicaProfile
from lbtrain.profiling.measured_plan import PlanRequest, measure_and_plan
from lbtrain.profiling.record import describe_model
from lbtrain.session import Replica, load_profiles_collective, workload_steps
from lbtrain.text import device_label, plural
from lbtrain.trainer.config import TrainConfig
from lbtrain.workloads import Workload

__all__ = ["check_plan_files", "check_profiled", "make_plan", "plan_notes", "plan_record"]


def make_plan(
    comm: Communicator,
    config: TrainConfig,
    replica: Replica,
    workload: Workload,
    make_optimizer: Callable[..., torch.optim.Optimizer],
    checkpoint: dict[str, Any] | None,
    devices: list[dict[str, Any]],
) -> tuple[BalancePlan, list[ReplicaProfile] | None]:
    """The plan: the checkpoint's on the same ranks, a plan file, or profile and plan now."""
    known = None
    if checkpoint is not None:
        resumed = _resumed_plan(comm, config, checkpoint, devices)
        if resumed is not None:
            return resumed
        known = _known_profiles(checkpoint, devices)
    if config.plan:
        data, plan = _plan_file(comm, config)
        agree(comm, lambda: _check_made_for(data, workload, config.plan))
        return plan, None
    profiles = None
    if config.profiles:
        profiles = load_profiles_collective(comm, config.profiles, world_size=comm.size)
        agree(comm, lambda: check_profiled(profiles, workload, config.profiles))
        agree(comm, lambda: check_profiled_ranks(profiles, devices, config.profiles))
    steps = workload_steps(replica, workload, make_optimizer, seed=config.seed,
                           sync_batchnorm=config.sync_batchnorm)  # fmt: skip
    quiet = config.quiet or comm.rank != 0
    if known is not None and profiles is None and not quiet:
        new = [rank for rank, profile in enumerate(known) if profile is None]
        print(
            f"keeping the checkpoint's profiles of {plural(comm.size - len(new), 'rank')} on "
            f"the same devices; profiling {'only ranks ' if new else 'none of the ranks'}"
            f"{', '.join(map(str, new))}",
            flush=True,
        )
    return measure_and_plan(
        comm, steps, _request(config), config.time_budget, profiles,
        say=None if quiet else lambda line: print(line, flush=True), known=known,
    )  # fmt: skip


def check_plan_files(comm: Communicator, config: TrainConfig) -> None:
    """A plan or profiles file that cannot serve this job, refused before the workload loads
    its data (a download, minutes of reading); collective. `make_plan` reads it again. Not
    for a resumed run, which keeps its checkpoint's plan where nothing changed (the file may
    be gone by then): `make_plan` reads the file when it needs it."""
    if config.resume:
        return
    if config.plan:
        _plan_file(comm, config)
    if config.profiles:
        load_profiles_collective(comm, config.profiles, world_size=comm.size)


def _plan_file(comm: Communicator, config: TrainConfig) -> tuple[Any, BalancePlan]:
    """The --plan file as rank 0 read it, and its plan checked against this job; collective."""
    data = root_value(comm, lambda: _read_plan(config.plan))
    return data, agree(comm, lambda: _plan_from(data, config, comm.size))


def _known_profiles(
    checkpoint: dict[str, Any], devices: list[dict[str, Any]]
) -> list[ReplicaProfile | None] | None:
    """Each rank's profile from the checkpoint's world where a rank there ran on the same
    host, device, threads and slowdown (None where none did), or None if no rank did."""
    saved, before = checkpoint.get("profiles") or [], checkpoint.get("devices") or []
    if not saved or len(saved) != len(before):
        return None
    by_key = {
        _device_key(d): ReplicaProfile.from_dict(p) for d, p in zip(before, saved, strict=True)
    }
    known = [by_key.get(_device_key(d)) for d in devices]
    return known if any(p is not None for p in known) else None


def _device_key(device: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(device.get(key) for key in ("host", "device", "threads", "slowdown"))


def _request(config: TrainConfig) -> PlanRequest:
    return PlanRequest(config.global_batch, config.policy, min_batch=config.min_batch)


# The settings that shape a plan: a resumed run that changes one plans again.
_PLAN_SETTINGS = ("policy", "min_batch", "plan", "profiles")


def _resumed_plan(
    comm: Communicator, config: TrainConfig, checkpoint: dict[str, Any], devices: list[Any]
) -> tuple[BalancePlan, list[ReplicaProfile] | None] | None:
    """The checkpoint's plan when nothing that shaped it changed; else None (plan again),
    after saying why on rank 0. A changed time_budget that no profiling would use is
    refused: it would be recorded in config.toml without having applied."""
    saved = dict(checkpoint.get("config", {}))
    plan = BalancePlan.from_dict(checkpoint["plan"])
    profiles = checkpoint.get("profiles")
    profiles = [ReplicaProfile.from_dict(p) for p in profiles] if profiles else None
    changed = [n for n in _PLAN_SETTINGS if getattr(config, n) not in (None, saved.get(n))]
    if checkpoint.get("devices") != devices:
        before = checkpoint.get("devices", [])
        why = (
            f"the checkpoint ran on {plural(len(before), 'rank')} "
            f"({_device_list(before)}), this job on {comm.size} ({_device_list(devices)})"
        )
        moved = [
            f"{key} {_field(before, key)} -> {_field(devices, key)}"
            for key in ("host", "threads")
            if _field(before, key) != _field(devices, key)
        ]
        if moved and _device_list(before) == _device_list(devices):  # the same labels
            why += "; " + ", ".join(moved)
    elif plan.global_batch_size != config.global_batch:
        why = f"the global batch changed from {plan.global_batch_size} to {config.global_batch}"
    elif changed:
        why = ", ".join(
            f"{n} changed from {saved.get(n)!r} to {getattr(config, n)!r}" for n in changed
        )
    else:
        agree(comm, lambda: _check_kept_budget(config, saved))
        return plan, profiles
    if comm.rank == 0 and not config.quiet:
        print(
            f"{why}: planning again; the update stays exact, it does not depend on how the "
            "batch is split",
            flush=True,
        )
    if changed and not (config.plan or config.profiles) and profiles is not None:
        # Same devices and batch (else `why` would name those): the saved profiles serve.
        agree(comm, lambda: _check_kept_budget(config, saved))
        return _request(config).plan(comm, profiles), profiles
    return None


def _check_kept_budget(config: TrainConfig, saved: dict[str, Any]) -> None:
    if "time_budget" in saved and config.time_budget != saved["time_budget"]:
        raise ValueError(
            f"time_budget={config.time_budget:g} would not apply: this resumed run reuses the "
            f"checkpoint's profiles (measured with time_budget={saved['time_budget']:g}); "
            "leave it out, or give profiles or new devices to profile again"
        )


def _read_plan(path: str) -> dict[str, Any]:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"plan {path!r} does not exist; check the path") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(
            f"plan {path!r} is not a readable plan JSON ({exc}); name the plan.json of an "
            "earlier run"
        ) from None


def _plan_from(data: Any, config: TrainConfig, world_size: int) -> BalancePlan:
    try:
        plan = BalancePlan.from_dict(data)
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        # from_dict says a missing field as a ValueError caused by the KeyError.
        cause = exc.__cause__ if isinstance(exc, ValueError) and exc.__cause__ else exc
        if isinstance(cause, KeyError | TypeError | AttributeError):
            raise ValueError(
                f"plan {config.plan!r} is not a plan.json written by lbtrain (missing or wrong "
                f"field: {cause}); use the plan.json of an earlier run"
            ) from None
        raise ValueError(f"plan {config.plan!r}: {exc}") from None
    _check_plan(plan, config, world_size)
    # The file's plan rules the re-plans (its policy, its smallest batch): a min_batch it
    # meets is kept by them too.
    return replace(plan, min_batch=max(plan.min_batch, config.min_batch))


def _check_plan(plan: BalancePlan, config: TrainConfig, world_size: int) -> None:
    if plan.world_size != world_size:
        raise ValueError(
            f"plan {config.plan!r} is for {plural(plan.world_size, 'rank')} but the job has "
            f"{world_size}; launch {plural(plan.world_size, 'rank')} or plan again"
        )
    if plan.global_batch_size != config.global_batch:
        raise ValueError(
            f"plan {config.plan!r} shares a global batch of {plan.global_batch_size}, but "
            f"global_batch={config.global_batch}; set global_batch to "
            f"{plan.global_batch_size} or plan again"
        )
    # The plan's policy and smallest batch rule its re-plans too: a different one given
    # beside it would be recorded in config.toml without having applied.
    if config.policy != TrainConfig.policy and config.policy != plan.policy:
        raise ValueError(
            f"plan {config.plan!r} was made by the {plan.policy} policy, which its re-plans keep, "
            f"not policy={config.policy!r}; remove that setting, or leave the plan file out to "
            "plan with it"
        )
    small = [(r, b) for r, b in enumerate(plan.batch_sizes) if b < config.min_batch]
    if small:
        rank, batch = small[0]
        raise ValueError(
            f"plan {config.plan!r} gives rank {rank} a batch of {batch}, below "
            f"min_batch={config.min_batch}; lower min_batch, or leave the plan file out to "
            "plan with it"
        )


def _field(devices: list[dict[str, Any]], key: str) -> str:
    return ",".join(str(d.get(key)) for d in devices)


def _device_list(devices: list[dict[str, Any]]) -> str:
    # With the emulated slowdown: a resume that changes only that must show the change.
    return ", ".join(device_label(d) for d in devices)


def plan_notes(plan: BalancePlan) -> list[str]:
    """What the user should know about a plan: idle ranks, and launches predicted faster."""
    notes = (idle_ranks_note(plan), min_batch_note(plan), subset_note(plan))
    return [note for note in notes if note]


def check_profiled(profiles: list[ReplicaProfile], workload: Workload, path: str) -> None:
    """Refuse profiles of another workload, model or sample shape: their speeds say nothing
    about this one's. Files from before profiles named the model are checked by name alone.
    (`lbtrain what-if --count-flops` checks its profiles against the model it counts too.)
    """
    name = workload.name
    other = sorted({p.workload for p in profiles if p.workload != name})
    if other:
        raise ValueError(
            f"profiles {path!r} were measured on workload {', '.join(map(repr, other))}, but "
            f"this run trains {name!r}; leave the profiles file out to profile it now, or pass "
            f"one from `lbtrain profile --workload {name}`"
        )
    model = _model_name(workload)
    shape = tuple(workload.sample_shape)
    for p in profiles:
        if (p.model or model) != model or (p.sample_shape or shape) != shape:
            raise ValueError(
                f"profiles {path!r} were measured on {p.model} with samples "
                f"{_shape(p.sample_shape)}, but this run trains {model} with samples "
                f"{_shape(shape)}; leave the profiles file out to profile it now, or pass one from "
                "`lbtrain profile` given this run's workload options"
            )


def check_profiled_ranks(
    profiles: list[ReplicaProfile], devices: list[dict[str, Any]], path: str
) -> None:
    """Refuse profiles whose rank ran on another kind of device or at another emulated
    slowdown than this job's: the plan would be made for other ranks (a rank profiled 4x slow
    may get no samples, and then nothing re-measures it)."""
    for rank, (profile, device) in enumerate(zip(profiles, devices, strict=False)):
        kind = str(device["device"]).split(":")[0]
        if profile.device_kind != kind:
            raise ValueError(
                f"profiles {path!r}: rank {rank} was profiled on {profile.device}, but runs on "
                f"{device['device']} in this job; profile again on this job's devices"
            )
        if abs(profile.slowdown - float(device["slowdown"])) > 1e-9:
            raise ValueError(
                f"profiles {path!r}: rank {rank} was profiled at an emulated slowdown of "
                f"{profile.slowdown:g}, but emulates {float(device['slowdown']):g} in this job; "
                "profile again with this job's emulate_slowdown, or emulate the file's: "
                f"emulate_slowdown={','.join(f'{p.slowdown:g}' for p in profiles)!r}"
            )


def plan_record(plan: BalancePlan, workload: Workload) -> str:
    """plan.json's text: the plan, and the model it was made for (`made_for`), so that a
    --plan of another model is refused like its profiles would be. `BalancePlan.from_dict`
    reads the plan's own fields only."""
    made_for = {"workload": workload.name, "model": _model_name(workload),
                "sample_shape": list(workload.sample_shape)}  # fmt: skip
    return json.dumps({**plan.to_dict(), "made_for": made_for}, indent=2) + "\n"


def _check_made_for(data: Any, workload: Workload, path: str) -> None:
    """Refuse a plan made for another model: its speeds (alpha, beta) are that model's, so
    every prediction would be wrong until re-planning caught up. A plan without the record
    (written before it, or by hand) is taken as it is."""
    made = data.get("made_for") if isinstance(data, dict) else None
    if not isinstance(made, dict):
        return
    model, shape = _model_name(workload), list(workload.sample_shape)
    theirs = (made.get("workload"), made.get("model"), made.get("sample_shape"))
    if theirs != (workload.name, model, shape):
        raise ValueError(
            f"plan {path!r} was made for the {theirs[0]} workload's {theirs[1]} with samples "
            f"{_shape(theirs[2] or [])}, but this run trains {model} with samples "
            f"{_shape(shape)}; leave the plan file out to plan now, or pass the plan.json of "
            "a run of this model"
        )


def _model_name(workload: Workload) -> str:
    """`describe_model` of the workload's model, built on the meta device where it can be:
    no memory, no random draws; else on the CPU, the run's random state left as it was."""
    try:
        with torch.device("meta"):
            return describe_model(workload.build_model())
    except Exception:  # a model whose construction needs real tensors
        with torch.random.fork_rng(devices=[]):
            return describe_model(workload.build_model())


def _shape(shape: tuple[int, ...] | None) -> str:
    return "of unrecorded shape" if shape is None else "x".join(map(str, shape))
