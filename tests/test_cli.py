"""User errors get a clear message and exit code 2, never a traceback."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from fl_lbbsp.cli import main


def exit_code(argv: list[str]) -> int:
    """``fl-lbbsp argv``'s exit code, whether it returns or exits."""
    try:
        return main(argv)
    except SystemExit as exit_info:
        return int(exit_info.code or 0)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["simulate", "--batch-size", "0"], "--batch-size"),
        (["simulate", "--batch-size", "-4"], "--batch-size"),
        (["simulate", "--local-steps", "0"], "--local-steps"),
        (["compare", "--alpha", "0"], "--alpha"),
        (["compare", "--alpha", "1.5"], "--alpha"),
        (["simulate", "--scheme", "fedsgd"], "--scheme"),
        (["compare", "--schemes", "fedavg,backup"], "--schemes"),
        (["compare", "--schemes", ","], "--schemes"),
        (["simulate", "--estimator", "arima"], "--estimator"),
        (["simulate", "--slowdown-schedules", "1;1;1;1"], "slowdown_schedules"),
        (["simulate", "--slowdown-schedules", "1:0.5;1;1;1;1"], "0.5"),
        (["simulate", "--partial-replies", "0"], "--partial-replies"),
        (["simulate", "--in-process", "--parallel", "2"], "parallel must be 1"),
        (["simulate", "--scheme", "partial", "--encrypt", "keys"], "encrypt works with"),
        (["simulate", "--silos", "3", "--speeds", "4,2"], "--speeds"),
        (["simulate", "--speeds", "4,x"], "--speeds"),
        (["simulate", "--dataset", "mnist:/no/such/folder"], "/no/such/folder"),
        (["simulate", "--dataset", "imagenet"], "imagenet"),
        (["simulate", "--partition", "labels:0"], "labels:0"),
        (["simulate", "--noise-budget", "0.5"], "--noise-budget"),
        (["compare", "--noise-budget", "lots"], "--noise-budget"),
    ],
)
def test_user_errors_exit_2_with_a_message(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str], tmp_path
) -> None:  # type: ignore[no-untyped-def]
    # Execute
    code = exit_code([*argv, "--out", str(tmp_path)])

    # Assert: one line naming the problem
    err = capsys.readouterr().err
    assert code == 2
    assert message in err
    assert err.strip().count("\n") == 0, err
    assert "Traceback" not in err


@pytest.mark.parametrize(("text", "value"), [("none", None), ("1", 1.0), ("2.5", 2.5)])
def test_the_noise_budget_flag_reaches_the_simulation(text: str, value: float | None) -> None:
    # Prepare
    from fl_lbbsp.cli_parser import build_parser

    # Execute
    args = build_parser().parse_args(["simulate", "--noise-budget", text])

    # Assert
    assert args.noise_budget == value


@pytest.mark.parametrize(("flags", "expected"), [([], False), (["--spend-saved-time"], True)])
def test_the_spend_saved_time_flag_reaches_the_strategy(
    flags: list[str], expected: bool, tmp_path: Path
) -> None:
    # Prepare
    from fl_lbbsp.cli_parser import build_parser
    from fl_lbbsp.cli_runs import _config
    from fl_lbbsp.runs.fl import make_strategy

    args = build_parser().parse_args(["compare", *flags])

    # Execute
    strategy = make_strategy(_config(args, "lbbsp", tmp_path))

    # Assert: off unless asked for
    assert strategy.server_config.spend_saved_time is expected


def _help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit):
        main(argv)
    return " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("command", ["simulate", "compare", "cluster"])
