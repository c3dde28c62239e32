"""A profiles file is data from outside: any JSON loads or gives one ValueError naming it."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from lbtrain.profiling import load_profiles, save_profiles
from lbtrain.profiling.record import ProfileFileError, ReplicaProfile
from tests.unit.test_profiling import _profile

FIELDS = [name for name in ReplicaProfile.__dataclass_fields__]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=12,
)


def _good_file(tmp_path):
    path = save_profiles(tmp_path / "p.json", [_profile(0), _profile(1)])
    return path, json.loads(path.read_text())


def _load(path, content: object):
    path.write_text(json.dumps(content), encoding="utf-8")  # NaN and Infinity included
    return load_profiles(path)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(content=json_values)
def test_any_json_at_all_loads_or_names_the_file(tmp_path, content):
    path = tmp_path / "any.json"
    try:
        _load(path, content)
    except ProfileFileError as exc:
        assert str(path) in str(exc) and "\n" not in str(exc)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(record=st.integers(0, 1), field=st.sampled_from(FIELDS), value=json_values)
# Found by this test in a fresh clone on 2026-11-25: a step time that overflowed the fit's
# sums of squares, and one below alpha whose message named alpha but not step_times.
@example(record=0, field="step_times", value=[1, 1.3407807929942597e154])
@example(record=0, field="step_times", value=[1, 0.0078125])
def test_any_value_in_any_field_loads_or_names_file_record_and_field(
    tmp_path, record, field, value
):
    path, data = _good_file(tmp_path)
    data["profiles"][record][field] = value
    try:
        profiles = _load(path, data)
    except ProfileFileError as exc:
        message = str(exc)
        assert str(path) in message and "\n" not in message
        # The record, and the field: by name, or as the pair it breaks (rank order, sync).
        assert f"profiles[{record}]" in message or field == "rank", message
        assert field in message or field in ("rank", "sync_time", "sync_bytes", "sync_ranks")
    else:  # what loads is usable: the balancer's view of every record is valid numbers
        for profile in profiles:
            speed = profile.replica_speed()
            assert math.isfinite(speed.throughput) and speed.throughput > 0


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"alpha": 0.05}, "alpha=0.05 is larger than the smallest of step_times"),
        ({"batch_sizes": [20, 10]}, "batch_sizes=.* must be increasing"),
        ({"batch_sizes": [10, 20.5]}, "batch_sizes=.* whole numbers"),
        ({"batch_sizes": [0, 20]}, "batch_sizes=.* whole numbers >= 1"),
        ({"threads": -2}, "threads=-2"),
        ({"slowdown": float("nan")}, "slowdown=nan must be finite"),
        ({"slowdown": 0.5}, "slowdown=0.5 must be >= 1.0"),
        ({"step_times": [0.02]}, "batch_sizes holds 2 entries but step_times 1"),
        ({"started_at": "yesterday"}, "started_at='yesterday' must be an ISO 8601"),
        ({"cap": True}, "cap=True"),
        # The throughput comes from the line: an edited beta makes rank 1 look 2.5x faster.
        (
            {"beta": 0.0001},
            r"beta=0.0001 with alpha=0.01 gives 0.011 s .* batch 10, but the fit .* gives 0.02 s",
        ),
        (
            {"step_times": [0.02, 0.09]},
            r"beta=0.001 with alpha=0.01 gives 0.02 s .* the fit .* step_times gives 0.02412 s",
        ),
    ],
)
def test_values_are_checked_against_their_range_and_each_other(tmp_path, changes, needle):
    path, data = _good_file(tmp_path)
    data["profiles"][1].update(changes)
    with pytest.raises(ProfileFileError, match=rf"profiles\[1\] is invalid: field {needle}"):
        _load(path, data)


def test_a_file_that_is_not_text_names_the_file(tmp_path):
    path = tmp_path / "binary.json"
    path.write_bytes(b"\xff\xfe\x00garbage\x9c")
    with pytest.raises(ProfileFileError, match=r"binary\.json.*not UTF-8"):
        load_profiles(path)


def test_json_nested_too_deeply_names_the_file(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000, encoding="utf-8")
    with pytest.raises(ProfileFileError, match=r"deep\.json"):
        load_profiles(path)
