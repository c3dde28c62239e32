"""`ReplicaProfile`: what profiling measured on one replica, and the profiles file format."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from lbtrain.balancer import ReplicaSpeed
from lbtrain.balancer.checks import whole
from lbtrain.outputs import atomic_write_text
from lbtrain.profiling.validate import check_fit, check_profile_fields

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "ProfileFileError",
    "ReplicaProfile",
    "describe_model",
    "load_profiles",
    "profiles_from_dict",
    "profiles_to_dict",
    "save_profiles",
    "utc_now",
]

FORMAT_NAME = "lbtrain-profiles"
FORMAT_VERSION = 1


class ProfileFileError(ValueError):
    """A profiles file is missing, malformed, or does not fit this run."""


@dataclass(frozen=True)
class ReplicaProfile:
    """How fast one replica trains the workload, as measured by `profile_replica`.

    Args:
        rank: the replica's rank.
        host: host name.
        device: torch device string ("cpu", "cuda:0").
        device_kind: "cpu" or "cuda".
        device_name: CPU or GPU model.
        threads: torch intra-op threads during profiling.
        workload: name of the workload profiled.
        batch_sizes: the ladder of batch sizes timed, increasing.
        step_times: median seconds per training step at each batch size (forward, backward,
            optimizer step, and any emulated slowdown).
        alpha: fitted fixed seconds per step of t(b) = alpha + beta * b.
        beta: fitted seconds per sample.
        r_squared: fit quality, or None when undefined.
        cap: largest batch that fits in memory, or None when no limit was found.
        cap_source: how the cap was obtained (e.g. "cuda-oom-probe", "cpu-ram-estimate").
        memory_per_sample: estimated bytes per sample during a training step, if measured.
        slowdown: emulated slowdown factor applied (1 = none).
        repeats: timed steps at each batch size (the median of them is kept).
        started_at: ISO 8601 UTC time profiling started.
        finished_at: ISO 8601 UTC time profiling finished.
        reference_batch: batch size at which `throughput` is read off the fitted line; None
            means the largest batch measured. `profile_all` gives every rank the same one,
            so the balancer compares the ranks at one batch size.
        fit_relative_error: RMS relative error of the fitted line on the medians, or None
            where not recorded.
        sync_time: seconds one step's sync (control and gradient allreduces) took on the
            job that profiled, the slowest rank's median; None where not measured.
        sync_bytes: gradient bytes reduced per step, or None.
        sync_ranks: ranks that took part in the sync measurement, or None.
        model: the model profiled, as `describe_model` names it (class and parameter
            count), or None where not recorded (files from before it was).
        sample_shape: shape of one input sample, or None where not recorded.
    """

    rank: int
    host: str
    device: str
    device_kind: str
    device_name: str
    threads: int
    workload: str
    batch_sizes: tuple[int, ...]
    step_times: tuple[float, ...]
    alpha: float
    beta: float
    r_squared: float | None
    cap: int | None
    cap_source: str
    memory_per_sample: float | None
    slowdown: float
    repeats: int
    started_at: str
    finished_at: str
    reference_batch: int | None = None
    fit_relative_error: float | None = None
    sync_time: float | None = None
    sync_bytes: int | None = None
    sync_ranks: int | None = None
    model: str | None = None
    sample_shape: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "batch_sizes", tuple(int(b) for b in self.batch_sizes))
        object.__setattr__(self, "step_times", tuple(float(t) for t in self.step_times))
        if self.sample_shape is not None:
            object.__setattr__(self, "sample_shape", tuple(int(d) for d in self.sample_shape))
        if not self.batch_sizes or len(self.batch_sizes) != len(self.step_times):
            raise ValueError(
                f"rank {self.rank}: batch_sizes {list(self.batch_sizes)} and step_times "
                f"{list(self.step_times)} must be non-empty and of equal length"
            )
        if any(not (math.isfinite(t) and t > 0) for t in self.step_times):
            raise ValueError(f"rank {self.rank}: step_times must be positive seconds")
        if self.reference_batch is not None and (
            isinstance(self.reference_batch, bool)
            or not isinstance(self.reference_batch, int)
            or self.reference_batch < 1
        ):
            raise ValueError(
                f"rank {self.rank}: reference_batch={self.reference_batch!r} must be a whole "
                "number >= 1 or null"
            )
        self._check_sync()
        # Validates alpha, beta and cap the way the balancer will use them.
        self.replica_speed()

    def _check_sync(self) -> None:
        given = [v is not None for v in (self.sync_time, self.sync_bytes, self.sync_ranks)]
        if any(given) and not all(given):
            raise ValueError(
                f"rank {self.rank}: sync_time, sync_bytes and sync_ranks must all be given "
                "or all be null"
            )
        if not any(given):
            return
        seconds = self.sync_time
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, int | float)
            or not (math.isfinite(seconds) and seconds >= 0)
        ):
            raise ValueError(
                f"rank {self.rank}: sync_time={seconds!r} must be a finite number of seconds >= 0"
            )
        object.__setattr__(self, "sync_time", float(seconds))
        for name, low in (("sync_bytes", 0), ("sync_ranks", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(
                    f"rank {self.rank}: {name}={value!r} must be a whole number >= {low} or null"
                )

    @property
    def samples_per_second(self) -> tuple[float, ...]:
        """Measured samples/s at each batch size of the ladder."""
        return tuple(b / t for b, t in zip(self.batch_sizes, self.step_times, strict=True))

    @property
    def throughput_batch(self) -> int:
        """The batch size `throughput` refers to: reference_batch, else the largest measured."""
        return self.reference_batch if self.reference_batch is not None else self.batch_sizes[-1]

    @property
    def throughput(self) -> float:
        """Samples/s the fitted model gives at `throughput_batch`.

        Reading it off the fitted line rather than one rung's median smooths the noise and
        keeps the balancer's throughput consistent with its alpha and beta. With a fixed cost
        per step, samples/s grows with the batch, so ranks are only comparable at one batch
        size: `profile_all` and `balance-report` choose a common, representative one.
        """
        batch = self.throughput_batch
        return batch / (self.alpha + self.beta * batch)

    @property
    def duration(self) -> float:
        """Seconds the profiling took."""
        start = datetime.fromisoformat(self.started_at)
        return (datetime.fromisoformat(self.finished_at) - start).total_seconds()

    def replica_speed(self) -> ReplicaSpeed:
        """The balancer's view of this replica: throughput, alpha, beta and cap."""
        return ReplicaSpeed(
            throughput=self.throughput, alpha=self.alpha, beta=self.beta, cap=self.cap
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict; samples_per_second is included for readers, ignored on load."""
        data = asdict(self)
        data["batch_sizes"] = list(self.batch_sizes)
        data["step_times"] = list(self.step_times)
        data["samples_per_second"] = list(self.samples_per_second)
        if self.sample_shape is not None:
            data["sample_shape"] = list(self.sample_shape)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ReplicaProfile:
        """Rebuild a profile written by `to_dict`."""
        if not isinstance(data, dict):
            raise ValueError(f"a profile must be a JSON object, not {type(data).__name__}")
        names = [f.name for f in fields(cls)]
        missing = [name for name in names if name not in data and name not in _OPTIONAL]
        if missing:
            raise ValueError(f"profile lacks {', '.join(repr(m) for m in missing)}")
        check_profile_fields(data)  # every field as data: one ValueError naming the field
        try:
            return cls(**{name: data[name] for name in names if name in data})
        except (TypeError, OverflowError) as exc:
            raise ValueError(f"profile has a field of the wrong type ({exc})") from exc

    def to_json(self, indent: int | None = 2) -> str:
        """Serialise to JSON text."""
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_json(cls, text: str) -> ReplicaProfile:
        """Parse JSON text written by `to_json`."""
        return cls.from_dict(json.loads(text))


# Fields added after the first profiles files were written; older files lack them.
_OPTIONAL = frozenset(
    {
        "reference_batch",
        "fit_relative_error",
        "sync_time",
        "sync_bytes",
        "sync_ranks",
        "model",
        "sample_shape",
    }
)


def describe_model(model: Any) -> str:
    """A model's identity in a profile: its class and parameter count.

    Two models of one class and size train at the same speed, whatever their weights; a
    different class, or the same class at another width or input size, does not.
    """
    count = sum(p.numel() for p in model.parameters())
    return f"{type(model).__name__} ({count:,} parameters)"


def utc_now() -> str:
    """The current time as an ISO 8601 UTC string."""
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def profiles_to_dict(profiles: Sequence[ReplicaProfile]) -> dict[str, Any]:
    """The profiles file content for one job's gathered profiles, in rank order."""
    return {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "world_size": len(profiles),
        "created_at": utc_now(),
        "profiles": [p.to_dict() for p in profiles],
    }


def profiles_from_dict(data: Any, source: str = "profiles") -> list[ReplicaProfile]:
    """Validate a profiles file's content and rebuild the profiles in rank order.

    Args:
        data: the parsed JSON.
        source: name of the file, for error messages.
    """
    fix = "regenerate it with `mpiexec -n N lbtrain profile --output FILE`"
    if not isinstance(data, dict) or data.get("format") != FORMAT_NAME:
        raise ProfileFileError(f"{source} is not an lbtrain profiles file; {fix}")
    if data.get("version") != FORMAT_VERSION:
        raise ProfileFileError(
            f"{source} has format version {data.get('version')!r}, this lbtrain reads "
            f"{FORMAT_VERSION}; {fix}"
        )
    entries = data.get("profiles")
    if not isinstance(entries, list) or not entries:
        raise ProfileFileError(f"{source} holds no profiles; {fix}")
    profiles = []
    for index, entry in enumerate(entries):
        try:
            profiles.append(ReplicaProfile.from_dict(entry))
            check_fit(entry)
        except ValueError as exc:
            message = f"{source}: profiles[{index}] is invalid: {exc}; {fix}"
            raise ProfileFileError(message) from None
    ranks = [p.rank for p in profiles]
    if ranks != list(range(len(profiles))) or data.get("world_size") != len(profiles):
        raise ProfileFileError(
            f"{source}: world_size {data.get('world_size')!r} and ranks {ranks} do not describe "
            f"ranks 0..P-1 in order; {fix}"
        )
    return profiles


def save_profiles(path: str | os.PathLike[str], profiles: Sequence[ReplicaProfile]) -> Path:
    """Write gathered profiles as JSON, atomically (a crash never leaves half a file).

    Args:
        path: destination file.
        profiles: one profile per rank, in rank order.

    Returns:
        The path written.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write_text(path, json.dumps(profiles_to_dict(profiles), indent=2) + "\n")


def load_profiles(
    path: str | os.PathLike[str], world_size: int | None = None
) -> list[ReplicaProfile]:
    """Read a profiles file written by `save_profiles` / `lbtrain profile`.

    Args:
        path: the file.
        world_size: when given, the number of ranks the file must describe (this run's).

    Returns:
        The profiles in rank order.

    Raises:
        ProfileFileError: one-line message naming the file and the fix.
    """
    if world_size is not None:
        whole("world_size", world_size, low=1)
    if not isinstance(path, str | os.PathLike):
        raise TypeError(f"path={path!r} is not a file name: pass a str or a Path")
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ProfileFileError(
            f"profile file {str(path)!r} does not exist; create it with `mpiexec -n N lbtrain "
            "profile --output FILE`, or omit --profiles to profile now"
        ) from None
    except OSError as exc:
        what = "is a folder" if path.is_dir() else f"cannot be read ({exc.strerror})"
        raise ProfileFileError(
            f"profile file {str(path)!r} {what}; name the JSON file `lbtrain profile --output` "
            "wrote"
        ) from None
    except UnicodeDecodeError:
        raise ProfileFileError(
            f"profile file {str(path)!r} is not UTF-8 text, so not a profiles file; "
            "regenerate it with `mpiexec -n N lbtrain profile --output FILE`"
        ) from None
    try:
        data = json.loads(text)
    except RecursionError:
        raise ProfileFileError(
            f"profile file {str(path)!r} nests too deeply to be a profiles file; regenerate "
            "it with `mpiexec -n N lbtrain profile --output FILE`"
        ) from None
    except json.JSONDecodeError as exc:
        raise ProfileFileError(
            f"profile file {str(path)!r} is not valid JSON ({exc}); regenerate it with "
            "`mpiexec -n N lbtrain profile --output FILE`"
        ) from None
    profiles = profiles_from_dict(data, source=f"profile file {str(path)!r}")
    if world_size is not None and len(profiles) != world_size:
        raise ProfileFileError(
            f"profile file {str(path)!r} was recorded with {len(profiles)} ranks but this run "
            f"has {world_size}; re-profile with `mpiexec -n {world_size} lbtrain profile "
            f"--output {path}` or launch {len(profiles)} ranks"
        )
    return profiles
