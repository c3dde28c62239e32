"""FLOP and bytes counted from a workload's model (`lbtrain what-if --count-flops`, issue 22)."""

from __future__ import annotations

import pytest

from lbtrain import SingleProcessCommunicator
from lbtrain.cli.main import main
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
    assert "32x9x9" in bigger


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
