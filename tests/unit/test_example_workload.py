"""The custom workload of docs/workloads.md (examples/my_workload.py) works as documented.

It is loaded the way `--workload examples.my_workload:workload` loads it, profiled and
trained by the real command line on in-process ranks, and the listing in docs/workloads.md
is checked to be the file itself, so the documented contract cannot go stale.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from lbtrain.profiling import load_profiles
from lbtrain.trainer.config import load_toml
from lbtrain.workloads import Workload, WorkloadPlugin, get_plugin
from tests.ranks import lbtrain_ranks

ROOT = Path(__file__).resolve().parents[2]
SPEC = "examples.my_workload:workload"
FAST = ("--time-budget", "0.2", "--threads", "1")


def test_the_spec_resolves_to_a_plugin_with_options() -> None:
    plugin = get_plugin(SPEC)
    assert isinstance(plugin, WorkloadPlugin)
    assert [option.flag for option in plugin.options] == [
        "--arms",
        "--points",
        "--noise",
        "--hidden",
    ]
    workload = plugin.make(seed=0, options={"arms": 4, "points": 50})
    assert isinstance(workload, Workload)
    assert workload.num_classes == 4 and len(workload.train_set) == 200
    # What profiling times: synthetic batches of the sample shape, through the real model.
    inputs, targets = workload.make_batch(8, "cpu")
    assert inputs.shape == (8, 2) and targets.shape == (8,)
    loss = workload.loss_fn(workload.build_model()(inputs), targets)
    assert torch.isfinite(loss)
    # Same seed, same data on every rank; another seed, other data.
    again = plugin.make(seed=0, options={"arms": 4, "points": 50})
    other = plugin.make(seed=1, options={"arms": 4, "points": 50})
    assert torch.equal(workload.train_set.tensors[0], again.train_set.tensors[0])
    assert not torch.equal(workload.train_set.tensors[0], other.train_set.tensors[0])


def test_trains_on_two_ranks_with_its_own_flag_and_artifact(tmp_path: Path) -> None:
    out = tmp_path / "run"
    job = lbtrain_ranks(
        2, "train", "--workload", SPEC, "--arms", "4", "--points", "60", "--epochs", "2",
        "--global-batch", "32", *FAST, "--quiet", "--out", str(out),
    )  # fmt: skip
    assert job.codes == [0, 0], job.output()
    rows = (out / "decision.txt").read_text().splitlines()
    assert len(rows) == 24 and all(re.fullmatch("[0-3]{24}", row) for row in rows), rows
    metrics = json.loads((out / "metrics.json").read_text())
    assert "accuracy" in json.dumps(metrics)
    config = load_toml(out / "config.toml")
    assert config["workload"] == SPEC and config["workload_options"]["arms"] == 4


def test_profiles_with_the_profile_verb(tmp_path: Path) -> None:
    output = tmp_path / "spirals.json"
    job = lbtrain_ranks(1, "profile", "--workload", SPEC, *FAST, "--output", str(output))
    assert job.codes == [0], job.output()
    (profile,) = load_profiles(output)
    assert profile.workload == "spirals" and profile.beta > 0 and len(profile.batch_sizes) >= 2


def test_the_docs_list_the_file_as_it_is() -> None:
    text = (ROOT / "docs" / "workloads.md").read_text()
    listing = re.search(r"```python\n(\"\"\"A complete custom workload.*?)```", text, re.S)
    assert listing, "docs/workloads.md should list examples/my_workload.py in full"
    assert listing.group(1) == (ROOT / "examples" / "my_workload.py").read_text(), (
        "docs/workloads.md and examples/my_workload.py differ: paste the file into the docs"
    )
