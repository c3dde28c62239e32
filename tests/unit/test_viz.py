"""lbtrain.viz: metrics records, curves, the Perfetto trace, its pictures, TensorBoard.

Fast and in-process: synthetic records and spans, pictures written to tmp_path.
"""

from __future__ import annotations

import copy
import json
import math
import pickle
import sys
from pathlib import Path

import pytest

from lbtrain.viz import (
    MetricsStream,
    StepTrace,
    check_trace,
    chrome_trace,
    compare_timelines,
    draw_curves,
    epoch_records,
    eval_series,
    plot_curves,
    read_metrics,
    render_timeline,
    replan_epochs,
    resume_epochs,
    step_window,
    truncate_after,
    write_trace,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def start(resumed_at=None, batch_sizes=(22, 21, 21)):
    return {
        "type": "start",
        "time": 1.7e9,
        "world_size": 3,
        "policy": "cost",
        "global_batch": 64,
        "epochs": 8,
        "batch_sizes": list(batch_sizes),
        "devices": ["cpu x1", "cpu x2", "cpu x4"],
        "resumed_at": resumed_at,
    }


def epoch(e, loss=None, accuracy=0.5, replan=None, batch_sizes=(22, 21, 21)):
    seconds = 4.0
    return {
        "type": "epoch",
        "epoch": e,
        "time": 1.7e9 + e,
        "steps": 35,
        "samples": 2240,
        "loss": 1.0 / e if loss is None else loss,
        "accuracy": accuracy,
        "lr": 1e-3,
        "seconds": seconds,
        "step_seconds": 0.1,
        "predicted_step_seconds": 0.09,
        "idle_fraction": 0.3,
        "batch_sizes": list(batch_sizes),
        "ranks": [
            {
                "rank": r,
                "samples": 700,
                "compute": 2.0 + r,
                "wait": 2.0 - r,
                "comm": 0.1,
                "seconds": seconds,
            }
            for r in range(3)
        ],
        "replan": replan,
    }


REPLAN = {
    "old_batch_sizes": [22, 21, 21],
    "new_batch_sizes": [40, 16, 8],
    "old_step_seconds": 0.1,
    "new_step_seconds": 0.05,
    "reason": "profile",
}


def evaluation(e):
    return {
        "type": "eval",
        "epoch": e,
        "time": 1.7e9 + e,
        "metrics": {"oa": 0.9, "aa": 0.85, "kappa": 0.88, "loss": 3.2},
    }


def run_records():
    """Eight epochs: a re-plan after epoch 3, evals at 4 and 8, an end."""
    records = [start()]
    for e in range(1, 9):
        records.append(epoch(e, replan=REPLAN if e == 3 else None))
        if e % 4 == 0:
            records.append(evaluation(e))
    return records + [{"type": "end", "time": 1.7e9 + 9, "wall_seconds": 9.0}]


def write_records(path, records):
    with MetricsStream(path) as stream:
        for record in records:
            stream.write(record)


# --- records -------------------------------------------------------------------------------


def test_metrics_round_trip_turns_non_finite_numbers_into_null(tmp_path):
    path = tmp_path / "metrics.jsonl"
    records = run_records()
    records[2]["loss"] = math.nan
    records[3]["ranks"][0]["wait"] = math.inf
    write_records(path, records)
    for line in path.read_text().splitlines():
        json.loads(line)  # strict JSON: no NaN or Infinity tokens
    back = read_metrics(path)
    assert len(back) == len(records)
    assert back[2]["loss"] is None and back[3]["ranks"][0]["wait"] is None
    assert back[0] == records[0] and back[-1] == records[-1]


def test_metrics_stream_refuses_a_record_without_type(tmp_path):
    with MetricsStream(tmp_path / "m.jsonl") as stream, pytest.raises(ValueError, match="type"):
        stream.write({"epoch": 1})


def test_read_metrics_skips_a_torn_last_line_only(tmp_path):
    path = tmp_path / "metrics.jsonl"
    write_records(path, run_records()[:4])
    with path.open("a") as file:
        file.write('{"type": "epoch", "epoch": 4, "lo')  # the process died mid-write
    assert [r["type"] for r in read_metrics(path)] == ["start", "epoch", "epoch", "epoch"]

    lines = path.read_text().splitlines()
    lines.insert(2, '{"type": "epoch", "epoch"')  # torn, but not last: corruption
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"metrics\.jsonl:3:"):
        read_metrics(path)


