"""At the boundary with a user's Flower app: unknown metrics pass through, repeated
rejections are logged once, a run that aggregates nothing stops with an error, every
round's decision is one line through Flower's logger and per-silo figures reach Flower's
Result, cold starts do not stay in the speed estimates, misuse keeps a silo's time out of
balancing, and ``from_run_config`` reads an app's run config."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fl_lbbsp.contract import COMPUTE_TIME, PREDICTED_SPEED, SLOWDOWN, RecordKeys, silo_metric
from fl_lbbsp.runs.inprocess import InProcessGrid
from fl_lbbsp.strategies import LBBSPFedAvg
from fl_lbbsp.strategies.config import InvalidSettingError
from fl_lbbsp.strategies.outcomes import NoUpdateError

KEYS = RecordKeys()
B_INIT, TAU = 16, 5
Reply = Callable[[int, int, dict[str, Any]], dict[str, Any] | None]
"""(partition, round, config sent) -> the reply's metrics (None: an error reply)."""


def _time(partition: int, batch_size: int) -> float:
    """Injected compute seconds: partition k is k+1 times slower (no clock)."""
    return (partition + 1) * 0.001 * batch_size * TAU


def _honest(partition: int, server_round: int, config: dict[str, Any]) -> dict[str, Any]:
    b = int(config[KEYS.batch_size])
    return {
        KEYS.num_examples: 100 * (partition + 1),
        KEYS.train_time: _time(partition, b),
        KEYS.batch_size: b,
        KEYS.samples_processed: b * TAU,
        "train_loss": float(partition),
    }


def _app(
    reply: Reply, *, silo_record: Callable[[int, int], dict[str, Any]] | None = None
) -> ClientApp:
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        partition = int(context.node_config["partition-id"])  # type: ignore[arg-type]
        config = dict(msg.content["config"])
        metrics = reply(partition, int(config[KEYS.server_round]), config)
        if metrics is None:
            raise RuntimeError("this silo fails")
        arrays = msg.content["arrays"]
        moved = ArrayRecord({k: Array(a.numpy() + np.float32(1)) for k, a in arrays.items()})
        extra = {KEYS.silo_id: str(partition)}
        if silo_record is not None:
            extra.update(silo_record(partition, int(config[KEYS.server_round])))
        content = RecordDict(
            {
                "arrays": moved,
                "metrics": MetricRecord(metrics),
                KEYS.silo_record: ConfigRecord(extra),
            }
        )
        return Message(content, reply_to=msg)

    return app


def _strategy(**kwargs: Any) -> LBBSPFedAvg:
    return LBBSPFedAvg(
        initial_batch_size=B_INIT,
        local_steps=TAU,
        lr=0.1,
        fraction_evaluate=0.0,
        min_train_nodes=3,
        min_available_nodes=3,
        deadline_margin=None,
        **kwargs,
    )


def _run(strategy: LBBSPFedAvg, app: ClientApp, rounds: int, **grid: Any):  # type: ignore[no-untyped-def]
    initial = ArrayRecord({"w": Array(np.zeros(4, dtype=np.float32))})
    return strategy.start(
        grid=InProcessGrid(app, num_nodes=3, **grid), initial_arrays=initial, num_rounds=rounds
    )


def test_unknown_metrics_pass_through_and_the_result_holds_per_silo_figures() -> None:
    # Execute
    result = _run(_strategy(), _app(_honest), rounds=2)

    # Assert: the app's own train_loss aggregated as Flower's FedAvg does (weighted by
    # num-examples), no mean of batch sizes, each silo's batch size and predicted speed
    metrics = result.train_metrics_clientapp[2]
    assert metrics["train_loss"] == pytest.approx((0 * 100 + 1 * 200 + 2 * 300) / 600)
    assert KEYS.batch_size not in metrics and KEYS.train_time not in metrics
    sizes = {s: metrics[silo_metric(KEYS.batch_size, s)] for s in "012"}
    assert sum(sizes.values()) == 3 * B_INIT and sizes["0"] > sizes["1"] > sizes["2"]
    speeds = {s: metrics[silo_metric(PREDICTED_SPEED, s)] for s in "012"}
    assert speeds["0"] == pytest.approx(1000.0) and speeds["2"] == pytest.approx(1000 / 3)
    assert np.isfinite(result.arrays["w"].numpy()).all()


