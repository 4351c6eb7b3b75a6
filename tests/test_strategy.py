"""LBBSPFedAvg: per-node configs, the fixed total, and aggregation weights."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import FakeGrid, make_reply
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from fl_lbbsp.strategies import LBBSPFedAvg
from fl_lbbsp.strategies.config import InvalidSettingError

pytestmark = pytest.mark.usefixtures("flower_task")


def _reply(
    node_id: int, *, silo: str, batch_size: int, train_time: float, num_examples: int, value: float
):  # type: ignore[no-untyped-def]
    arrays = ArrayRecord({"w": Array(np.full(3, value, dtype=np.float32))})
    metrics = MetricRecord(
        {
            "num-examples": num_examples,
            "train-time": train_time,
            "batch-size": batch_size,
            "samples-processed": batch_size * 10,
            "cpu-percent": 50.0,
            "memory-percent": 10.0,
            "max-batch-size": 0,
        }
    )
    content = RecordDict(
        {"arrays": arrays, "metrics": metrics, "silo": ConfigRecord({"silo-id": silo})}
    )
    return make_reply(content, node_id=node_id)


def _round(times, *, sizes=(32, 32, 32), examples=(100, 100, 100), values=(1.0, 1.0, 1.0)):  # type: ignore[no-untyped-def]
    """Replies of silos a, b, c on nodes 11, 12, 13."""
    return [
        _reply(node, silo=silo, batch_size=b, train_time=t, num_examples=n, value=v)
        for node, silo, b, t, n, v in zip(
            (11, 12, 13), "abc", sizes, times, examples, values, strict=True
        )
    ]


def _strategy(tmp_path, **kwargs) -> LBBSPFedAvg:  # type: ignore[no-untyped-def]
    return LBBSPFedAvg(
        initial_batch_size=32,
        local_steps=10,
        lr=0.01,
        min_train_nodes=3,
        min_available_nodes=3,
        telemetry_path=tmp_path / "t.jsonl",
        **kwargs,
    )


def _configs(messages) -> dict[int, ConfigRecord]:  # type: ignore[no-untyped-def]
    return {m.metadata.dst_node_id: m.content["config"] for m in messages}


def _zeros() -> ArrayRecord:
    return ArrayRecord({"w": Array(np.zeros(3, dtype=np.float32))})


def _after_first_round(strategy: LBBSPFedAvg, times) -> dict[int, ConfigRecord]:  # type: ignore[no-untyped-def]
    """Run round 1 with the given train times; return the round-2 config of each node."""
    grid = FakeGrid([11, 12, 13])
    strategy.configure_train(1, _zeros(), ConfigRecord(), grid)
    strategy.aggregate_train(1, _round(times))
    return _configs(strategy.configure_train(2, _zeros(), ConfigRecord(), grid))


def test_round_one_gives_every_silo_the_initial_batch_size_in_its_own_record(tmp_path) -> None:
    # Prepare
    strategy = _strategy(tmp_path)
    caller_config = ConfigRecord({"extra": 7})
    arrays = _zeros()

    # Execute
    messages = list(strategy.configure_train(1, arrays, caller_config, FakeGrid([11, 12, 13])))

    # Assert
    configs = _configs(messages)
    assert sorted(configs) == [11, 12, 13]
    assert len({id(c) for c in configs.values()}) == 3  # one record per node
    for config in configs.values():
        assert config["batch-size"] == 32
        assert config["local-steps"] == 10
        assert config["lr"] == 0.01
        assert config["server-round"] == 1
        assert config["extra"] == 7
    assert dict(caller_config) == {"extra": 7}  # the caller's record is untouched


def test_batch_sizes_follow_speed_and_keep_the_total(tmp_path) -> None:
    # Prepare: node 11 is 4x as fast as 13, 12 twice as fast; no noise budget (the split
    # by speed alone; the budget has its own tests, tests/test_noise_budget.py)
    strategy = _strategy(tmp_path, allocator="proportional", noise_budget=None)

    # Execute
    configs = _after_first_round(strategy, (1.0, 2.0, 4.0))

    # Assert: X = 3 * 32 = 96 kept; the slowest held at B_init / 2 by the change limit
    # (which bounds the first report too) sets the round's time, the middle silo gets what
    # that time allows (twice the slowest's), the fastest the rest (off the critical path,
    # where it adds least noise)
    sizes = [configs[n]["batch-size"] for n in (11, 12, 13)]
    assert sum(sizes) == 96
    assert sizes == [48, 32, 16]


def test_aggregation_weight_does_not_depend_on_batch_size(tmp_path) -> None:
    # Prepare: silo a reports a 10x speed; equal dataset sizes; no noise budget
    strategy = _strategy(
        tmp_path, allocator="proportional", noise_budget=None, robust_aggregation="mean"
    )
    configs = _after_first_round(strategy, (0.1, 1.0, 1.0))
    fast = configs[11]["batch-size"]
    second = _round(
        (0.1, 1.0, 1.0),
        sizes=tuple(configs[n]["batch-size"] for n in (11, 12, 13)),
        values=(3.0, 0.0, 0.0),
    )

    # Execute
    aggregated, _ = strategy.aggregate_train(2, second)

    # Assert: a bigger batch (up to the change limit, 2x B_init), the same weight (1/3
    # each: mean of 3, 0, 0)
    assert fast == 32 * 2
    assert aggregated is not None
    np.testing.assert_allclose(aggregated["w"].numpy(), np.full(3, 1.0), rtol=1e-6)


def test_aggregation_is_weighted_by_num_examples(tmp_path) -> None:
    # Prepare: FedAvg's mean (centered-clip would clip the update of 4 around the median)
    strategy = _strategy(tmp_path, robust_aggregation="mean")
    strategy.configure_train(1, _zeros(), ConfigRecord(), FakeGrid([11, 12, 13]))
    replies = _round((1.0, 1.0, 1.0), examples=(100, 300, 350), values=(1.0, 2.0, 4.0))

    # Execute
    aggregated, _ = strategy.aggregate_train(1, replies)

    # Assert
    expected = np.average([1.0, 2.0, 4.0], weights=[100, 300, 350])
    assert aggregated is not None
    np.testing.assert_allclose(aggregated["w"].numpy(), np.full(3, expected), rtol=1e-6)


def test_fedavg_scheme_keeps_initial_batch_size_and_writes_telemetry(tmp_path) -> None:
    # Prepare
    strategy = _strategy(tmp_path, balance=False)

    # Execute
    configs = _after_first_round(strategy, (1.0, 2.0, 4.0))

    # Assert
    assert [c["batch-size"] for c in configs.values()] == [32, 32, 32]
    event = json.loads((tmp_path / "t.jsonl").read_text().splitlines()[0])
    assert event["scheme"] == "fedavg"
    assert event["round_time"] == 4.0
    assert event["idle_fraction"] == pytest.approx(1 - (7 / 3) / 4)
    assert sorted(event["silos"]) == ["a", "b", "c"]


def test_invalid_train_time_is_left_out_of_balancing_but_round_goes_on(tmp_path) -> None:
    # Prepare
    strategy = _strategy(tmp_path)
    strategy.configure_train(1, _zeros(), ConfigRecord(), FakeGrid([11, 12, 13]))
    replies = _round((float("nan"), 2.0, -1.0))

    # Execute
    aggregated, _ = strategy.aggregate_train(1, replies)

    # Assert
    assert aggregated is not None
    assert strategy.balancer.predicted_speed("a") is None
    assert strategy.balancer.predicted_speed("c") is None
    assert strategy.balancer.predicted_speed("b") == pytest.approx(320 / 2.0)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"initial_batch_size": 0}, "initial_batch_size"),
        ({"local_steps": -1}, "local_steps"),
        ({"lr": 0.0}, "lr"),
        ({"alpha": 1.5}, "alpha"),
        ({"allocator": "magic"}, "allocator"),
        ({"initial_batch_size": "32"}, "initial_batch_size"),
        ({"fraction_train": 2.0}, "fraction_train"),
        ({"max_empty_rounds": 0}, "max_empty_rounds"),
    ],
)
def test_bad_settings_raise_naming_the_field(kwargs, field) -> None:  # type: ignore[no-untyped-def]
    # Prepare
    settings = {"initial_batch_size": 32, "local_steps": 10, "lr": 0.01, **kwargs}

    # Execute
    with pytest.raises(InvalidSettingError) as caught:
        LBBSPFedAvg(**settings)

    # Assert: one line in the user's terms: the strategy, the keyword, what it must be and
    # the value given; no internal settings class, no pydantic boilerplate
    text = str(caught.value)
    assert isinstance(caught.value, ValueError) and "\n" not in text
    assert text.startswith("LBBSPFedAvg: ") and field in text and "must" in text
    assert repr(next(iter(kwargs.values()))) in text
    assert "Config" not in text and "pydantic" not in text and "errors.pydantic.dev" not in text


def test_keys_given_as_a_mapping_are_converted_and_anything_else_is_a_type_error() -> None:
    # Execute
    strategy = LBBSPFedAvg(
        initial_batch_size=32, local_steps=10, lr=0.01, keys={"batch_size": "bs"}
    )  # type: ignore[arg-type]

    # Assert
    assert strategy.keys.batch_size == "bs"
    with pytest.raises(TypeError, match="RecordKeys"):
        LBBSPFedAvg(initial_batch_size=32, local_steps=10, lr=0.01, keys=["bs"])  # type: ignore[arg-type]


def test_an_unknown_setting_is_named_in_one_line() -> None:
    # Execute
    with pytest.raises(InvalidSettingError) as caught:
        LBBSPFedAvg(initial_batch_size=32, local_steps=10, lr=0.01, min_batch_fration=0.2)

    # Assert
    assert str(caught.value).startswith(
        "LBBSPFedAvg: min_batch_fration is not a setting of LBBSPFedAvg"
    )


# --------------------------------------------------------------- the class's shape
def _variants() -> list[type]:
    from fl_lbbsp.strategies import LBBSPCluster, LBBSPEta, LBBSPTau, PartialAggregation

    return [LBBSPFedAvg, LBBSPTau, LBBSPEta, PartialAggregation, LBBSPCluster]


@pytest.mark.parametrize("strategy", _variants(), ids=lambda c: c.__name__)
def test_a_strategy_has_at_most_three_of_our_classes_over_flowers_fedavg(strategy: type) -> None:
    # Execute
    ours = [c.__name__ for c in strategy.__mro__ if c.__module__.startswith("fl_lbbsp.")]

    # Assert: composed, not inherited (issue 37, item 6), and still a FedAvg
    from flwr.serverapp.strategy import FedAvg

    assert len(ours) <= 3, ours
    assert issubclass(strategy, FedAvg)


PUBLIC_FLWR = ("flwr.app", "flwr.serverapp", "flwr.serverapp.strategy", "flwr.clientapp")
# the legacy API's strategy (another owner's file) and the Grid interface's own types
ALLOWED = {"legacy.py": ("flwr.common", "flwr.server."), "deadline.py": ("TYPE_CHECKING",)}


def test_the_strategies_import_only_flowers_public_api() -> None:
    # Prepare
    import ast
    from pathlib import Path

    import fl_lbbsp.strategies

    folder = Path(fl_lbbsp.strategies.__file__).parent
    bad = []
    for path in sorted(folder.glob("*.py")):
        tree = ast.parse(path.read_text())
        guarded = {
            id(node)
            for block in ast.walk(tree)
            if isinstance(block, ast.If) and ast.unparse(block.test) == "TYPE_CHECKING"
            for node in ast.walk(block)
        }
        for node in ast.walk(tree):
            # Execute: every `from flwr... import` outside a TYPE_CHECKING block
            if not isinstance(node, ast.ImportFrom) or not (node.module or "").startswith("flwr"):
                continue
            allowed = ALLOWED.get(path.name, ())
            if id(node) in guarded and "TYPE_CHECKING" in allowed:
                continue
            module = node.module or ""
            private = [a.name for a in node.names if a.name.startswith("_")]
            public = module in PUBLIC_FLWR or module.startswith(tuple(allowed))
            if private or not public:
                bad.append(f"{path.name}: from {module} import {[a.name for a in node.names]}")

    # Assert
    assert bad == []


def test_the_round_aggregates_with_numpys_blas_on_one_thread(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # Prepare: BLAS allowed 2 threads in this process (a busy machine's threads spin: the
    # server's reductions are memory-bound); record what the round's aggregation sees
    from threadpoolctl import threadpool_info, threadpool_limits

    from fl_lbbsp.strategies.train_round import TrainRound

    if not [lib for lib in threadpool_info() if lib["user_api"] == "blas"]:
        pytest.skip("numpy has no BLAS library that threadpoolctl can hold")
    strategy = _strategy(tmp_path, robust_aggregation="mean")
    strategy.configure_train(1, _zeros(), ConfigRecord(), FakeGrid([11, 12, 13]))
    seen: list[int] = []
    aggregate = TrainRound.aggregate

    def spy(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        seen.extend(blas_threads())
        return aggregate(self, *args, **kwargs)

    monkeypatch.setattr(TrainRound, "aggregate", spy)

    def blas_threads() -> set[int]:
        return {lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"}

    # Execute
    with threadpool_limits(limits=2, user_api="blas"):
        if blas_threads() != {2}:
            pytest.skip("this BLAS cannot run 2 threads")
        aggregated, _ = strategy.aggregate_train(1, _round((1.0, 1.0, 1.0)))
        after = blas_threads()

    # Assert: one thread inside the round, the process's setting restored after it
    assert aggregated is not None
    assert seen and set(seen) == {1}
    assert after == {2}