def test_read_metrics_names_a_line_that_is_not_a_record(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"type": "start"}\n[1, 2]\n{"type": "end"}\n')
    with pytest.raises(ValueError, match=r"metrics\.jsonl:2: not a metrics record"):
        read_metrics(path)


def test_append_after_a_torn_line_starts_a_new_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    write_records(path, run_records()[:2])
    with path.open("a") as file:
        file.write('{"type": "ep')
    with MetricsStream(path, append=True) as stream:
        stream.write(start(resumed_at={"epoch": 1, "step": 0}))
    with pytest.raises(ValueError, match=":3:"):  # the torn line is no longer last
        read_metrics(path)
    # truncate_after, which a resume runs first, drops the torn line; then append is clean.
    write_records(path, run_records()[:2])
    with path.open("a") as file:
        file.write('{"type": "ep')
    truncate_after(path, 1)
    with MetricsStream(path, append=True) as stream:
        stream.write(start(resumed_at={"epoch": 1, "step": 0}))
    assert [r["type"] for r in read_metrics(path)] == ["start", "epoch", "start"]


def test_truncate_after_keeps_starts_and_records_up_to_the_epoch(tmp_path):
    path = tmp_path / "metrics.jsonl"
    records = run_records()[:-1] + [
        {"type": "stop", "epoch": 8, "step": 3, "reason": "signal SIGTERM", "code": 143}
    ]
    write_records(path, records)
    kept = truncate_after(path, 5)
    assert kept == read_metrics(path)
    assert [(r["type"], r.get("epoch")) for r in kept] == [
        ("start", None),
        ("epoch", 1),
        ("epoch", 2),
        ("epoch", 3),
        ("epoch", 4),
        ("eval", 4),
        ("epoch", 5),
    ]
    assert not list(tmp_path.glob(".*tmp*"))  # the atomic rewrite left no temporary file
    assert truncate_after(tmp_path / "missing.jsonl", 3) == []


def test_a_resumed_run_reads_back_with_both_starts(tmp_path):
    path = tmp_path / "metrics.jsonl"
    write_records(path, run_records()[:-1])
    truncate_after(path, 5)
    with MetricsStream(path, append=True) as stream:
        stream.write(start(resumed_at={"epoch": 5, "step": 0}))
        for e in (6, 7):
            stream.write(epoch(e, loss=0.01))
    records = read_metrics(path)
    assert resume_epochs(records) == [5]
    assert [r["epoch"] for r in epoch_records(records)] == [1, 2, 3, 4, 5, 6, 7]
    assert epoch_records(records)[-1]["loss"] == 0.01
    assert replan_epochs(records) == [(3, [40, 16, 8])]


# --- curves --------------------------------------------------------------------------------


def assert_png(path, at_least=20_000):
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert len(data) > at_least, f"{path} is only {len(data)} bytes"


def test_plot_curves_writes_a_png_with_the_replan_on_every_panel(tmp_path):
    records = run_records()
    path = plot_curves(records, tmp_path / "out" / "curves.png", title="test run")
    assert path == tmp_path / "out" / "curves.png"
    assert_png(path)

    import matplotlib.pyplot as plt

    figure, replans = draw_curves(records)
    try:
        assert replans == 1
        for axis in figure.axes:
            dashed = [
                line
                for line in axis.get_lines()
                if line.get_linestyle() == "--" and list(line.get_xdata()) == [3.5, 3.5]
            ]
            assert len(dashed) == 1, axis.get_title()
            assert any(text.get_text() == "b=40,16,8" for text in axis.texts), axis.get_title()
    finally:
        plt.close(figure)


