"""`lbtrain what-if`: the predicted step of a cluster one does not have (issue 22)."""

from __future__ import annotations

import argparse
from statistics import median
from typing import Any

from lbtrain.balancer import POLICIES
from lbtrain.cli.common import (
    add_workload_options,
    given_workload_options,
    non_negative_int,
    positive_float,
    positive_int,
)
from lbtrain.cli.flags import file_name
from lbtrain.cli.whatif_checks import (
    DEFAULT_MAX_DEVICES,
    DEFAULT_NETWORK,
    bytes_type,
    check_profile_map,
    checked_cluster,
    profile_map_type,
)
from lbtrain.cli.whatif_format import (
    format_prediction,
    format_scaling,
    format_subset,
    plot_scaling,
)
from lbtrain.cli.whatif_parallel import format_parallelism
from lbtrain.cli.whatif_sweep import format_sweep, plot_sweep, sweep_type
from lbtrain.comm import Communicator
from lbtrain.outputs import writing
from lbtrain.profiling import load_profiles
from lbtrain.whatif.cluster import Cluster, Network
from lbtrain.whatif.devices import BUILTIN_DEVICES
from lbtrain.whatif.memory import memory_caps
from lbtrain.whatif.mix import mix_scaling
from lbtrain.whatif.predict import Roofline, predict, scaling, speed_models
from lbtrain.whatif.subset import best_subset
from lbtrain.whatif.sweep import AXES, sweep
from lbtrain.whatif.work import ModelWork
from lbtrain.workloads import DEFAULT_WORKLOAD, get_plugin

__all__ = ["add_parser", "run"]

DESCRIPTION = f"""\
Predict one training step on a cluster you do not have: each device is one replica whose
step is alpha + beta x batch seconds, from --profiles where one matches it (GPU names match
cuda profiles whose device name holds them, cpu-core matches cpu profiles, beta x threads),
else a roofline on the FLOP and bytes of one sample's training step at a fraction of the
device's peak (calibrated by any profile of its kind, else 50%): --flops-per-sample and
--bytes-per-sample, or --count-flops to count them from the workload's model (its forward,
loss and backward on the meta device, under torch.utils.flop_counter; the bytes are what
every operator reads and writes, an upper bound). The global batch is planned by
--policy; the gradient sync is a hierarchical allreduce (intra-node, then inter-node, the
fastest of ring, recursive doubling, binomial tree and Rabenseifner at each level). Needs no
launcher, e.g.

  lbtrain what-if --cluster "4x h100, 64x cpu-core@16" --global-batch 4096 \\
      --flops-per-sample 1.2e9 --bytes-per-sample 3e6 --gradient-bytes 100e6
  lbtrain what-if --cluster "8x a100@4" --global-batch 1024 --count-flops --model hybridsn
  lbtrain what-if --cluster "32x v100@4" --global-batch 4096 --flops-per-sample 6e8 \\
      --gradient-bytes 3e6 --sweep link=1Gb/s,10Gb/s,25Gb/s,100Gb/s

With --count-flops, each GPU's batch is capped by its memory (the model's state and the
activations autograd saves per sample). A cluster of several entries also gets the best
subset of whole entries: every device syncs, so an entry can cost more than it brings.

--sweep AXIS=V1,V2,... predicts one step per value of one of the analytical model's five
axes ({", ".join(AXES)}): the global
batch, the count of a one-entry cluster, the bandwidth between nodes, or every device's
peak FLOP/s or memory bandwidth as a factor of the table's (roofline devices only).

Devices: {", ".join(sorted(BUILTIN_DEVICES))} (more with
--devices-file). Checked against runs on one 2-core machine from a one-rank profile: 2 ranks
within 2-7% (16-26% on a loaded hour), 3 ranks sharing the 2 cores 24-41% short (ranks that
share a core slow each other, which is not modelled); against
PyTorch DDP's published 10.11x on 12 V100s it predicts 11.60x (BENCHMARKS.md).

--parallelism sets data parallelism beside spatial decomposition (each image's rows split
over k devices, halos exchanged per convolution; Dryden et al. 2019) and a layer-wise
pipeline of k stages (GPipe-style micro-batches), each at its best k, from the model's
layers counted on the meta device. On a mixed cluster, groups and pipelines are of one kind
each and share the batch by speed.
"""