def test_every_balancing_knob_is_a_flag_with_its_description_and_default(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Prepare
    from fl_lbbsp.cli_parser import BALANCING_FLAGS, TUNING_FLAGS
    from fl_lbbsp.core.settings import BalancingKnobs, Tuning

    # Execute
    shown = _help([command, "--help-all"], capsys)

    # Assert: every knob but those the run sets, its help its description
    assert set(BalancingKnobs.model_fields) - set(BALANCING_FLAGS) == {"balance", "tuning"}
    assert set(Tuning.model_fields) - set(TUNING_FLAGS) == {
        "check_times", "estimator_options", "allocator_options"
    }  # fmt: skip
    knobs = [(n, BalancingKnobs.model_fields[n]) for n in BALANCING_FLAGS]
    for name, field in knobs + [(n, Tuning.model_fields[n]) for n in TUNING_FLAGS]:
        first = " ".join(str(field.description).replace("``", "").split()[:4])
        assert f"--{name.replace('_', '-')}" in shown and first in shown, name


def test_the_short_help_shows_the_user_knobs_and_hides_the_tuning(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Prepare
    from fl_lbbsp.cli_parser import BALANCING_FLAGS, TUNING_FLAGS

    # Execute
    shown = _help(["simulate", "--help"], capsys)

    # Assert: the user's knobs, the tuning group named, none of its flags
    assert all(f"--{name.replace('_', '-')} " in shown for name in BALANCING_FLAGS)
    assert "--help-all" in shown and f"{len(TUNING_FLAGS)} more flags" in shown
    assert not [n for n in TUNING_FLAGS if f"--{n.replace('_', '-')} " in shown]


def test_a_hidden_tuning_flag_still_parses() -> None:
    # Prepare
    from fl_lbbsp.cli_parser import build_parser

    # Execute
    args = build_parser().parse_args(["simulate", "--estimator", "last", "--no-common-noise"])

    # Assert
    assert args.estimator == "last" and args.common_noise is False


@pytest.mark.parametrize("command", ["simulate", "cluster"])
def test_balancing_flags_reach_the_runs_knobs(command: str) -> None:
    # Prepare
    from fl_lbbsp.cli_parser import balancing_of, build_parser
    from fl_lbbsp.runs.cluster import ClusterConfig
    from fl_lbbsp.runs.fl import SimulationConfig

    argv = [command, "--history", "7", "--no-common-noise", "--max-change-ratio", "none",
            "--fit", "wls", "--min-claimed-time", "0.001"]  # fmt: skip

    # Execute
    knobs = balancing_of(build_parser().parse_args(argv))
    config = (SimulationConfig if command == "simulate" else ClusterConfig)(balancing=knobs)

    # Assert: given ones as given, the rest at their defaults
    tuning = config.balancing.tuning
    assert tuning.history == 7 and tuning.common_noise is False
    assert tuning.max_change_ratio is None and tuning.fit == "wls"
    assert tuning.min_claimed_time == 0.001
    assert config.balancing.noise_budget == pytest.approx(2**0.5)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["simulate", "--history", "0"], "--history"),
        (["simulate", "--history", "2.5"], "--history"),
        (["simulate", "--fit", "median"], "--fit"),
        (["simulate", "--allocator", "iterative"], "iterative"),
        (["compare", "--max-batch-size", "4", "--min-batch-size", "8"], "max_batch_size"),
        (["cluster", "--change-confirm", "0"], "--change-confirm"),
    ],
)
def test_a_knob_out_of_its_bounds_exits_2_naming_its_flag(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str], tmp_path
) -> None:  # type: ignore[no-untyped-def]
    # Execute
    code = exit_code([*argv, "--out", str(tmp_path)])

    # Assert
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.strip().count("\n") == 0, err


def test_a_command_run_in_process_leaves_the_loggers_as_it_found_them(tmp_path: Path) -> None:
    # Prepare: what a notebook's loggers look like before a command
    loggers = [logging.getLogger(name) for name in ("fl_lbbsp", "flwr")]

    def snapshot() -> list[tuple[object, ...]]:
        return [(list(lg.handlers), lg.level, lg.propagate, list(lg.filters)) for lg in loggers]

    before = snapshot()

    # Execute: a command that sets up its quiet console logging
    code = main(["keys", "checkpoint", "--out", str(tmp_path / "k")])

    # Assert: no quiet filter left on Flower's logger, no handler bound to the command's
    # stderr left on ours
    assert code == 0
    assert snapshot() == before
