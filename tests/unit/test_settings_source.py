"""One source for the settings of `lbtrain train` (issue 39): TrainConfig's field metadata.

`lbtrain train --help`, TrainConfig's fields and docs/cli.md's options must agree with it:
every setting has a flag and help, every flag is a setting (or one of the few that only the
command line has), the defaults shown are TrainConfig's, and the page is what the generator
writes now. The switches are booleans; the old "on"/"off" are still read for one release.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

from lbtrain.cli.flags import CLI_ONLY, SETTINGS, flag, setting_help
from lbtrain.cli.options_doc import BEGIN, END, options_markdown, train_parser, with_options
from lbtrain.cli.parser import build_parser
from lbtrain.cli.train import build_config
from lbtrain.profiling.measured_plan import LADDER_SHARE
from lbtrain.trainer.callbacks import DIVERGENCE_FACTOR, DIVERGENCE_PATIENCE
from lbtrain.trainer.config import TrainConfig, load_toml, save_toml
from lbtrain.trainer.replanner import MIN_EPOCHS, REPLAN_GAIN, SIGMAS
from lbtrain.trainer.settings import GROUPS, settings_of, shown_default

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "cli.md"
SWITCHES = ("flush_denormals", "overlap", "sync_batchnorm", "divergence", "curves")
# The one setting with no flag of its own: the workload's options are flags of their own.
NO_FLAG = ("workload_options",)


def _setting_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The parser's options, less the workload's own (they depend on --workload)."""
    return [
        action
        for group in parser._action_groups
        if not (group.title or "").startswith("workload ")
        for action in group._group_actions
    ]


def test_every_setting_has_help_a_group_and_a_flag_in_train():
    parser = train_parser()
    by_dest = {a.dest: a for a in _setting_actions(parser)}
    for field in dataclasses.fields(TrainConfig):
        meta = field.metadata
        assert meta.get("help", "").strip(), f"{field.name} has no help"
        if field.name in NO_FLAG:
            continue
        assert meta["group"] in GROUPS, field.name
        action = by_dest.get(field.name)
        assert action is not None, f"{field.name} has no flag in lbtrain train"
        assert flag(field.name) in action.option_strings
        assert action.help == setting_help(field.name)
    assert set(SETTINGS) == {f.name for f in settings_of(TrainConfig)} - set(NO_FLAG)


def test_every_flag_of_train_is_a_setting_or_said_to_be_the_command_lines_own():
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    for action in _setting_actions(train_parser()):
        if action.dest in fields:
            continue
        assert set(action.option_strings) & set(CLI_ONLY), action.option_strings


def test_the_defaults_shown_are_trainconfigs_and_a_flag_left_out_sets_nothing():
    parser = train_parser()
    defaults = TrainConfig()
    for action in _setting_actions(parser):
        if action.dest in SETTINGS:
            field = SETTINGS[action.dest]
            assert f"(default: {shown_default(field)}" in action.help % {}, action.dest
            assert action.default is argparse.SUPPRESS  # --config and a resume still apply
    assert shown_default(SETTINGS["epochs"]) == str(defaults.epochs)
    assert build_config({}, None) == defaults


def test_numbers_in_help_come_from_the_code():
    assert f"{DIVERGENCE_FACTOR:g} x" in SETTINGS["divergence"].metadata["help"]
    assert f"{DIVERGENCE_PATIENCE} epochs" in SETTINGS["divergence"].metadata["help"]
    replan = SETTINGS["replan"].metadata["help"]
    assert f"{REPLAN_GAIN:.0%}" in replan and f"{SIGMAS:g} standard errors" in replan
    assert f"{MIN_EPOCHS} epochs or more" in replan
    assert f"{LADDER_SHARE:.0%}" in SETTINGS["time_budget"].metadata["help"]
    # Shown as typed: argparse's % formatting leaves "2%" whole in --help.
    assert f"{REPLAN_GAIN:.0%}" in train_parser().format_help().replace("\n", " ")