def add_parser(
    subparsers: argparse._SubParsersAction, workload: str = DEFAULT_WORKLOAD
) -> argparse.ArgumentParser:
    """Register the `what-if` verb, with the options of `workload` (read ahead)."""
    parser = subparsers.add_parser(
        "what-if",
        help="predict step time and throughput on a cluster you do not have",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_cluster_options(parser.add_argument)
    _add_speed_options(parser.add_argument)
    _add_output_options(parser.add_argument)
    parser.set_defaults(run=run, workload_flags=add_workload_options(parser, workload))
    return parser


def _add_cluster_options(add: Any) -> None:
    """The cluster, its network and how the global batch is shared."""
    add(
        "--cluster",
        required=True,
        help='devices, e.g. "4x h100, 64x cpu-core@16", @ per node (default: none, required)',
    )
    add(
        "--network",
        default=DEFAULT_NETWORK,
        help=f'links; a level left out keeps its default (default: "{DEFAULT_NETWORK}")',
    )
    add(
        "--global-batch",
        type=positive_int,
        help="samples per step, needed except with --scaling weak (default: none)",
    )
    add("--policy", choices=POLICIES, default="cost", help="batch sharing (default: cost)")
    add(
        "--min-batch",
        type=non_negative_int,
        default=0,
        help="least batch a device gets (default: 0, zero shares allowed)",
    )


def _add_speed_options(add: Any) -> None:
    """Where each device's speed comes from: profiles, a device table, a roofline's work."""
    add("--profiles", type=file_name,
        help="profiles file of `lbtrain profile`: measured alpha and beta (default: none, "
        "the roofline)")  # fmt: skip
    add("--workload", help="the workload (as `lbtrain train` names it) whose model "
        "--count-flops counts; given, profiles of any other workload are refused (default: "
        f"{DEFAULT_WORKLOAD})")  # fmt: skip
    add("--profile-map", type=profile_map_type, default={}, metavar="NAME=KEY[,...]",
        help="NAME takes the profiles of device kind KEY, or whose name holds KEY (default: "
        "GPUs by name, cpu-core every cpu profile)")  # fmt: skip
    add(
        "--devices-file",
        type=file_name,
        help="TOML/JSON table of more devices, SI units (default: the built-in table)",
    )
    add(
        "--flops-per-sample",
        type=positive_float,
        help="FLOP of one sample's training step (default: none)",
    )
    add(
        "--bytes-per-sample",
        type=positive_float,
        help="memory bytes moved per sample's step (default: none)",
    )
    add("--count-flops", action="store_true",
        help="count FLOP and bytes per sample (and the gradient bytes) from the workload's "
        "model, with the workload options below (default: the flags above give them)")  # fmt: skip
    add(
        "--gradient-bytes",
        type=bytes_type,
        help="bytes allreduced per step (default: the profiles' or the counted model's)",
    )


def _add_output_options(add: Any) -> None:
    """What is predicted beside the step: scaling, a sweep, parallelism, a picture."""
    add("--scaling", choices=("strong", "weak"), help="also print a scaling table (default: none)")
    add(
        "--max-devices",
        type=positive_int,
        help=f"--scaling up to N devices (default: {DEFAULT_MAX_DEVICES})",
    )
    add(
        "--batch-per-device",
        type=positive_int,
        help="per-device batch of --scaling weak (default: none)",
    )
    add("--sweep", type=sweep_type, metavar="AXIS=V1,V2,...",
        help=f"one prediction per value of one axis: {', '.join(AXES)} (e.g. "
        "link=10Gb/s,100Gb/s or flops=0.5,1,2) (default: none)")  # fmt: skip
    add("--parallelism", action="store_true",
        help="compare data, spatial and pipeline parallelism on the cluster's devices (needs "
        "--count-flops and --global-batch) (default: data parallelism only)")  # fmt: skip
    add("--plot", type=file_name, help="write the scaling table or the sweep as an image, "
        "needs matplotlib (default: none)")  # fmt: skip


def run(args: argparse.Namespace, comm: Communicator) -> int:
    """Check every input, predict, and print on rank 0 (one process does the arithmetic)."""
    if comm.rank != 0:
        return 0
    table, cluster, network = checked_cluster(args)
    profiles = _profiles(args)
    check_profile_map(args.profile_map, profiles)
    # Last, as it builds the workload (its data included): every cheap check came first.
    workload, work = _counted_work(args, profiles)
    roofline = _roofline(args, work)
    devices = [group.device for group in cluster.groups]
    speeds = speed_models(devices, profiles, roofline, args.profile_map, table.values())
    gradient_bytes = _gradient_bytes(args, profiles, work)
    # Memory bounds a device's batch only where the model's activations were counted.
    caps = {} if work is None else memory_caps(
        devices, work.parameters, work.saved_bytes_per_sample
    )  # fmt: skip
    # Everything that can fail runs before the first line is printed: the blocks are made
    # first, then printed, then the picture drawn.
    blocks: list[str] = []
    drawn: Any = None
    if args.global_batch is not None:
        result = predict(
            cluster, network, speeds, args.global_batch, args.policy, gradient_bytes,
            args.min_batch, caps,
        )  # fmt: skip
        blocks.append(format_prediction(cluster, network, result, gradient_bytes, work, caps))
        if cluster.devices > 1:
            best = best_subset(cluster, network, speeds, args.global_batch, args.policy,
                               gradient_bytes, args.min_batch, caps)  # fmt: skip
            blocks.append(format_subset(cluster, best, result))
    if args.scaling:
        rows, name, unit = _scaling(args, cluster, network, speeds, gradient_bytes, caps)
        batch = args.batch_per_device if args.scaling == "weak" else args.global_batch
        blocks.append(format_scaling(name, args.scaling, batch, rows, unit))
        drawn = lambda: plot_scaling(rows, args.scaling, args.plot, unit)  # noqa: E731
    if args.parallelism:
        blocks.append(
            _parallelism(cluster, network, speeds, args.global_batch, workload, gradient_bytes)
        )
    if args.sweep is not None:
        points = sweep(
            args.sweep, cluster, network,
            lambda devs: speed_models(devs, profiles, roofline, args.profile_map, table.values()),
            args.global_batch, args.policy, gradient_bytes, args.min_batch, caps,
        )  # fmt: skip
        blocks.append(format_sweep(args.sweep.axis, points))
        drawn = lambda: plot_sweep(args.sweep.axis, points, args.plot)  # noqa: E731
    _show(blocks, drawn, args.plot)
    return 0


def _roofline(args: argparse.Namespace, work: ModelWork | None) -> Roofline | None:
    """The roofline's work per sample: counted (--count-flops), given, or none."""
    if work is not None:
        return Roofline(work.flops_per_sample, work.bytes_per_sample)
    if args.flops_per_sample or args.bytes_per_sample:
        return Roofline(args.flops_per_sample or 0.0, args.bytes_per_sample or 0.0)
    return None


def _show(blocks: list[str], drawn: Any, plot: str | None) -> None:
    """Print the blocks, then draw the picture (made last: everything that can fail ran)."""
    print("\n".join(blocks))
    if plot and drawn is not None:
        with writing("--plot", plot):  # a disk that filled meanwhile: one line
            written = drawn()
        print(f"\nplot written to {written}")


def _counted_work(args: argparse.Namespace, profiles: list[Any]) -> tuple[Any, ModelWork | None]:
    """The work counted from the workload's model under --count-flops (None without it);
    `profiles` must then be of that model and sample shape."""
    spec = args.workload or DEFAULT_WORKLOAD
    options = given_workload_options(args, spec)
    if not args.count_flops:
        if options:
            flags = " ".join(f"--{name.replace('_', '-')}" for name in options)
            verb = "describes" if len(options) == 1 else "describe"
            raise ValueError(f"{flags} {verb} a model to count: add --count-flops, or drop {flags}")
        return None, None
    from lbtrain.trainer.initial_plan import check_profiled
    from lbtrain.whatif.work import count_work  # imports torch's flop counter

    plugin = get_plugin(spec)
    # No map: only the model and its sample shape are needed (and no matplotlib).
    resolved = plugin.resolve_options({"map": False, **options} if _has_map(plugin) else options)
    if plugin.fetch is not None:
        plugin.fetch(**resolved)
    workload = plugin.make(0, resolved)
    if profiles:
        # Their speeds stand beside the counted roofline and calibrate it: of this model only.
        try:
            check_profiled(profiles, workload, args.profiles)
        except ValueError as exc:
            raise ValueError(_whatif_fix(str(exc))) from None
    return workload, count_work(workload)


def _whatif_fix(message: str) -> str:
    """A profiles error in what-if's words: what-if never profiles, so the fix it offers is
    a profile of the model, or the counted roofline alone."""
    return message.replace(
        "leave the profiles file out to profile it now",
        "leave --profiles out to predict from the counted FLOPs alone",
    ).replace(
        "or omit --profiles to profile now",
        "or leave --profiles out to predict from --flops-per-sample or --count-flops",
    )


def _parallelism(
    cluster: Cluster,
    network: Network,
    speeds: dict[str, Any],
    batch: int,
    workload: Any,
    gradient_bytes: int,
) -> str:
    """The --parallelism table: each scheme at its best k on the cluster's devices (groups
    and pipelines of one kind each, sharing the batch by speed, on a mixed cluster)."""
    from lbtrain.whatif.layers import count_layers
    from lbtrain.whatif.parallel import compare_parallelism
    from lbtrain.whatif.parallel_mixed import compare_mixed

    layers = count_layers(workload)
    if len(cluster.groups) > 1:
        options = compare_mixed(layers, cluster, network, speeds, batch, gradient_bytes)
    else:
        group = cluster.groups[0]
        options = compare_parallelism(
            layers, speeds[group.device.name], group.count, group.per_node, network, batch,
            gradient_bytes,
        )  # fmt: skip
    return format_parallelism(cluster, options)


def _scaling(
    args: argparse.Namespace,
    cluster: Cluster,
    network: Network,
    speeds: dict[str, Any],
    gradient_bytes: int,
    caps: dict[str, float],
) -> tuple[list[Any], str, str]:
    """The scaling rows, what scales and its unit: devices of a one-entry cluster, copies of
    a mixed one (each entry times f, up to --max-devices devices in all)."""
    weak = args.scaling == "weak"
    batch = args.batch_per_device if weak else args.global_batch
    if len(cluster.groups) == 1:
        group = cluster.groups[0]
        counts = _counts(args.max_devices)
        rows = scaling(group.device, counts, network, speeds, batch, weak, gradient_bytes,
                       group.per_node, caps)  # fmt: skip
        return rows, group.device.name, "devices"
    copies = _counts(max(1, args.max_devices // cluster.devices))
    rows = mix_scaling(cluster, copies, network, speeds, batch, weak, args.policy,
                       gradient_bytes, caps)  # fmt: skip
    mix = " + ".join(f"{g.count:,}x {g.device.name}" for g in cluster.groups)
    return rows, f"the mix {mix}", "copies"


def _has_map(plugin: Any) -> bool:
    return any(option.name == "map" for option in plugin.options)


def _profiles(args: argparse.Namespace) -> list[Any]:
    """The profiles of --profiles, of --workload's workload when it is given."""
    try:
        profiles = [] if args.profiles is None else load_profiles(args.profiles)
    except ValueError as exc:
        raise type(exc)(_whatif_fix(str(exc))) from None
    workloads = sorted({p.workload for p in profiles})
    if len(workloads) > 1 and not args.workload:
        raise ValueError(
            f"--profiles {args.profiles!r} mixes workloads {', '.join(workloads)}: name the "
            "one to predict with --workload"
        )
    profiles = [p for p in profiles if not args.workload or p.workload == args.workload]
    other = [w for w in workloads if args.workload and w != args.workload]
    if other and not profiles:
        raise ValueError(
            f"--profiles {args.profiles!r} holds profiles of workload {other[0]!r}, "
            f"not --workload {args.workload!r}: profile that workload or drop --workload"
        )
    return profiles


def _gradient_bytes(args: argparse.Namespace, profiles: list[Any], work: ModelWork | None) -> int:
    if args.gradient_bytes is not None:
        return args.gradient_bytes
    if work is not None:
        return work.gradient_bytes
    measured = [p.sync_bytes for p in profiles if p.sync_bytes is not None]
    if not measured:
        raise ValueError(
            "--gradient-bytes is required: the profiles (if any) record no sync bytes; give "
            "the model's gradient size, e.g. 4 x its parameters for FP32"
        )
    return int(median(measured))


def _counts(largest: int) -> list[int]:
    counts = [1 << k for k in range(largest.bit_length()) if 1 << k <= largest]
    return counts if counts[-1] == largest else [*counts, largest]
