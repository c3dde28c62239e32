"""lbtrain.whatif.subset: which whole entries of a cluster are worth their place."""

from __future__ import annotations

import itertools

import pytest

from lbtrain.cli.entry import main
from lbtrain.comm import SingleProcessCommunicator
from lbtrain.whatif.cluster import parse_cluster, parse_network
from lbtrain.whatif.predict import SpeedModel, predict
from lbtrain.whatif.subset import EXHAUSTIVE, best_subset

SPEEDS = {"h100": SpeedModel(1e-3, 1e-4, "test"), "cpu-core": SpeedModel(2e-3, 1e-3, "test")}
NETWORK = parse_network("intra=100GB/s,5us; inter=10Gb/s,2us")


def test_cores_that_cost_more_sync_than_they_save_are_left_out():
    cluster = parse_cluster("4x h100, 64x cpu-core@16")
    best = best_subset(cluster, NETWORK, SPEEDS, 4096, gradient_bytes=100 * 10**6)
    assert best.counts[1] == 0 and best.counts[0] >= 1
    whole = predict(cluster, NETWORK, SPEEDS, 4096, gradient_bytes=100 * 10**6)
    assert best.prediction.step < whole.step


def test_cores_that_help_and_cost_no_sync_stay():
    cluster = parse_cluster("2x h100, 64x cpu-core@16")
    best = best_subset(cluster, NETWORK, SPEEDS, 4096, gradient_bytes=0)
    assert best.counts == (2, 64)


def test_a_fifth_gpu_on_its_own_node_is_not_worth_a_large_sync():
    cluster = parse_cluster("4x h100@4, 1x h100")
    speeds = {"h100": SpeedModel(1e-3, 1e-3, "test")}  # 512 samples: 0.5 s on one GPU
    assert best_subset(cluster, NETWORK, speeds, 512, gradient_bytes=10**9).counts == (4, 0)
    # With nothing to sync, the fifth GPU only adds compute: it stays.
    assert best_subset(cluster, NETWORK, speeds, 512, gradient_bytes=0).counts == (4, 1)
    # One entry of 9 on nodes of 8: the ninth GPU opens a node; the search finds 8.
    nine = parse_cluster("9x h100@8")
    assert best_subset(nine, NETWORK, speeds, 512, gradient_bytes=10**9).counts == (8,)


def test_the_best_subset_is_the_fastest_of_every_count_tried():
    cluster = parse_cluster("2x h100, 3x cpu-core@4, 1x h100@1")
    best = best_subset(cluster, NETWORK, SPEEDS, 600, gradient_bytes=10**7)
    entries = ("h100", "cpu-core@4", "h100@1")
    steps = []
    for counts in itertools.product(range(3), range(4), range(2)):
        if not any(counts):
            continue
        part = parse_cluster(
            ", ".join(f"{c}x {e}" for c, e in zip(counts, entries, strict=True) if c)
        )
        steps.append(predict(part, NETWORK, SPEEDS, 600, gradient_bytes=10**7).step)
    # Every count of these small entries is a candidate (powers of two and whole nodes).
    assert best.prediction.step == pytest.approx(min(steps))


def test_many_entries_are_searched_one_at_a_time_and_small_batches_skip_subsets():
    # 2 candidates (0 and 1) for each of 13 entries: 8,192 combinations, over EXHAUSTIVE,
    # so coordinate descent; a large sync leaves one GPU.
    many = parse_cluster(", ".join(["1x h100"] * 13))
    assert 2**13 > EXHAUSTIVE
    best = best_subset(many, NETWORK, SPEEDS, 4096, gradient_bytes=10**9)
    assert sum(best.counts) == 1
    # Under `equal` every device needs a sample: 3 samples fit 2 GPUs and not the cores.
    cluster = parse_cluster("2x h100, 4x cpu-core")
    assert best_subset(cluster, NETWORK, SPEEDS, 3, "equal").counts[1] == 0


def test_the_cli_says_which_entries_to_leave_out(capsys):
    code = main(["what-if", "--cluster", "4x h100, 64x cpu-core@16", "--profiles",
                 "tests/fixtures/profiles_gpu_cpu.json", "--global-batch", "4096",
                 "--gradient-bytes", "100e6"], comm=SingleProcessCommunicator())  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    assert "best subset  4x h100, leaving out 64x cpu-core" in out
    code = main(["what-if", "--cluster", "9x h100@8", "--flops-per-sample", "1e9",
                 "--global-batch", "512", "--gradient-bytes", "1e9"],
                comm=SingleProcessCommunicator())  # fmt: skip
    assert code == 0
    assert "best subset  8 of 9x h100:" in capsys.readouterr().out


