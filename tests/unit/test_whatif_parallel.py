"""Data, spatial and pipeline parallelism in what-if: layer counts, the models' algebra, the
verdicts the issue asks for (a patch classifier stays data-parallel, a whole-scene network
does not), and bad input."""

from __future__ import annotations

import itertools

import pytest

from examples.resnet_cifar import workload as resnet44
from examples.scene_fcn import workload as scene_fcn
from lbtrain.cli.entry import main
from lbtrain.comm import SingleProcessCommunicator
from lbtrain.whatif.cluster import parse_network
from lbtrain.whatif.layers import count_layers
from lbtrain.whatif.parallel import _spatial, compare_parallelism, pipeline_stages
from lbtrain.whatif.predict import SpeedModel
from lbtrain.whatif.work import count_work
from lbtrain.workloads import patch_cnn_workload

NETWORK = parse_network("intra=150GB/s,5us; inter=100Gb/s,2us")


@pytest.fixture(scope="module")
def resnet_layers():
    return count_layers(resnet44())


def test_the_layers_add_up_to_the_whole_models_work(resnet_layers):
    work = count_work(resnet44())
    assert sum(layer.flops for layer in resnet_layers) == pytest.approx(work.flops_per_sample)
    assert sum(layer.parameter_bytes for layer in resnet_layers) == work.gradient_bytes
    first = resnet_layers[0]  # 3x3 convolution of the 3x32x32 image: one row of each side
    assert (first.spatial, first.height, first.halo_bytes) == (True, 32, 1 * 3 * 32 * 4)
    assert [layer.spatial for layer in resnet_layers[-2:]] == [False, False]  # flatten, linear
    assert all(layer.halo_bytes == 0 for layer in resnet_layers if not layer.spatial)
    # Forward about 97 M multiply-adds a sample, so about 3 x 2 x 97 M FLOP with backward;
    # autograd keeps a few MB a sample for the backward pass.
    assert 5e8 < work.flops_per_sample < 7e8 and 1e6 < work.saved_bytes_per_sample < 1e7


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_pipeline_stages_are_contiguous_and_as_light_as_the_best_cut(k):
    flops = [5.0, 1.0, 1.0, 3.0, 2.0, 2.0, 4.0]
    starts = pipeline_stages(flops, k)
    assert starts[0] == 0 and starts == sorted(set(starts)) and len(starts) == k

    def heaviest(cut):
        bounds = [*cut, len(flops)]
        return max(sum(flops[a:b]) for a, b in zip(bounds, bounds[1:], strict=False))

    best = min(heaviest([0, *rest]) for rest in itertools.combinations(range(1, len(flops)), k - 1))
    assert heaviest(starts) == pytest.approx(best)


@pytest.mark.parametrize("alpha", [0.0, 2e-3])
def test_with_samples_for_every_device_no_scheme_beats_data(resnet_layers, alpha):
    # Same compute per device (a slab of k samples is one sample's work), plus halos or a
    # pipeline's fill and drain: data parallelism is the floor when samples are plenty.
    speed = SpeedModel(alpha, 1e-4, "test")
    for devices, batch in ((4, 256), (8, 1024), (12, 1536)):
        options = compare_parallelism(resnet_layers, speed, devices, 4, NETWORK, batch)
        data = next(o for o in options if o.scheme == "data")
        assert options[0] is data
        assert all(o.compute >= data.compute * (1 - 1e-9) for o in options)


def test_a_patch_classifier_is_firmly_data_parallel():
    layers = count_layers(patch_cnn_workload())
    options = compare_parallelism(layers, SpeedModel(1e-4, 5e-5, "test"), 8, 4, NETWORK, 256)
    assert options[0].scheme == "data"
    assert options[1].step > 1.05 * options[0].step  # 7x7 patches: halos are a third of them


def test_a_whole_scene_network_with_few_samples_is_spatial():
    layers = count_layers(scene_fcn(size=256))
    options = compare_parallelism(layers, SpeedModel(1e-3, 0.05, "test"), 8, 4, NETWORK, 2)
    best, data = options[0], next(o for o in options if o.scheme == "data")
    assert best.scheme == "spatial" and best.ways == 4  # 2 scenes, 4 devices each
    assert data.step / best.step > 3
    # A slower link between the devices of a group costs the halo exchange, not the compute.
    slow = parse_network("intra=1GB/s,5us; inter=1Gb/s,2us")
    slow_options = compare_parallelism(layers, SpeedModel(1e-3, 0.05, "t"), 8, 4, slow, 2)
    spatial_slow = next(o for o in slow_options if o.scheme == "spatial")
    assert spatial_slow.communication > best.communication
    assert spatial_slow.compute == pytest.approx(best.compute)


def _cli(capsys, *argv):
    try:
        code = main(["what-if", *argv], comm=SingleProcessCommunicator())
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err


