"""FLOP and bytes counted from a workload's model (`lbtrain what-if --count-flops`, issue 22)."""

from __future__ import annotations

import pytest

from lbtrain import SingleProcessCommunicator
from lbtrain.cli.entry import main
from lbtrain.whatif.work import count_work
from lbtrain.workloads import toy_workload


def test_an_mlp_counts_the_flop_of_its_forward_and_backward_exactly():
    a, h, k = 64, 256, 10
    work = count_work(toy_workload(features=a, hidden=h, classes=k))
    # Three linear layers a->h->h->k: forward 2*in*out per sample each; backward the
    # weight gradient of each, and the input gradient of all but the first (its input
    # needs none).
    forward = 2 * (a * h + h * h + h * k)
    backward = forward + 2 * (h * h + h * k)
    assert work.flops_per_sample == forward + backward
    params = a * h + h + h * h + h + h * k + k
    assert work.parameters == params and work.gradient_bytes == 4 * params
    # Per sample, at least the activations are read and written; fixed, at least the
    # weights are read and their gradients written.
    assert work.bytes_per_sample >= 4 * (a + 2 * h + k)
    assert work.fixed_bytes >= 2 * 4 * params
    assert work.description == "_ToyMLP on 64 samples"


def test_the_two_batches_must_be_two_increasing_sizes():
    for batches in ((8, 8), (0, 4), (8, 4)):
        with pytest.raises(ValueError, match="two increasing sizes"):
            count_work(toy_workload(), batches=batches)


def _what_if(*args: str) -> int:
    return main(["what-if", *args], comm=SingleProcessCommunicator())


def test_what_if_counts_the_workloads_model_and_sizes_its_gradient(capsys):
    common = ["--cluster", "2x a100", "--global-batch", "64"]
    args = [*common, "--count-flops", "--dataset", "synthetic", "--model", "hamida"]
    assert _what_if(*args, "--patch-size", "5") == 0
    out = capsys.readouterr().out
    assert "work: HamidaEtAl on 32x5x5 samples" in out and "per sample (counted" in out
    assert "roofline at 50% of peak" in out
    # The counted gradient is the allreduced size unless --gradient-bytes says otherwise.
    gradient = out.split("gradient ", 1)[1].split("\n", 1)[0]
    assert gradient != "4 B"
    assert _what_if(*args, "--patch-size", "5", "--gradient-bytes", "4") == 0
    assert "gradient 4 B" in capsys.readouterr().out
    # A bigger patch is more work per sample: the count follows the options.
    assert _what_if(*args, "--patch-size", "9") == 0
    bigger = capsys.readouterr().out
    assert "32x9x9" in bigger and _gflop(bigger) > _gflop(out) > 0


def _gflop(out: str) -> float:
    """FLOP per sample from the work line ("...: 12.3 MFLOP and ...")."""
    value, unit = out.split("parameters: ", 1)[1].split(" and ", 1)[0].split()
    return float(value) * {"KFLOP": 1e3, "MFLOP": 1e6, "GFLOP": 1e9, "TFLOP": 1e12}[unit]


def test_counted_flops_refuse_profiles_of_another_workload_in_one_line(capsys):
    args = ["--cluster", "2x a100", "--global-batch", "64", "--count-flops"]
    profiles = ["--profiles", "tests/fixtures/profiles_gpu_cpu.json"]
    assert _what_if(*args, *profiles, "--dataset", "synthetic", "--model", "hamida") == 2
    err = capsys.readouterr().err
    assert "measured on workload 'patch-cnn'" in err and len(err.strip().splitlines()) == 1
    # The cheap checks come before the workload is built: a bad cluster is reported first.
    assert _what_if("--cluster", "2x nope", "--global-batch", "64", "--count-flops") == 2
    assert "nope" in capsys.readouterr().err


def test_a_model_the_meta_device_cannot_run_is_one_line_naming_the_fix():
    from torch import nn

    from lbtrain.workloads import Workload

    class NeedsValues(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(4, 3)

        def forward(self, x):
            return self.linear(x) * float(x.sum())  # a value, not a shape

    workload = Workload(name="valued", build_model=NeedsValues, sample_shape=(4,), num_classes=3)
    with pytest.raises(ValueError, match="cannot be counted on the meta device") as err:
        count_work(workload)
    assert "--flops-per-sample" in str(err.value) and "\n" not in str(err.value)
    from lbtrain.whatif.layers import count_layers

    with pytest.raises(ValueError, match="model's layers cannot be counted on the meta device"):
        count_layers(workload)


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--model", "hamida"], "--model describes a model to count: add --count-flops"),
        (
            ["--count-flops", "--flops-per-sample", "1e9"],
            "--count-flops counts the FLOP and bytes per sample",
        ),
    ],
)
def test_what_if_refuses_model_flags_it_would_ignore(extra, needle, capsys):
    assert _what_if("--cluster", "2x a100", "--global-batch", "64", *extra) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1, err