def test_round_one_names_silos_by_their_ids_and_timings_are_not_averaged() -> None:
    # Prepare: silos that also send the per-silo timings our silo side adds
    def timed(partition: int, server_round: int, config: dict[str, Any]) -> dict[str, Any]:
        return {**_honest(partition, server_round, config), COMPUTE_TIME: 1.0, SLOWDOWN: 4.0}

    # Execute
    result = _run(_strategy(), _app(timed), rounds=2)

    # Assert: round 1's per-silo keys are the silo ids of round 2 (not node ids), and no
    # mean of compute times or slowdowns is passed off as a metric of the federation
    for server_round in (1, 2):
        metrics = result.train_metrics_clientapp[server_round]
        keys = {k for k in metrics if k.startswith(f"{KEYS.batch_size}/")}
        assert keys == {silo_metric(KEYS.batch_size, s) for s in "012"}
        assert COMPUTE_TIME not in metrics and SLOWDOWN not in metrics
        assert "train_loss" in metrics


def test_an_app_train_config_lr_overridden_by_the_strategy_is_warned_once(
    fl_log: pytest.LogCaptureFixture,
) -> None:
    # Prepare: the app passes its own lr in train_config, as Flower's template does
    initial = ArrayRecord({"w": Array(np.zeros(4, dtype=np.float32))})

    # Execute
    _strategy().start(
        grid=InProcessGrid(_app(_honest), num_nodes=3),
        initial_arrays=initial,
        num_rounds=2,
        train_config=ConfigRecord({KEYS.lr: 0.01}),
    )

    # Assert: one warning naming both values and the fix
    warnings = [r.getMessage() for r in fl_log.records if "is overridden" in r.getMessage()]
    assert len(warnings) == 1
    assert "lr=0.01" in warnings[0] and "lr=0.1" in warnings[0]


def test_strict_metric_keys_are_opt_in_and_a_first_round_without_update_stops_the_run() -> None:
    # Prepare: strict mode that does not list the app's train_loss
    strategy = _strategy(extra_metric_keys=())

    # Execute / Assert: every reply rejected in round 1 -> an error naming the cause
    with pytest.raises(NoUpdateError, match="first round.*unexpected metrics 'train_loss'"):
        _run(strategy, _app(_honest), rounds=3)


def test_a_train_function_without_the_decorator_stops_the_run_with_the_fix() -> None:
    # Prepare: a quickstart reply (num-examples and train_loss only)
    def undecorated(partition: int, server_round: int, config: dict[str, Any]) -> dict[str, Any]:
        return {KEYS.num_examples: 100, "train_loss": 1.0}

    # Execute / Assert
    with pytest.raises(NoUpdateError, match=r"@lbbsp_train\(\)"):
        _run(_strategy(), _app(undecorated), rounds=2)


@pytest.mark.parametrize(("max_empty", "stops_in"), [(1, 2), (2, 3), (3, 4)])
def test_consecutive_rounds_without_update_stop_the_run(max_empty: int, stops_in: int) -> None:
    # Prepare: round 1 aggregates, then every silo fails
    def fails_after_one(partition: int, server_round: int, config: dict[str, Any]):  # type: ignore[no-untyped-def]
        return _honest(partition, server_round, config) if server_round == 1 else None

    # Execute
    with pytest.raises(NoUpdateError) as caught:
        _run(_strategy(max_empty_rounds=max_empty), _app(fails_after_one), rounds=10)

    # Assert
    assert f"round {stops_in}:" in str(caught.value) and "RuntimeError" in str(caught.value)


def test_a_rejection_that_repeats_is_logged_once_per_silo_and_cause(
    fl_log: pytest.LogCaptureFixture,
) -> None:
    # Prepare: silo 0 always answers with another batch size than it was sent
    def wrong_size(partition: int, server_round: int, config: dict[str, Any]) -> dict[str, Any]:
        metrics = _honest(partition, server_round, config)
        if partition == 0:
            metrics[KEYS.batch_size] = int(config[KEYS.batch_size]) + 1
        return metrics

    # Execute
    _run(_strategy(), _app(wrong_size), rounds=4)

    # Assert: one warning for silo 0's repeated cause (the numbers differ every round)
    lines = {
        id(r): r.getMessage()
        for r in fl_log.records
        if r.levelno == logging.WARNING and "rejected" in r.getMessage()
    }.values()
    assert len(lines) == 1 and "silo 0" in next(iter(lines))