def test_the_cli_prints_the_schemes_and_a_verdict(capsys):
    code, out, err = _cli(
        capsys, "--workload", "patch-cnn", "--count-flops",
        "--cluster", "8x v100@4", "--global-batch", "256", "--parallelism",
    )  # fmt: skip
    assert code == 0, err
    table = out.split("parallelism on 8x v100 (4 a node), global batch 256")[1]
    assert "verdict: data parallelism" in table
    assert {"data", "spatial", "pipeline"} <= {line.split()[0] for line in table.splitlines()[2:5]}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--cluster", "8x v100", "--global-batch", "8", "--flops-per-sample", "1e9",
          "--gradient-bytes", "0", "--parallelism"], "add --count-flops"),
        (["--cluster", "8x v100", "--scaling", "weak", "--batch-per-device", "8",
          "--count-flops", "--workload", "examples.resnet_cifar:workload", "--parallelism"],
         "--parallelism needs --global-batch"),
    ],
)  # fmt: skip
def test_bad_parallelism_flags_are_one_line(capsys, argv, message):
    code, out, err = _cli(capsys, *argv)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and message in err, err


def test_spatial_and_pipeline_steps_equal_a_hand_computation():
    from lbtrain.whatif.layers import Layer

    # Two convolutions and a classifier; 1 MB/s links with no latency: a byte costs 1 us.
    layers = [
        Layer("conv1", 600.0, 1000.0, 10.0, True, 8, 40),
        Layer("conv2", 300.0, 500.0, 20.0, True, 8, 40),
        Layer("fc", 100.0, 4.0, 0.0, False, 0, 20),
    ]
    flat = parse_network("intra=1MB/s,0us")
    speed = SpeedModel(0.0, 1.0, "test")  # 1 s a sample: a FLOP is 1 ms of the 1,000
    # 4 devices, 2 samples: spatial over 2 = 2 groups of 1 sample, half of each slab.
    options = {o.scheme: o for o in compare_parallelism(layers, speed, 4, 4, flat, 2)}
    spatial = options["spatial"]
    assert spatial.ways == 2
    assert spatial.compute == pytest.approx((900 / 2 + 100) / 1000)
    # halos: 2 x (10 + 20) bytes; gather of conv2's 500 bytes, forward only: 500 x 1/2
    assert spatial.communication == pytest.approx((2 * 30 + 250) * 1e-6)
    data = options["data"]
    assert data.compute == pytest.approx(1.0) and data.communication == 0
    # pipeline over 2 stages: [conv1 | conv2, fc] (600 and 400 FLOP); 1 sample, m = 1:
    # (1 + 2 - 1) slots of 0.6 s + 2 x 1000 bytes of conv1's output
    pipeline = options["pipeline"]
    assert (pipeline.ways, pipeline.microbatches) == (2, 1)
    assert pipeline.compute == pytest.approx(2 * 0.6)
    assert pipeline.communication == pytest.approx(2 * 2 * 1000e-6)


def test_given_gradient_bytes_replace_the_parameters_and_groups_across_nodes_use_that_link():
    from lbtrain.whatif.layers import Layer

    layers = [
        Layer("conv1", 600.0, 1000.0, 10.0, True, 8, 40),
        Layer("conv2", 300.0, 500.0, 20.0, True, 8, 40),
        Layer("fc", 100.0, 4.0, 0.0, False, 0, 20),
    ]
    speed = SpeedModel(0.0, 1.0, "test")
    flat = parse_network("intra=1MB/s,0us")
    counted = {o.scheme: o for o in compare_parallelism(layers, speed, 4, 4, flat, 2)}
    given = {o.scheme: o for o in compare_parallelism(layers, speed, 4, 4, flat, 2, 10**6)}
    assert given["data"].sync > 1000 * counted["data"].sync  # 1 MB, not 100 bytes
    assert given["data"].compute == counted["data"].compute
    # 12 devices, 6 a node: groups of 3 tile the nodes (the fast link), groups of 4
    # straddle two nodes (the slow one, 1,000 times slower here).
    two = parse_network("intra=1GB/s,0us; inter=1MB/s,0us")
    three, four = (_spatial(layers, speed, 12, k, 6, two, 3) for k in (3, 4))
    assert four.communication > 500 * three.communication


def test_an_even_kernel_reads_a_row_beyond_its_slab():
    import torch

    from lbtrain.workloads import Workload

    workload = Workload(
        name="even", build_model=lambda: torch.nn.Sequential(torch.nn.Conv2d(1, 1, 2)),
        sample_shape=(1, 8, 8), num_classes=2, loss_fn=lambda out, _t: out.mean(),
    )  # fmt: skip
    (conv,) = count_layers(workload)
    assert conv.halo_bytes == 1 * 8 * 4  # one row of 8 pixels of one channel, FP32


def test_a_model_of_branches_is_refused_not_cut_as_a_chain():
    import torch

    from lbtrain.workloads import Workload

    class Branches(torch.nn.Module):
        """Two convolutions of the same input, as an ensemble's members are."""

        def __init__(self) -> None:
            super().__init__()
            self.left, self.right = torch.nn.Conv2d(1, 2, 3), torch.nn.Conv2d(1, 2, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (self.left(x) + self.right(x)).mean((2, 3))

    branches = Workload(
        name="branches", build_model=Branches, sample_shape=(1, 8, 8), num_classes=2,
        loss_fn=torch.nn.functional.cross_entropy,
    )  # fmt: skip
    with pytest.raises(ValueError, match="^--parallelism models a chain of layers, but") as err:
        count_layers(branches)
    assert "\n" not in str(err.value) and "leave out --parallelism" in str(err.value)