def test_a_stop_inside_an_epoch_that_never_ended_is_drawn_in_range():
    """Stopped in epoch 9 after 8 full epochs: the line at 9 must be inside the axis."""
    import matplotlib.pyplot as plt

    records = run_records()[:-1] + [
        {"type": "stop", "epoch": 9, "step": 3, "reason": "signal", "code": 143}
    ]
    figure, _ = draw_curves(records)
    try:
        for axis in figure.axes:
            low, high = axis.get_xlim()
            stops = [line for line in axis.get_lines() if list(line.get_xdata()) == [9, 9]]
            assert len(stops) == 1 and low < 9 < high, (axis.get_title(), low, high)
    finally:
        plt.close(figure)


def test_eval_series_draws_fractions_in_percent_and_skips_others():
    series = eval_series(run_records())
    assert set(series) == {"eval oa (%)", "eval aa (%)", "eval kappa (x100)"}  # not the loss
    assert series["eval oa (%)"] == ([4, 8], [90.0, 90.0])


@pytest.mark.parametrize(
    "records",
    [
        [start(), epoch(1, accuracy=None)],  # one epoch, no accuracy, no eval
        [start(), epoch(1), epoch(2, loss=math.inf)],  # a non-finite loss (read back as null)
        [start(), *[epoch(e, loss=10.0**-e) for e in range(1, 6)]],  # log scale
        [start(), epoch(1), epoch(2), start({"epoch": 1, "step": 0}), epoch(2), epoch(3)],
        [],
    ],
    ids=["single-epoch", "nan-loss", "log-loss", "resumed", "empty"],
)
def test_plot_curves_handles_the_odd_runs(tmp_path, records):
    path = tmp_path / "metrics.jsonl"
    write_records(path, records)
    assert_png(plot_curves(read_metrics(path), tmp_path / "curves.png"))


# --- trace ---------------------------------------------------------------------------------


def three_rank_spans(batches=(22, 21, 21), speeds=(1, 2, 4), epochs=2, steps=12):
    """Each rank's StepTrace spans for a synchronous run: sync starts when the last is ready."""
    traces = [StepTrace() for _ in batches]
    clock = [0.0] * len(batches)
    for e in range(1, epochs + 1):
        for s in range(steps):
            ready = [clock[r] + speeds[r] * 1e-3 * batches[r] for r in range(len(batches))]
            sync = max(ready)
            for r, trace in enumerate(traces):
                phases = [
                    ("compute", clock[r], ready[r]),
                    ("wait", ready[r], sync),
                    ("sync", sync, sync + 2e-3),
                    ("optimizer", sync + 2e-3, sync + 3e-3),
                ]
                assert trace.add(e, s, phases)
                clock[r] = sync + 3e-3
    return [t.spans() for t in traces]


LABELS = ["cpu x1, batch 22", "cpu x2, batch 21", "cpu x4, batch 21"]


def test_chrome_trace_is_what_perfetto_reads():
    trace = chrome_trace(three_rank_spans(), LABELS)
    check_trace(trace)
    assert trace["displayTimeUnit"] == "ms"
    events = trace["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert names == {
        0: "rank 0 (cpu x1, batch 22)",
        1: "rank 1 (cpu x2, batch 21)",
        2: "rank 2 (cpu x4, batch 21)",
    }
    slices = [e for e in events if e["ph"] == "X"]
    assert len(slices) == 3 * 2 * 12 * 4
    first = next(e for e in slices if e["tid"] == 2)
    # Microseconds: rank 2's first compute is 4 x 21 ms long.
    assert first["ts"] == 0 and first["dur"] == pytest.approx(84_000)
    assert first["args"] == {"epoch": 1, "step": 0}
    json.dumps(trace, allow_nan=False)