def test_memory_caps_follow_the_devices_memory_and_bound_the_plan():
    from lbtrain.whatif.devices import BUILTIN_DEVICES
    from lbtrain.whatif.memory import STATE_BYTES_PER_PARAMETER, USABLE_MEMORY, memory_caps

    t4, core = BUILTIN_DEVICES["t4"], BUILTIN_DEVICES["cpu-core"]
    caps = memory_caps([t4, core], parameters=10**6, saved_bytes_per_sample=4e6)
    expected = (t4.memory * USABLE_MEMORY - 10**6 * STATE_BYTES_PER_PARAMETER) // 4e6
    assert caps == {"t4": expected}  # CPU cores share the host's memory: no cap
    assert memory_caps([t4], 10**6, 0.0) == {}  # activations not counted: no cap
    with pytest.raises(ValueError, match="'t4': 16 GB cannot hold"):
        memory_caps([t4], parameters=10**9, saved_bytes_per_sample=4e6)
    # A cap of 100 samples a T4 moves the rest of the batch to the cores.
    speeds = {"t4": SpeedModel(1e-3, 1e-5, "test"), "cpu-core": SpeedModel(2e-3, 1e-3, "test")}
    cluster = parse_cluster("2x t4, 16x cpu-core@16")
    free = predict(cluster, NETWORK, speeds, 1000)
    capped = predict(cluster, NETWORK, speeds, 1000, caps={"t4": 100})
    assert free.groups[0].batch_max > 100 and capped.groups[0].batch_max == 100
    assert capped.groups[1].batch_max > free.groups[1].batch_max
    assert capped.step > free.step
    with pytest.raises(ValueError, match="does not fit the devices' memory"):
        predict(parse_cluster("2x t4"), NETWORK, speeds, 201, caps={"t4": 100})


def test_the_cli_caps_counted_models_by_memory(capsys):
    # patch-cnn saves 15,168 bytes a sample for backward: a 16 GB T4 holds 949,269 samples.
    argv = ["what-if", "--workload", "patch-cnn", "--count-flops", "--cluster", "4x t4"]
    code = main([*argv, "--global-batch", "8192"], comm=SingleProcessCommunicator())
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "memory: at most t4 949,269 samples a device" in out
    code = main([*argv, "--global-batch", "4000000"], comm=SingleProcessCommunicator())
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert "does not fit the devices' memory" in err and len(err.strip().splitlines()) == 1


def test_a_mix_scales_as_copies_of_every_entry():
    from lbtrain.whatif.mix import mix_scaling

    cluster = parse_cluster("2x h100, 8x cpu-core@8")
    # Weak scaling with no bytes to sync: f copies do f times the work in the same step,
    # less a few microseconds of latency in the larger allreduce.
    rows = mix_scaling(cluster, [1, 2, 4], NETWORK, SPEEDS, 64, weak=True)
    assert [r.speedup for r in rows] == pytest.approx([1, 2, 4], rel=1e-3)
    assert rows[2].speedup < 4
    assert [r.global_batch for r in rows] == [640, 1280, 2560]
    # Strong scaling with a sync: below perfect, and each row is that cluster's prediction.
    rows = mix_scaling(cluster, [1, 2, 4], NETWORK, SPEEDS, 4096, gradient_bytes=10**7)
    assert all(r.efficiency <= 1 + 1e-12 for r in rows) and rows[-1].speedup > 1
    four = predict(parse_cluster("8x h100, 32x cpu-core@8"), NETWORK, SPEEDS, 4096,
                   gradient_bytes=10**7)  # fmt: skip
    assert rows[-1].step == pytest.approx(four.step)


def test_the_cli_scales_a_mix_by_copies(capsys):
    code = main(["what-if", "--cluster", "4x h100, 64x cpu-core@16", "--profiles",
                 "tests/fixtures/profiles_gpu_cpu.json", "--gradient-bytes", "1e7", "--scaling",
                 "weak", "--batch-per-device", "64", "--max-devices", "300"],
                comm=SingleProcessCommunicator())  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    table = out.split("weak scaling of the mix 4x h100 + 64x cpu-core")[1].splitlines()
    assert table[1].split()[0] == "copies"
    assert [int(line.split()[0]) for line in table[2:] if line.strip()] == [1, 2, 4]


def test_scaling_starts_where_the_batch_fits_and_a_mix_needs_room_for_one_copy(capsys):
    argv = ["what-if", "--workload", "patch-cnn", "--count-flops", "--cluster", "8x t4",
            "--global-batch", "2000000"]  # fmt: skip
    code = main([*argv, "--scaling", "strong", "--max-devices", "8"],
                comm=SingleProcessCommunicator())  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    table = out.split("global batch 2,000,000; speedup against 4 devices)")[1]
    rows = [line.split() for line in table.splitlines()[2:] if line.strip()]
    assert [int(r[0]) for r in rows] == [4, 8]  # 2 T4s hold 1,898,538 samples, 4 hold it
    assert float(rows[1][4]) == pytest.approx(2.0, rel=0.02)
    code = main([*argv, "--scaling", "weak", "--batch-per-device", "1000000"],
                comm=SingleProcessCommunicator())  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and "--batch-per-device is more than a device holds" in err
    assert err.rstrip().endswith("; lower --batch-per-device") and "add devices" not in err, err
    code = main(["what-if", "--cluster", "4x h100, 2x t4", "--flops-per-sample", "1e9",
                 "--gradient-bytes", "0", "--global-batch", "64", "--scaling", "strong",
                 "--max-devices", "3"], comm=SingleProcessCommunicator())  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and "--max-devices 3 is below the mix's 6 devices" in err
