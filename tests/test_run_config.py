"""A Flower app's settings (issue 38): tau that fits the app's epochs, numbers written as
strings refused the same way everywhere, and the train-config entries the strategy
overrides named once."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

from fl_lbbsp.contract import RecordKeys
from fl_lbbsp.strategies import LBBSPFedAvg
from fl_lbbsp.strategies.config import InvalidSettingError, local_steps_of_epochs
from fl_lbbsp.strategies.outcomes import warn_overridden_lr

QUICKSTART = {"batch-size": 32, "lr": 0.05, "local-epochs": 1, "fraction-train": 1.0}


@pytest.fixture
def flwr_log(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """Capture Flower's logger (it does not propagate) and fl_lbbsp's."""
    loggers = [logging.getLogger("flwr"), logging.getLogger("fl_lbbsp")]
    filters = {logger.name: list(logger.filters) for logger in loggers}
    for logger in loggers:
        logger.addHandler(caplog.handler)
        # an earlier test (a quiet CLI run) may have raised these loggers' own levels and
        # left its filters on them
        caplog.set_level(logging.INFO, logger=logger.name)
        for kept in filters[logger.name]:
            logger.removeFilter(kept)
    yield caplog
    for logger in loggers:
        logger.removeHandler(caplog.handler)
        for kept in filters[logger.name]:
            logger.addFilter(kept)


def _messages(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return list({id(r): r.getMessage() for r in caplog.records if text in r.getMessage()}.values())


# --------------------------------------------------------------------- tau
@pytest.mark.parametrize(
    ("epochs", "batch", "sizes", "expected"),
    [
        (1, 32, 2688, 84),  # the quickstart's 60,000 / 20 partitions at 80 %
        (1, 32, [2688, 4000, 10], 84),  # the median silo's 2,688, not the mean
        (2, 16, [100, 200, 300], 26),  # median 200: 13 steps an epoch, twice
        (0.5, 10, [95], 5),  # half of ceil(9.5) = 10 steps
    ],
    ids=["one-silo", "median-of-three", "two-epochs", "half-epoch"],
)
def test_tau_is_the_median_silos_steps_for_the_apps_epochs(
    epochs: float, batch: int, sizes: int | list[int], expected: int
) -> None:
    # Execute / Assert
    assert local_steps_of_epochs(epochs, batch, sizes) == expected


def test_from_run_config_derives_tau_from_local_epochs_and_says_so(
    flwr_log: pytest.LogCaptureFixture,
) -> None:
    # Execute: the app declares local-epochs and no local-steps
    strategy = LBBSPFedAvg.from_run_config(QUICKSTART, num_examples=[2688, 2688, 2688])

    # Assert
    assert strategy.config.local_steps == 84
    said = _messages(flwr_log, "local-steps = 84")
    assert len(said) == 1 and "local-epochs" in said[0]


def test_from_run_config_without_tau_names_local_epochs_and_how_to_set_it() -> None:
    # Execute / Assert: no local-steps, no sizes: the message says what tau replaces and
    # what keeps one epoch
    with pytest.raises(InvalidSettingError, match=r"local-epochs = 1.*local-steps = 84"):
        LBBSPFedAvg.from_run_config(QUICKSTART)


def test_a_declared_tau_says_it_replaces_the_epochs(flwr_log: pytest.LogCaptureFixture) -> None:
    # Execute
    LBBSPFedAvg.from_run_config({**QUICKSTART, "local-steps": 10})

    # Assert
    assert len(_messages(flwr_log, "local-steps = 10 replaces the app's local-epochs = 1")) == 1


# ------------------------------------------------------- numbers as strings
@pytest.mark.parametrize(
    "bad",
    [
        {"deadline_margin": "2.0"},
        {"local_steps": "10"},
        {"lr": "0.05"},
        {"max_change_ratio": "2"},
        {"min_train_silos": "1"},
    ],
    ids=["deadline-margin", "local-steps", "lr", "balancing-knob", "reply-limit"],
)
def test_a_number_written_as_a_string_is_refused_alike(bad: dict[str, Any]) -> None:
    # Prepare
    settings: dict[str, Any] = {"initial_batch_size": 32, "local_steps": 10, "lr": 0.05, **bad}
    name, value = next(iter(bad.items()))

    # Execute / Assert: the constructor and the run config say the same
    message = rf"{name} must be a number, not the string '{value}'"
    with pytest.raises(InvalidSettingError, match=message):
        LBBSPFedAvg(**settings)
    with pytest.raises(InvalidSettingError, match=message):
        LBBSPFedAvg.from_run_config(
            {"batch-size": 32, "local-steps": 10, "lr": 0.05}, **{name: value}
        )


def test_text_settings_stay_text() -> None:
    # Execute: a path and an estimator's name are strings by nature
    strategy = LBBSPFedAvg(
        initial_batch_size=32, local_steps=10, lr=0.05, estimator="ema", telemetry_path=None
    )

    # Assert
    assert strategy.config.tuning.estimator == "ema"


# ------------------------------------------------- the app's train config
def test_the_train_configs_batch_size_and_epochs_are_named_as_overridden(
    flwr_log: pytest.LogCaptureFixture,
) -> None:
    # Prepare: the app's own train_config, as a FedAvg app passes it
    config = {"batch-size": 16, "local-epochs": 1, "lr": 0.05}

    # Execute
    warn_overridden_lr(config, keys=RecordKeys(), lr=0.05, owner=object(), local_steps=84)

    # Assert: one warning names both, the lr (the same) is not named
    warned = _messages(flwr_log, "overridden")
    assert len(warned) == 1
    assert "batch-size=16" in warned[0] and "local-epochs=1" in warned[0]
    assert "local-steps=84" in warned[0] and "lr=" not in warned[0]