def test_each_round_decision_is_one_line_through_flowers_logger(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Prepare: Flower's logger as a ServerApp has it (no filter a CLI run in this test
    # process may have left on it)
    caplog.set_level(logging.INFO, logger="flwr")
    monkeypatch.setattr(logging.getLogger("flwr"), "filters", [])

    # Execute
    _run(_strategy(), _app(_honest), rounds=3)

    # Assert
    lines = [
        r.getMessage() for r in caplog.records if r.name == "flwr" and "[lbbsp]" in r.getMessage()
    ]
    assert [line.split(":")[0] for line in lines] == [f"[lbbsp] round {k}" for k in (1, 2, 3)]
    assert "predicted" in lines[2] and "ideal" in lines[2] and "left out: none" in lines[2]
    assert "0=" in lines[2] and "n/a" not in lines[2]


def test_a_cold_first_report_is_replaced_by_the_first_warm_one() -> None:
    # Prepare: every silo's first round takes 20x its steady time (start-up)
    def cold_then_warm(partition: int, server_round: int, config: dict[str, Any]) -> dict[str, Any]:
        metrics = _honest(partition, server_round, config)
        if server_round == 1:
            metrics[KEYS.train_time] *= 20
        return metrics

    # Execute
    result = _run(_strategy(), _app(cold_then_warm), rounds=3)

    # Assert: from round 2 on, the predicted speeds are the steady ones, not an average
    # with the cold start (an EMA would still be far below after one warm report)
    for server_round in (2, 3):
        metrics = result.train_metrics_clientapp[server_round]
        for partition in range(3):
            speed = metrics[silo_metric(PREDICTED_SPEED, str(partition))]
            assert speed == pytest.approx(1 / (0.001 * (partition + 1)), rel=1e-6)
    sizes = [result.train_metrics_clientapp[2][silo_metric(KEYS.batch_size, s)] for s in "012"]
    assert sizes[0] > sizes[1] > sizes[2]


def test_a_silo_that_reports_misuse_is_not_balanced_but_still_aggregated(
    fl_log: pytest.LogCaptureFixture,
) -> None:
    # Prepare: silo 2 says it trained with its own loader; its times claim it is fast
    def claims_fast(partition: int, server_round: int, config: dict[str, Any]) -> dict[str, Any]:
        metrics = _honest(partition, server_round, config)
        if partition == 2:
            metrics[KEYS.train_time] = 0.0001
        return metrics

    def misuse(partition: int, server_round: int) -> dict[str, Any]:
        return {KEYS.misuse: "drew 0 batches through plan.batch_sampler"} if partition == 2 else {}

    # Execute
    result = _run(_strategy(), _app(claims_fast, silo_record=misuse), rounds=3)

    # Assert: silo 2 keeps B_init (never balanced on its claim), one warning, its update
    # in the mean (every silo moved each weight by 1 each round)
    for server_round in (2, 3):
        metrics = result.train_metrics_clientapp[server_round]
        assert metrics[silo_metric(KEYS.batch_size, "2")] <= B_INIT
        assert silo_metric(PREDICTED_SPEED, "2") not in metrics
    warnings = {id(r) for r in fl_log.records if "did not train as instructed" in r.getMessage()}
    assert len(warnings) == 1
    assert result.arrays["w"].numpy() == pytest.approx(np.full(4, 3.0))


def test_from_run_config_reads_the_apps_keys() -> None:
    # Prepare: what a quickstart app's pyproject declares
    run_config = {"batch-size": 32, "local-steps": 10, "lr": 0.05, "fraction-train": 0.5,
                  "spend-saved-time": True}  # fmt: skip

    # Execute
    strategy = LBBSPFedAvg.from_run_config(run_config, min_train_nodes=3)

    # Assert
    assert (strategy.config.initial_batch_size, strategy.config.local_steps) == (32, 10)
    assert strategy.config.lr == 0.05 and strategy.fraction_train == 0.5
    assert strategy.min_train_nodes == 3 and strategy.server_config.spend_saved_time


@pytest.mark.parametrize("missing", ["batch-size", "local-steps", "lr"])
def test_from_run_config_names_a_missing_key_and_where_to_declare_it(missing: str) -> None:
    # Prepare
    run_config = {"batch-size": 32, "local-steps": 10, "lr": 0.05}
    del run_config[missing]

    # Execute / Assert
    with pytest.raises(InvalidSettingError, match=rf"'{missing}'.*\[tool\.flwr\.app\.config\]"):
        LBBSPFedAvg.from_run_config(run_config)


def test_from_run_config_reads_the_learning_rate_of_flowers_templates() -> None:
    # Prepare: the keys `flwr new`'s PyTorch app declares
    run_config = {"batch-size": 32, "local-steps": 10, "learning-rate": 0.01}

    # Execute
    strategy = LBBSPFedAvg.from_run_config(run_config)

    # Assert
    assert strategy.config.lr == 0.01


def test_from_run_config_says_which_rate_it_takes_when_lr_and_learning_rate_differ(
    fl_log: pytest.LogCaptureFixture,
) -> None:
    # Prepare: both names, two values
    run_config = {"batch-size": 32, "local-steps": 10, "lr": 0.05, "learning-rate": 0.01}

    # Execute
    strategy = LBBSPFedAvg.from_run_config(run_config)

    # Assert: lr, said once
    assert strategy.config.lr == 0.05
    said = {r for r in fl_log.records if "learning-rate = 0.01" in r.getMessage()}
    assert len(said) == 1 and "sends every silo lr" in said.pop().getMessage()


def test_from_run_config_shows_how_to_pass_a_missing_key_and_the_keywords_given() -> None:
    # Prepare: a misspelt keyword instead of the missing lr
    run_config = {"batch-size": 32, "local-steps": 10}

    # Execute / Assert
    with pytest.raises(InvalidSettingError, match=r"lr=\.\.\..*keywords given: learning_rate"):
        LBBSPFedAvg.from_run_config(run_config, learning_rate=0.1)


def test_the_fastest_silo_misread_by_its_cold_start_is_restored_in_one_round() -> None:
    # Prepare: only silo 0, the fastest, starts cold (6x its steady time in round 1), so
    # round 2 gives it a small batch
    def cold_fastest(partition: int, server_round: int, config: dict[str, Any]) -> dict[str, Any]:
        metrics = _honest(partition, server_round, config)
        if server_round == 1 and partition == 0:
            metrics[KEYS.train_time] *= 6
        return metrics

    # Execute
    result = _run(_strategy(), _app(cold_fastest), rounds=3)

    # Assert: its warm report of round 2 replaces the cold one and the change limit does
    # not hold back the correction: round 3 is ordered like the speeds again
    def sizes(server_round: int) -> list[int]:
        metrics = result.train_metrics_clientapp[server_round]
        return [metrics[silo_metric(KEYS.batch_size, s)] for s in "012"]

    assert sizes(2)[0] < sizes(2)[1]  # the cold start misled round 2
    assert sizes(3)[0] > sizes(3)[1] > sizes(3)[2]


def test_an_honest_first_report_of_a_fixed_cost_silo_stays_in_its_estimate() -> None:
    # Prepare: silo k is k+1 times slower, its step mostly a fixed cost (2 ms, 0.1 ms a
    # sample): given another batch size in round 2 its speed changes at one capacity
    def fixed_cost(partition: int, server_round: int, config: dict[str, Any]) -> dict[str, Any]:
        metrics = _honest(partition, server_round, config)
        b = metrics[KEYS.batch_size]
        metrics[KEYS.train_time] = (partition + 1) * TAU * (0.0001 * b + 0.002)
        return metrics

    # Execute
    result = _run(_strategy(), _app(fixed_cost), rounds=3)

    # Assert: after round 2 each silo's predicted speed is the EMA of its two reports
    # (alpha 0.2), not its round-2 report alone (a restart taking round 1 for start-up)
    moved = 0
    for s in "012":
        partition = int(s)
        sizes = [result.train_metrics_clientapp[r][silo_metric(KEYS.batch_size, s)] for r in (1, 2)]
        speeds = [b * TAU / fixed_cost(partition, 0, {KEYS.batch_size: b})[KEYS.train_time]
                  for b in sizes]  # fmt: skip
        predicted = result.train_metrics_clientapp[2][silo_metric(PREDICTED_SPEED, s)]
        assert predicted == pytest.approx(0.8 * speeds[0] + 0.2 * speeds[1], rel=1e-6)
        moved += abs(speeds[1] / speeds[0] - 1) > 0.2
    assert moved >= 1  # a silo whose speed moved beyond change_threshold with its size