def broken(mutate):
    trace = chrome_trace(three_rank_spans(epochs=1, steps=2), LABELS)
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    mutate(trace, slices)
    return trace


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda t, x: x[0].update(dur=-1.0), "'dur'"),
        (lambda t, x: x[1].pop("ph"), "'ph'"),
        (lambda t, x: x[1].update(ts=x[0]["ts"] + x[0]["dur"] / 2), "previous slice"),
        (lambda t, x: x[2].update(ts="12"), "'ts'"),
        (lambda t, x: x[0].update(tid=None), "'tid'"),
        (lambda t, x: x[0].pop("name"), "'name'"),
        (lambda t, x: t.pop("traceEvents"), "traceEvents"),
    ],
    ids=["negative-dur", "missing-ph", "overlap", "string-ts", "no-tid", "no-name", "no-list"],
)
def test_check_trace_rejects_broken_traces(mutate, message):
    with pytest.raises(ValueError, match=message):
        check_trace(broken(mutate))


def test_write_trace_writes_json_that_loads_and_checks(tmp_path):
    spans = three_rank_spans()
    path = write_trace(tmp_path / "trace.json", spans, LABELS)
    assert json.loads(path.read_text()) == chrome_trace(spans, LABELS)
    check_trace(json.loads(path.read_text()))
    assert [p.name for p in tmp_path.iterdir()] == ["trace.json"]


