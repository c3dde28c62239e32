"""`lbtrain what-if`'s checks that need no prediction: flag values and flags that go together."""

from __future__ import annotations

import argparse
import math
from typing import Any

from lbtrain.cli.common import check_plot_path
from lbtrain.report import require_matplotlib
from lbtrain.whatif.cluster import Cluster, Network, parse_cluster, parse_network
from lbtrain.whatif.devices import BUILTIN_DEVICES, DeviceSpec, load_device_table
from lbtrain.whatif.predict import key_matches
from lbtrain.whatif.sweep import check_sweep

# NVLink-class links inside a node, 100 Gb/s-class Ethernet/InfiniBand between nodes.
DEFAULT_NETWORK = "intra=900GB/s,5us; inter=100Gb/s,2us"


def profile_map_type(text: str) -> dict[str, str]:
    pairs = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, key = part.partition("=")
        if not sep or not name.strip() or not key.strip():
            raise argparse.ArgumentTypeError(f"--profile-map part {part!r}: write NAME=KEY")
        pairs[name.strip().lower()] = key.strip()
    return pairs


def bytes_type(text: str) -> int:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--gradient-bytes {text!r} is not a number") from None
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(
            f"--gradient-bytes {text!r} must be a finite number >= 0, e.g. 100e6"
        )
    return int(value)


DEFAULT_MAX_DEVICES = 64


def check_flags(args: argparse.Namespace) -> None:
    """The checks that need no file: flags that go together, the plot's path."""
    # Flags of one table only: silently ignored elsewhere, a user would trust their effect.
    if args.batch_per_device is not None and args.scaling != "weak":
        raise ValueError(
            f"--batch-per-device {args.batch_per_device} is the batch of --scaling weak: add "
            "--scaling weak, or drop it (--global-batch gives the batch otherwise)"
        )
    if args.max_devices is not None and not args.scaling:
        raise ValueError(
            f"--max-devices {args.max_devices} bounds the --scaling table: add --scaling strong "
            "or weak, or drop it"
        )
    if args.max_devices is None:
        args.max_devices = DEFAULT_MAX_DEVICES
    if args.profile_map and not args.profiles:
        raise ValueError(
            "--profile-map maps devices to the profiles of --profiles: add --profiles FILE, "
            "or drop --profile-map"
        )
    if args.plot and not (args.scaling or args.sweep):
        raise ValueError(
            f"--plot {args.plot!r} draws the scaling table or the sweep: add --scaling strong "
            "or weak, or --sweep, or drop --plot"
        )
    if args.plot and args.scaling and args.sweep:
        raise ValueError(
            f"--plot {args.plot!r} draws one picture: give --scaling or --sweep with it, not both"
        )
    if args.plot:
        require_matplotlib()
        check_plot_path(args.plot)
    if args.scaling == "weak" and args.batch_per_device is None:
        raise ValueError("--scaling weak needs --batch-per-device")
    batch_swept = args.sweep is not None and args.sweep.axis == "batch"
    if args.scaling == "strong" and args.global_batch is None:
        raise ValueError("--scaling strong needs --global-batch (the batch it holds fixed)")
    if args.scaling is None and args.global_batch is None and not batch_swept:
        raise ValueError(
            "--global-batch is required (the samples of one step), e.g. --global-batch 256; "
            "or ask for --scaling weak with --batch-per-device"
        )
    if args.global_batch is None and args.sweep is not None and not batch_swept:
        raise ValueError("--sweep needs --global-batch (the samples of one step)")
    if args.parallelism and args.global_batch is None:
        raise ValueError("--parallelism needs --global-batch (the samples of one step)")
    if args.parallelism and not args.count_flops:
        raise ValueError(
            "--parallelism compares schemes layer by layer: add --count-flops (and the "
            "workload's options) so the model's layers can be counted"
        )
    if args.count_flops and (args.flops_per_sample or args.bytes_per_sample):
        raise ValueError(
            "--count-flops counts the FLOP and bytes per sample that --flops-per-sample and "
            "--bytes-per-sample give: use one or the other"
        )


def check_profile_map(mapping: dict[str, str], profiles: list[Any]) -> None:
    """Refuse a --profile-map entry that matches no profile: it would fall back, unsaid, to
    the default match or the roofline. (An entry for a device outside the cluster is kept:
    its profiles calibrate the roofline of its kind.)"""
    for name, key in mapping.items():
        if not any(key_matches(p, key) for p in profiles):
            kinds = sorted({str(p.device_kind) for p in profiles})
            raise ValueError(
                f"--profile-map {name}={key}: no profile is of device kind {key!r} or has it in "
                f"its device name (the profiles' kinds: {', '.join(kinds)}); name one of those"
            )


def checked_cluster(
    args: argparse.Namespace,
) -> tuple[dict[str, DeviceSpec], Cluster, Network]:
    """The device table, --cluster and --network, checked against the other flags: all
    before anything slow."""
    check_flags(args)
    table = BUILTIN_DEVICES if args.devices_file is None else load_device_table(args.devices_file)
    cluster, network = parse_cluster(args.cluster, table), _network(args.network)
    if args.sweep is not None:
        check_sweep(args.sweep, cluster)
    if args.scaling and len(cluster.groups) > 1 and args.max_devices < cluster.devices:
        raise ValueError(
            f"--max-devices {args.max_devices} is below the mix's {cluster.devices:,} devices: "
            "--scaling of a mixed cluster adds whole copies of it; give --max-devices "
            f">= {cluster.devices:,}"
        )
    unknown = sorted(set(args.profile_map) - set(table))
    if unknown:
        raise ValueError(f"--profile-map names unknown device {unknown[0]!r}")
    return table, cluster, network


def _network(spec: str) -> Network:
    """--network, where a level it does not name keeps the default's (the library's
    `parse_network` reads one level as a flat network)."""
    given, default = parse_network(spec), parse_network(DEFAULT_NETWORK)
    levels = {part.partition("=")[0].strip().lower() for part in spec.split(";") if part.strip()}
    return Network(
        intra=given.intra if "intra" in levels else default.intra,
        inter=given.inter if "inter" in levels else default.inter,
    )
