"""User errors get a clear message and exit code 2, never a traceback."""

from __future__ import annotations

import logging
import subprocess
import sys
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
    from fl_lbbsp.cli_flags import BALANCING_FLAGS, TUNING_FLAGS
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
    from fl_lbbsp.cli_flags import BALANCING_FLAGS, TUNING_FLAGS

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
    from fl_lbbsp.cli_flags import balancing_of
    from fl_lbbsp.cli_parser import build_parser
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
        (["simulate", "--min-batch-size", "40"], "--batch-size (32) is below --min-batch-size"),
        (["simulate", "--max-batch-size", "10"], "--batch-size (32) is above --max-batch-size"),
        (["cluster", "--max-batch-size", "10"], "--batch-size (64) is above --max-batch-size"),
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


@pytest.mark.parametrize("command", ["simulate", "cluster"])
def test_every_run_setting_is_a_flag_with_its_models_default(command: str) -> None:
    # Prepare
    from fl_lbbsp.cli_parser import build_parser, run_flags
    from fl_lbbsp.runs.cluster import ClusterConfig
    from fl_lbbsp.runs.fl import SimulationConfig

    model = SimulationConfig if command == "simulate" else ClusterConfig

    # Execute
    args = build_parser().parse_args([command])

    # Assert: every field but those with flags of their own, at the model's default (B_init
    # is 32 in FL runs, 64 in cluster runs)
    assert {"silos", "rounds"} <= set(run_flags(SimulationConfig))
    assert {"workers", "iterations"} <= set(run_flags(ClusterConfig))
    for name in run_flags(model):
        assert getattr(args, name) == model.model_fields[name].default, name
    assert args.batch_size == (32 if command == "simulate" else 64)


def test_a_run_settings_help_is_its_fields_documentation(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Execute
    shown = _help(["cluster", "--help"], capsys)

    # Assert: the entries of ClusterConfig's and RunSettings' numpydoc Parameters
    assert "--iterations ITERATIONS Synchronous iterations (rounds). (default: 100)" in shown
    assert "--lr LR Learning rate eta. (default: 0.05)" in shown
    assert "--data {full,shard}" in shown


def test_generated_flags_parse_to_their_fields_types() -> None:
    # Prepare
    from fl_lbbsp.cli_parser import build_parser

    argv = ["simulate", "--slowdown-schedules", "1:1,3:2;1;1", "--partial-replies", "none",
            "--silos", "3", "--spend-saved-time", "--narx-warmup", "7"]  # fmt: skip

    # Execute
    args = build_parser().parse_args(argv)
    keys = build_parser().parse_args(["keys", "generate", "--out", "k", "--coeff-mod-bit-sizes",
                                      "50,40"])  # fmt: skip

    # Assert
    assert args.slowdown_schedules == ("1:1,3:2", "1", "1") and args.partial_replies is None
    assert args.silos == 3 and args.spend_saved_time is True and args.narx_warmup == 7
    assert args.narx_train_every is None  # not given: the estimator's own default
    assert keys.coeff_mod_bit_sizes == (50, 40) and keys.scale_bits == 35


def test_the_top_level_help_imports_no_run_models() -> None:
    # Execute: `fl-lbbsp --help` in a fresh interpreter
    code = (
        "import sys\nfrom fl_lbbsp.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'flwr', 'tenseal'}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )

    # Assert: the subcommands' flags, made from the run configs, were not made
    assert done.stdout.strip().splitlines()[-1] == "[]"