def test_step_trace_is_bounded():
    trace = StepTrace(max_steps=50)
    kept = sum(trace.add(1 + i // 100, i % 100, [("compute", i, i + 0.5)]) for i in range(10_000))
    assert kept == trace.steps == 50
    assert len(trace.spans()) == 50
    assert {s[:2] for s in trace.spans()} == {(1, i) for i in range(50)}
    pickle.loads(pickle.dumps(trace.spans()))


def test_step_trace_samples_every_kth_epoch_after_its_window():
    trace = StepTrace(max_steps=40, every_epoch=3, sample_steps=5)
    for i in range(10_000):
        trace.add(1 + i // 10, i % 10, [("compute", i, i + 0.5)])
    steps = sorted({s[:2] for s in trace.spans()})
    assert len(steps) == 40
    assert steps[:20] == [(1 + i // 10, i % 10) for i in range(20)]  # the window: epochs 1-2
    sampled = steps[20:]
    assert {e for e, _ in sampled} == {3, 6, 9, 12}
    assert all(s < 5 for _, s in sampled)


def test_step_trace_refuses_a_phase_that_ends_before_it_starts():
    with pytest.raises(ValueError, match="compute"):
        StepTrace().add(1, 0, [("compute", 2.0, 1.0)])


# --- timeline pictures ---------------------------------------------------------------------


def test_render_timeline_writes_a_png(tmp_path):
    path = write_trace(tmp_path / "trace.json", three_rank_spans(), LABELS)
    assert_png(render_timeline(path, tmp_path / "timeline.png", "equal"), at_least=10_000)
    window = step_window(json.loads(path.read_text()), 2, 3, 5)
    assert window[1] > window[0]
    assert_png(render_timeline(path, tmp_path / "window.png", window=window), at_least=10_000)
    empty = {"traceEvents": [], "displayTimeUnit": "ms"}
    check_trace(empty)
    assert_png(render_timeline(empty, tmp_path / "empty.png"), at_least=5_000)


def test_compare_timelines_writes_a_png(tmp_path):
    equal = chrome_trace(three_rank_spans(), LABELS)
    cost = chrome_trace(three_rank_spans(batches=(40, 16, 8)), LABELS)
    before = copy.deepcopy(equal)
    path = compare_timelines([equal, cost], ["equal", "cost"], tmp_path / "cmp.png", steps=(2, 8))
    assert_png(path, at_least=20_000)
    assert equal == before  # drawing does not touch the trace
    with pytest.raises(ValueError, match="no slice"):
        compare_timelines([equal], ["equal"], tmp_path / "x.png", epoch=9)


# --- TensorBoard ---------------------------------------------------------------------------


def test_tensorboard_logger_writes_an_event_file(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from lbtrain.viz import TensorBoardLogger

    with TensorBoardLogger(tmp_path / "tb") as logger:
        for record in run_records():
            logger.log(record)
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {
        "train/loss",
        "train/lr",
        "time/idle_fraction",
        "wait_fraction/rank2",
        "batch_size/rank0",
        "eval/oa",
        "eval/kappa",
    } <= tags
    assert [s.step for s in events.Scalars("train/loss")] == list(range(1, 9))
    assert events.Scalars("wait_fraction/rank0")[0].value == pytest.approx(0.5)


def test_missing_packages_name_the_extra_to_install(monkeypatch):
    from lbtrain.viz._deps import pyplot, summary_writer_class

    monkeypatch.setitem(sys.modules, "tensorboard", None)  # import now fails
    with pytest.raises(RuntimeError, match=r"pip install 'lbtrain\[tensorboard\]'"):
        summary_writer_class()
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(RuntimeError, match=r"pip install 'lbtrain\[plot\]'"):
        pyplot()


@pytest.mark.parametrize(("max_steps", "every", "sample", "per_epoch"),
                         [(40, 3, 5, 10), (50, 0, 5, 7), (7, 2, 3, 4), (0, 1, 1, 3)])  # fmt: skip
def test_step_trace_room_is_what_adding_an_epoch_would_keep(max_steps, every, sample, per_epoch):
    # The room before each epoch is exactly how many of its steps add() then keeps, so a
    # caller that buffers an epoch (the trainer's trace) holds no more than will be kept.
    trace = StepTrace(max_steps=max_steps, every_epoch=every, sample_steps=sample)
    for epoch in range(1, 30):
        room = trace.room(epoch)
        kept = sum(trace.add(epoch, s, [("compute", s, s + 0.5)]) for s in range(per_epoch))
        assert kept == min(room, per_epoch), epoch


def test_re_plan_labels_close_together_take_rows_of_their_own():
    # Three re-plans in five epochs of 250 once overprinted one another, unreadable.
    from lbtrain.viz.curves import _label_rows

    close = [(117, [22, 42]), (119, [40, 24]), (122, [33, 31])]
    assert _label_rows(close, 250) == [0, 1, 2]
    apart = [(10, [22, 42]), (120, [40, 24]), (230, [33, 31])]
    assert _label_rows(apart, 250) == [0, 0, 0]


@pytest.mark.parametrize("alone", [True, False])
def test_a_lone_rank_traces_its_control_step_as_compute_as_its_records_count_it(alone):
    from lbtrain.trainer.observers import TraceCallback
    from lbtrain.trainer.timing import StepTimes

    trace = TraceCallback(Path("unused.json"), ["rank 0"], write=None)
    trace.alone, trace.t0 = alone, 0.0
    trace.pending = [(1, 1, StepTimes(0.0, 1.0, 1.5, 2.0, 2.5, samples=4), (4,))]
    trace._flush()
    spans = {name: (start, end) for *_, name, start, end in trace.trace.spans()}
    if alone:
        assert spans == {"compute": (0.0, 1.5), "sync": (1.5, 2.0), "optimizer": (2.0, 2.5)}
    else:
        assert spans["compute"] == (0.0, 1.0) and spans["wait"] == (1.0, 1.5)


def test_the_time_panel_draws_the_corrected_prediction_from_the_second_epoch():
    import matplotlib.pyplot as plt

    records = run_records()
    for record in records:
        if record.get("type") == "epoch":
            record["forecast_step_seconds"] = 0.001 * (100 + record["epoch"])
    figure, _ = draw_curves(records)
    try:
        (panel,) = [axis for axis in figure.axes if axis.get_title() == "time per step"]
        (line,) = [line for line in panel.get_lines() if line.get_label() == "corrected prediction"]
        epochs = [r["epoch"] for r in records if r.get("type") == "epoch"]
        assert list(line.get_xdata()) == epochs[1:]
        assert list(line.get_ydata()) == pytest.approx([100 + e for e in epochs[1:]])
    finally:
        plt.close(figure)
    # Runs from before the figure: no such line.
    figure, _ = draw_curves(run_records())
    try:
        labels = [line.get_label() for axis in figure.axes for line in axis.get_lines()]
        assert "corrected prediction" not in labels
    finally:
        plt.close(figure)
