"""Built-in device table for what-if predictions, extendable from a TOML or JSON file.

Peak numbers come from vendor spec sheets (named beside each entry); a model built on them
is a roofline bound, not a measurement. Units are SI: FLOP/s, bytes/s, bytes.
"""

from __future__ import annotations

import json
import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["BUILTIN_DEVICES", "KINDS", "DeviceSpec", "load_device_table"]

KINDS = ("gpu", "cpu")


@dataclass(frozen=True)
class DeviceSpec:
    """One kind of device.

    Args:
        name: lower-case name used in cluster specs (``"h100"``).
        kind: ``"gpu"`` or ``"cpu"`` (decides the default devices per node in a cluster).
        flops: peak FP32 FLOP/s (non-tensor-core for GPUs).
        memory_bandwidth: peak memory bandwidth, bytes/s.
        memory: device memory in bytes, or None when the host's memory is shared (CPU cores).
        source: where the numbers come from.
    """

    name: str
    kind: str
    flops: float
    memory_bandwidth: float
    memory: float | None = None
    source: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"device {self.name!r}: kind={self.kind!r} must be one of {KINDS}")
        for key in ("flops", "memory_bandwidth"):
            if not _positive(getattr(self, key)):
                raise ValueError(f"device {self.name!r}: {key} must be a finite number > 0")
        if self.memory is not None and not _positive(self.memory):
            raise ValueError(f"device {self.name!r}: memory must be a finite number > 0 bytes")


def _positive(value: object) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )


_G = 1e9
_T = 1e12

BUILTIN_DEVICES: dict[str, DeviceSpec] = {
    spec.name: spec
    for spec in (
        # NVIDIA H100 Tensor Core GPU datasheet (SXM5 80 GB): FP32 67 TFLOP/s, HBM3 3.35 TB/s.
        DeviceSpec("h100", "gpu", 67 * _T, 3.35 * _T, 80 * _G, "NVIDIA H100 datasheet, SXM"),
        # NVIDIA H200 Tensor Core GPU datasheet (SXM 141 GB): FP32 67 TFLOP/s, HBM3e 4.8 TB/s.
        DeviceSpec("h200", "gpu", 67 * _T, 4.8 * _T, 141 * _G, "NVIDIA H200 datasheet, SXM"),
        # NVIDIA A100 Tensor Core GPU datasheet (SXM4 80 GB): FP32 19.5 TFLOP/s, 2,039 GB/s.
        DeviceSpec("a100", "gpu", 19.5 * _T, 2.039 * _T, 80 * _G, "NVIDIA A100 datasheet, SXM"),
        # NVIDIA V100 Tensor Core GPU datasheet (SXM2 32 GB): FP32 15.7 TFLOP/s, 900 GB/s.
        DeviceSpec("v100", "gpu", 15.7 * _T, 900 * _G, 32 * _G, "NVIDIA V100 datasheet, SXM2"),
        # NVIDIA T4 Tensor Core GPU datasheet: FP32 8.1 TFLOP/s, 320 GB/s, 16 GB GDDR6.
        DeviceSpec("t4", "gpu", 8.1 * _T, 320 * _G, 16 * _G, "NVIDIA T4 datasheet"),
        # NVIDIA Ada Lovelace architecture whitepaper, GeForce RTX 4090: 82.6 TFLOP/s FP32
        # (shader), 1,008 GB/s GDDR6X, 24 GB.
        DeviceSpec("rtx-4090", "gpu", 82.6 * _T, 1008 * _G, 24 * _G, "NVIDIA Ada whitepaper"),
        # An assumed server core, not a product: 2.5 GHz with AVX2, 2 FMA units x 8 FP32 lanes
        # x 2 FLOP per FMA = 32 FLOP/cycle -> 80 GFLOP/s; ~10 GB/s, a core's share of a
        # socket's DRAM bandwidth. Memory is the host's (None).
        DeviceSpec("cpu-core", "cpu", 80 * _G, 10 * _G, None, "assumed 2.5 GHz AVX2 core"),
    )
}

_REQUIRED = ("kind", "flops", "memory_bandwidth")
_OPTIONAL = ("memory", "source")


def load_device_table(
    path: str | Path, base: dict[str, DeviceSpec] | None = None
) -> dict[str, DeviceSpec]:
    """Devices of `base` (default: `BUILTIN_DEVICES`) merged with those of a TOML/JSON file.

    The file holds one table per device, keyed by its name, in SI units; a name already
    known is replaced::

        [mi250x]
        kind = "gpu"
        flops = 47.9e12             # FLOP/s
        memory_bandwidth = 3.2e12   # bytes/s
        memory = 128e9              # bytes, optional
        source = "AMD MI250X datasheet"  # optional

    Errors are one line naming the file, the device and the key. `base` is not modified.
    """
    path = Path(path)
    raw = _read(path)
    table = dict(BUILTIN_DEVICES if base is None else base)
    for name, entry in raw.items():
        table[name.lower()] = _entry(path, name, entry)
    return table


def _read(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"device table {str(path)!r} cannot be read: {exc.strerror}") from None
    try:
        raw = json.loads(text) if path.suffix.lower() == ".json" else tomllib.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        kind = "JSON" if path.suffix.lower() == ".json" else "TOML"
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(f"device table {str(path)!r} is not valid {kind}: {first}") from None
    if not isinstance(raw, dict) or not raw:
        raise ValueError(f"device table {str(path)!r} must hold one table per device name")
    return raw


def _entry(path: Path, name: str, entry: object) -> DeviceSpec:
    where = f"device table {str(path)!r}: device {name!r}"
    if not isinstance(entry, dict):
        raise ValueError(f"{where} must be a table of {list(_REQUIRED)}")
    unknown = sorted(set(entry) - set(_REQUIRED) - set(_OPTIONAL))
    if unknown:
        raise ValueError(f"{where}: unknown key {unknown[0]!r}; keys are {_REQUIRED + _OPTIONAL}")
    missing = [key for key in _REQUIRED if key not in entry]
    if missing:
        raise ValueError(f"{where}: missing key {missing[0]!r}")
    if entry["kind"] not in KINDS:
        raise ValueError(f"{where}: key 'kind'={entry['kind']!r} must be one of {KINDS}")
    for key, unit in (("flops", "FLOP/s"), ("memory_bandwidth", "bytes/s"), ("memory", "bytes")):
        if key in entry and not _positive(entry[key]):
            raise ValueError(f"{where}: key {key!r}={entry[key]!r} must be a number > 0 ({unit})")
    return DeviceSpec(
        name=name.lower(),
        kind=entry["kind"],
        flops=float(entry["flops"]),
        memory_bandwidth=float(entry["memory_bandwidth"]),
        memory=None if entry.get("memory") is None else float(entry["memory"]),
        source=str(entry.get("source", str(path))),
    )