def test_docs_cli_md_holds_the_generated_options_as_they_are_now():
    page = PAGE.read_text(encoding="utf-8")
    assert page.count(BEGIN) == 1 and page.count(END) == 1
    assert with_options(page) == page, "docs/cli.md is stale: run python scripts/cli_docs.py"
    for name in SETTINGS:
        assert f"`{flag(name)}" in page, name


def test_a_changed_help_text_makes_the_page_stale():
    # The check above can fail: one setting described otherwise is a different block.
    page = PAGE.read_text(encoding="utf-8")
    parser = train_parser()
    action = next(a for a in parser._actions if a.dest == "epochs")
    action.help = "passes over the training set, twice"
    assert with_options(page, parser) != page
    assert "twice" in options_markdown(parser)


def test_help_of_trainconfig_lists_every_setting():
    doc = TrainConfig.__doc__ or ""
    for field in settings_of(TrainConfig):
        assert f"    {field.name} (" in doc, field.name


def _train_args(*argv: str) -> argparse.Namespace:
    return build_parser(["train", *argv]).parse_args(["train", *argv])


def test_switches_are_flags_and_the_old_on_off_still_work():
    assert vars(_train_args("--no-overlap", "--curves", "--no-divergence")) == {
        **vars(_train_args()),
        "overlap": False,
        "curves": True,
        "divergence": False,
    }
    old = _train_args("--overlap", "off", "--curves", "on", "--sync-batchnorm=off")
    assert (old.overlap, old.curves, old.sync_batchnorm) == (False, True, False)
    assert _train_args("--flush-denormals", "on", "--replan", "off").flush_denormals is True
    for name in SWITCHES:
        assert SETTINGS[name].metadata["kind"] == "bool" and SETTINGS[name].default is True


@pytest.mark.parametrize("argv", [["--overlap", "maybe"], ["--no-curves", "off"]])
def test_a_switch_given_a_value_it_does_not_take_is_one_line(argv, capsys):
    with pytest.raises(SystemExit):
        _train_args(*argv)
    err = capsys.readouterr().err
    assert f"{argv[0]} {argv[1]!r}: give" in err and "on|off" in err, err


def test_a_config_file_and_a_checkpoint_with_on_off_still_read(tmp_path):
    old = tmp_path / "old.toml"
    old.write_text('overlap = "off"\ncurves = "on"\nflush_denormals = "off"\n', encoding="utf-8")
    config = build_config({"config": str(old)}, None)
    assert (config.overlap, config.curves, config.flush_denormals) == (False, True, False)
    resumed = build_config({}, None, base={"sync_batchnorm": "off", "divergence": "on"})
    assert (resumed.sync_batchnorm, resumed.divergence) == (False, True)
    # A config written now holds booleans.
    saved = load_toml(save_toml(tmp_path / "config.toml", config))
    assert saved["overlap"] is False and saved["curves"] is True


def test_a_string_is_no_boolean_where_a_config_is_built_directly():
    with pytest.raises(ValueError, match="overlap='off' must be True or False"):
        TrainConfig(overlap="off").validate()  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="curves='maybe' must be True or False"):
        TrainConfig.from_dict({"curves": "maybe"}).validate()


def test_the_settings_code_has_no_function_over_60_lines():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "function_lengths", REPO / "scripts" / "function_lengths.py"
    )
    lengths = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(lengths)  # type: ignore[union-attr]
    cli = REPO / "lbtrain" / "cli"
    files = [cli / "train.py", cli / "flags.py", cli / "options_doc.py", cli / "common.py"]
    files += [REPO / "lbtrain" / "trainer" / "settings.py", REPO / "scripts" / "cli_docs.py"]
    assert lengths.long_functions(files, 60) == []


def test_a_run_folder_reads_an_old_config_tomls_on_off_as_booleans(tmp_path):
    from lbtrain.runs.folder import ON_OFF_SETTINGS, _recipe

    assert set(ON_OFF_SETTINGS) == {n for n, f in SETTINGS.items() if f.metadata["on_off"]}
    old = tmp_path / "config.toml"
    old.write_text('overlap = "on"\ncurves = "off"\nreplan = "off"\n', encoding="utf-8")
    assert _recipe(old) == {"overlap": True, "curves": False, "replan": "off"}
