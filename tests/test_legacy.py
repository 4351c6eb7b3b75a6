"""LBBSPStrategy on Flower's legacy API: the legacy Server loop, and parity with LBBSPFedAvg."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import torch
from conftest import make_reply
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from flwr.client import NumPyClient
from flwr.common import (
    Code,
    DisconnectRes,
    EvaluateRes,
    FitIns,
    FitRes,
    GetParametersRes,
    GetPropertiesRes,
    Parameters,
    Status,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.server import Server, SimpleClientManager
from flwr.server.client_proxy import ClientProxy

from fl_lbbsp.clients import emulate_slowdown, train_local
from fl_lbbsp.models import build_model
from fl_lbbsp.strategies import LBBSPFedAvg, LBBSPStrategy


class InProcessProxy(ClientProxy):
    """A legacy ClientProxy that calls a NumPyClient in this process."""

    def __init__(self, cid: str, client: NumPyClient) -> None:
        super().__init__(cid)
        self.client = client.to_client()
        self.fit_configs: list[dict] = []  # type: ignore[type-arg]

    def fit(self, ins: FitIns, timeout, group_id) -> FitRes:  # type: ignore[no-untyped-def]
        self.fit_configs.append(dict(ins.config))
        return self.client.fit(ins)

    def get_properties(self, ins, timeout, group_id) -> GetPropertiesRes:  # type: ignore[no-untyped-def]
        raise NotImplementedError

    def get_parameters(self, ins, timeout, group_id) -> GetParametersRes:  # type: ignore[no-untyped-def]
        raise NotImplementedError

    def evaluate(self, ins, timeout, group_id) -> EvaluateRes:  # type: ignore[no-untyped-def]
        raise NotImplementedError

    def reconnect(self, ins, timeout, group_id) -> DisconnectRes:  # type: ignore[no-untyped-def]
        return DisconnectRes(reason="")


class CostModelClient(NumPyClient):
    """Reports the compute time of a silo processing ``speed`` samples per second."""

    def __init__(self, silo_id: str, speed: float, num_examples: int, value: float) -> None:
        self.silo_id, self.speed, self.num_examples, self.value = (
            silo_id,
            speed,
            num_examples,
            value,
        )

    def fit(self, parameters, config):  # type: ignore[no-untyped-def]
        b, tau = int(config["batch-size"]), int(config["local-steps"])
        metrics = {
            "train-time": b * tau / self.speed,
            "batch-size": b,
            "samples-processed": b * tau,
            "silo-id": self.silo_id,
        }
        return [np.full(3, self.value, dtype=np.float32)], self.num_examples, metrics


def _server(strategy: LBBSPStrategy, clients: dict[str, NumPyClient]) -> tuple[Server, dict]:  # type: ignore[type-arg]
    manager = SimpleClientManager()
    proxies = {cid: InProcessProxy(cid, client) for cid, client in clients.items()}
    for proxy in proxies.values():
        manager.register(proxy)
    return Server(client_manager=manager, strategy=strategy), proxies


def test_legacy_server_loop_sends_each_client_its_own_batch_size(tmp_path) -> None:
    # Prepare: three silos of 4:2:1 speed behind node-style cids; unequal dataset sizes
    # (no noise budget: the split by speed alone)
    strategy = LBBSPStrategy(
        initial_batch_size=32,
        local_steps=10,
        lr=0.05,
        allocator="proportional",
        estimator="last",
        noise_budget=None,
        telemetry_path=tmp_path / "legacy.jsonl",
        fraction_evaluate=0.0,
        min_fit_clients=3,
        min_available_clients=3,
        initial_parameters=ndarrays_to_parameters([np.zeros(3, dtype=np.float32)]),
        on_fit_config_fn=lambda rnd: {"extra": rnd},
    )
    server, proxies = _server(
        strategy,
        {
            "101": CostModelClient("a", 400.0, 100, 1.0),
            "102": CostModelClient("b", 200.0, 300, 2.0),
            "103": CostModelClient("c", 100.0, 600, 4.0),
        },
    )

    # Execute
    server.fit(num_rounds=3, timeout=None)

    # Assert: round 1 at B_init, then 4:2:1 of X = 96; in round 2 the slowest is held at
    # B_init / 2 by the change limit, which sets that round's time: the middle silo gets
    # what that time allows (32) and the fastest the rest, where it adds least noise; tau,
    # eta and the caller's config on every FitIns
    sizes = {cid: [c["batch-size"] for c in p.fit_configs] for cid, p in proxies.items()}
    assert sizes == {"101": [32, 48, 55], "102": [32, 32, 27], "103": [32, 16, 14]}
    for proxy in proxies.values():
        assert [c["server-round"] for c in proxy.fit_configs] == [1, 2, 3]
        assert [c["extra"] for c in proxy.fit_configs] == [1, 2, 3]
        assert {c["local-steps"] for c in proxy.fit_configs} == {10}
        assert {c["lr"] for c in proxy.fit_configs} == {0.05}
    # FedAvg's average, weighted by the local dataset sizes, not by batch size; c's 600,
    # undeclared, weighs as all the others together (400: the default weight cap)
    (weights,) = parameters_to_ndarrays(server.parameters)
    expected = np.average([1.0, 2.0, 4.0], weights=[100, 300, 400])
    np.testing.assert_allclose(weights, np.full(3, expected), rtol=1e-6)
    events = [json.loads(line) for line in (tmp_path / "legacy.jsonl").read_text().splitlines()]
    assert [e["round"] for e in events] == [1, 2, 3]
    assert sorted(events[-1]["silos"]) == ["a", "b", "c"]
    assert events[-1]["idle_fraction"] < events[0]["idle_fraction"]


class DamagedClient(CostModelClient):
    """A CostModelClient whose result ``damage`` spoils."""

    def __init__(self, damage, *args) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args)
        self.damage = damage

    def fit(self, parameters, config):  # type: ignore[no-untyped-def]
        return self.damage(*super().fit(parameters, config))


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda w, n, m: ([np.full(3, np.nan, np.float32)], n, m), "'0' contains NaN or inf"),
        (lambda w, n, m: ([np.zeros(4, np.float32)], n, m), "has shape (4,)"),
        (lambda w, n, m: (w, 0, m), "num-examples must be an integer"),
        (lambda w, n, m: (w, n, {**m, "batch-size": 5}), "batch-size 5 differs from the 32"),
        (lambda w, n, m: (w, n, {**m, "train-time": -1.0}), "train-time must be positive"),
    ],
    ids=["nan", "shape", "zero-examples", "batch-size", "negative-time"],
)
def test_legacy_result_that_fails_validation_is_left_out(tmp_path, fl_log, damage, reason) -> None:  # type: ignore[no-untyped-def]
    # Prepare: client 103 (silo c) returns a damaged result
    strategy = LBBSPStrategy(
        initial_batch_size=32, local_steps=10, lr=0.05, telemetry_path=tmp_path / "t.jsonl",
        fraction_evaluate=0.0, min_fit_clients=3, min_available_clients=3,
        initial_parameters=ndarrays_to_parameters([np.zeros(3, dtype=np.float32)]),
        max_weight_ratio=None,  # FedAvg's weights: every size counts whole
    )  # fmt: skip
    server, _ = _server(
        strategy,
        {
            "101": CostModelClient("a", 400.0, 100, 1.0),
            "102": CostModelClient("b", 200.0, 300, 2.0),
            "103": DamagedClient(damage, "c", 100.0, 600, 4.0),
        },
    )

    # Execute
    server.fit(num_rounds=1, timeout=None)

    # Assert: FedAvg's average of a and b only; the reason logged and in the telemetry
    (weights,) = parameters_to_ndarrays(server.parameters)
    np.testing.assert_allclose(weights, np.average([1.0, 2.0], weights=[100, 300]), rtol=1e-6)
    events = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    [rejected] = [e for e in events if e["event"] == "rejected"]
    assert (rejected["silo"], rejected["node"]) == ("c", "103") and reason in rejected["reason"]
    assert strategy.balancer.predicted_speed("c") is None
    assert any("reply of silo c (node 103) rejected" in r.getMessage() for r in fl_log.records)


class ReadmeSilo(NumPyClient):
    """The silo side of docs/flower-apps.md's legacy-API example, verbatim."""

    def __init__(self, silo_id: str, slowdown: float) -> None:
        generator = torch.Generator().manual_seed(len(silo_id))
        self.x = torch.rand(64, 1, 8, 8, generator=generator)
        self.y = torch.randint(0, 10, (64,), generator=generator)
        self.net = build_model("mlp", input_shape=(1, 8, 8), num_classes=10)
        self.silo_id, self.slowdown = silo_id, slowdown

    def fit(self, parameters, config):  # type: ignore[no-untyped-def]
        state = dict(zip(self.net.state_dict(), map(torch.from_numpy, parameters), strict=True))
        self.net.load_state_dict(state)
        result = train_local(
            self.net,
            self.x,
            self.y,
            batch_size=int(config["batch-size"]),
            local_steps=int(config["local-steps"]),
            lr=float(config["lr"]),
        )
        train_time = emulate_slowdown(result.compute_time, self.slowdown)
        metrics = {
            "train-time": train_time,
            "batch-size": int(config["batch-size"]),
            "samples-processed": result.samples,
            "silo-id": self.silo_id,
        }
        weights = [v.detach().numpy() for v in self.net.state_dict().values()]
        return weights, len(self.x), metrics


def test_readme_silo_trains_through_the_legacy_server(tmp_path) -> None:
    # Prepare
    net = build_model("mlp", input_shape=(1, 8, 8), num_classes=10)
    initial = [v.detach().numpy() for v in net.state_dict().values()]
    strategy = LBBSPStrategy(
        initial_batch_size=16,
        local_steps=5,
        lr=0.05,
        fraction_evaluate=0.0,
        min_fit_clients=2,
        min_available_clients=2,
        initial_parameters=ndarrays_to_parameters(initial),
    )
    server, proxies = _server(strategy, {"7": ReadmeSilo("x", 1.0), "8": ReadmeSilo("y", 2.0)})

    # Execute
    server.fit(num_rounds=2, timeout=None)

    # Assert: the balancer knows both silos by their ids; the model moved
    assert sorted(strategy.balancer.silo_ids) == ["x", "y"]
    assert all(v is not None for v in map(strategy.balancer.predicted_speed, "xy"))
    second = [p.fit_configs[1]["batch-size"] for p in proxies.values()]
    assert sum(second) == 32
    final = parameters_to_ndarrays(server.parameters)
    assert any(not np.allclose(a, b) for a, b in zip(final, initial, strict=True))


# ------------------------------------------------------------------------ parity
class _Client:
    def __init__(self, cid: str) -> None:
        self.cid = cid


class _Manager:
    """The part of a legacy ClientManager that FedAvg.configure_fit uses."""

    def __init__(self, cids: list[str]) -> None:
        self.clients = [_Client(c) for c in cids]

    def num_available(self) -> int:
        return len(self.clients)

    def sample(self, num_clients: int, min_num_clients: int | None = None) -> list[_Client]:
        return self.clients[:num_clients]


class _Grid:
    def __init__(self, nodes: list[int]) -> None:
        self.nodes = nodes

    def get_node_ids(self) -> list[int]:
        return list(self.nodes)


@pytest.mark.usefixtures("flower_task")
@pytest.mark.parametrize("allocator", ["proportional", "linear"])
def test_legacy_adapter_and_message_api_strategy_give_the_same_batch_sizes(
    tmp_path, allocator
) -> None:  # type: ignore[no-untyped-def]
    # Prepare: the same settings; the same reports (affine costs that change over rounds)
    settings = {"initial_batch_size": 40, "local_steps": 8, "lr": 0.1, "allocator": allocator}
    legacy = LBBSPStrategy(**settings, min_fit_clients=4, min_available_clients=4)
    message = LBBSPFedAvg(**settings, min_train_nodes=4, min_available_nodes=4)
    silos = ["s0", "s1", "s2", "s3"]
    cost = {"s0": (0.002, 0.1), "s1": (0.004, 0.3), "s2": (0.009, 0.2), "s3": (0.003, 0.5)}
    manager, grid = _Manager(["1", "2", "3", "4"]), _Grid([1, 2, 3, 4])
    params = Parameters(tensors=[], tensor_type="numpy.ndarray")
    arrays = ArrayRecord({"w": Array(np.zeros(1, dtype=np.float32))})
    history: list[tuple[dict[str, int], dict[str, int]]] = []
    per_silo: list[tuple[dict, dict]] = []  # type: ignore[type-arg]

    def metrics(silo: str, b: int, rnd: int) -> dict:  # type: ignore[type-arg]
        a, fixed = cost[silo]
        slow = 3.0 if silo == "s1" and rnd >= 4 else 1.0  # a co-tenant arrives
        return {
            "train-time": slow * (a * b * 8 + fixed),
            "batch-size": b,
            "samples-processed": b * 8,
            "cpu-percent": 50.0,
            "memory-percent": 20.0,
            "max-batch-size": 70 if silo == "s3" else 0,
        }

    for rnd in range(1, 8):
        # Execute: cid "k" and node k are silo s(k-1) in both APIs
        fit = legacy.configure_fit(rnd, params, manager)  # type: ignore[arg-type]
        train = list(message.configure_train(rnd, arrays, ConfigRecord(), grid))  # type: ignore[arg-type]
        legacy_sizes = {silos[int(c.cid) - 1]: int(ins.config["batch-size"]) for c, ins in fit}
        message_sizes = {
            silos[m.metadata.dst_node_id - 1]: int(m.content["config"]["batch-size"]) for m in train
        }
        history.append((legacy_sizes, message_sizes))
        results = []
        for client, _ in fit:
            silo = silos[int(client.cid) - 1]
            m = metrics(silo, legacy_sizes[silo], rnd)
            res = FitRes(Status(Code.OK, ""), params, 100, {**m, "silo-id": silo})
            results.append((client, res))
        replies = []
        for msg in train:
            silo = silos[msg.metadata.dst_node_id - 1]
            content = RecordDict(
                {
                    "arrays": arrays,
                    "metrics": MetricRecord(
                        {**metrics(silo, message_sizes[silo], rnd), "num-examples": 100}
                    ),
                    "silo": ConfigRecord({"silo-id": silo}),
                }
            )
            replies.append(make_reply(content, node_id=msg.metadata.dst_node_id))
        _, legacy_metrics = legacy.aggregate_fit(rnd, results, [])
        _, message_metrics = message.aggregate_train(rnd, replies)
        per_silo.append((legacy_metrics, dict(message_metrics or {})))

    # Assert: identical every round, and they did move away from B_init
    for legacy_sizes, message_sizes in history:
        assert legacy_sizes == message_sizes
    last = history[-1][0]
    assert sum(last.values()) == 160
    assert len(set(last.values())) == 4  # they moved away from B_init = 40
    assert last["s3"] <= 70  # the reported memory cap holds in both
    assert last["s1"] < history[2][0]["s1"]  # s1 slowed down from round 4 and got less
    assert legacy.balancer.to_json() == message.balancer.to_json()
    # both APIs report each silo's batch size under its silo id, round 1 included
    for (legacy_sizes, _), (legacy_metrics, message_metrics) in zip(history, per_silo, strict=True):
        expected = {f"batch-size/{silo}": b for silo, b in legacy_sizes.items()}
        assert {k: v for k, v in legacy_metrics.items() if k.startswith("batch-size/")} == expected
        assert {k: v for k, v in message_metrics.items() if k.startswith("batch-size/")} == expected


@pytest.mark.usefixtures("flower_task")
def test_legacy_aggregate_does_not_depend_on_the_order_results_finished_in() -> None:
    # Prepare: four clients' float32 updates and dataset sizes, handed over in two orders
    from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays

    rng = np.random.default_rng(0)
    manager = _Manager(["1", "2", "3", "4"])
    results = []
    for k, client in enumerate(manager.clients):
        update = [rng.standard_normal(5000).astype(np.float32)]
        metrics = {"train-time": 1.0, "batch-size": 40, "samples-processed": 320,
                   "silo-id": f"s{k}"}  # fmt: skip
        res = FitRes(Status(Code.OK, ""), ndarrays_to_parameters(update), 97 + 13 * k, metrics)
        results.append((client, res))
    aggregates = []
    for order in (results, results[::-1]):
        strategy = LBBSPStrategy(initial_batch_size=40, local_steps=8, lr=0.1,
                                 min_fit_clients=4, min_available_clients=4)  # fmt: skip
        strategy.configure_fit(1, ndarrays_to_parameters([np.zeros(5000, np.float32)]), manager)  # type: ignore[arg-type]

        # Execute
        parameters, _ = strategy.aggregate_fit(1, list(order), [])  # type: ignore[arg-type]
        assert parameters is not None
        aggregates.append(parameters_to_ndarrays(parameters)[0])

    # Assert: bit for bit
    assert aggregates[0].tobytes() == aggregates[1].tobytes()


class CrashingClient(NumPyClient):
    """A client whose fit raises (a missing module, a bug in the app)."""

    def fit(self, parameters, config):  # type: ignore[no-untyped-def]
        raise ModuleNotFoundError("No module named 'tenseal'")


@pytest.mark.parametrize("crashing", [{"101", "102"}, {"101"}], ids=["all", "one"])
def test_legacy_run_whose_clients_all_fail_stops_with_their_error(
    crashing: set[str], fl_log: pytest.LogCaptureFixture
) -> None:
    # Prepare: clients that raise in fit, next to an honest one or not
    from fl_lbbsp.strategies.outcomes import NoUpdateError

    strategy = LBBSPStrategy(
        initial_batch_size=32,
        local_steps=10,
        lr=0.05,
        fraction_evaluate=0.0,
        min_fit_clients=2,
        min_available_clients=2,
        initial_parameters=ndarrays_to_parameters([np.zeros(3, dtype=np.float32)]),
    )
    clients: dict[str, NumPyClient] = {
        cid: CrashingClient() if cid in crashing else CostModelClient("b", 200.0, 300, 2.0)
        for cid in ("101", "102")
    }
    server, _ = _server(strategy, clients)

    # Execute / Assert: every client failing at once stops the run with their error, not
    # an empty history blamed on timeouts; one failing client does not
    if crashing == set(clients):
        with pytest.raises(NoUpdateError, match=r"first round.*No module named 'tenseal'"):
            server.fit(num_rounds=2, timeout=None)
        assert not any("no usable reply" in r.getMessage() for r in fl_log.records)
    else:
        history, _ = server.fit(num_rounds=2, timeout=None)
        assert history is not None


@pytest.mark.parametrize("inplace", [True, False])
def test_the_legacy_strategy_keeps_an_integer_scalar_buffer(inplace: bool) -> None:
    # Prepare: two clients of 100 and 200 examples; counters 10 and 20 (Flower's own
    # in-place mean multiplies an integer layer by its weight cast to an integer, 0)
    manager = _Manager(["1", "2"])
    strategy = LBBSPStrategy(initial_batch_size=8, local_steps=2, lr=0.1, min_fit_clients=2,
                             min_available_clients=2, inplace=inplace)  # fmt: skip
    start = [np.zeros(3, np.float32), np.array(0, np.int64)]
    strategy.configure_fit(1, ndarrays_to_parameters(start), manager)  # type: ignore[arg-type]
    results = []
    for k, (client, size) in enumerate(zip(manager.clients, (100, 200), strict=True)):
        arrays = [np.full(3, k + 1, np.float32), np.array(10 * (k + 1), np.int64)]
        metrics = {"train-time": 1.0, "batch-size": 8, "samples-processed": 16,
                   "silo-id": f"s{k}"}  # fmt: skip
        res = FitRes(Status(Code.OK, ""), ndarrays_to_parameters(arrays), size, metrics)
        results.append((client, res))

    # Execute
    parameters, _ = strategy.aggregate_fit(1, results, [])  # type: ignore[arg-type]

    # Assert: the layout of the model sent; with two silos the default cap weighs them
    # alike (neither more than the other), so the counter is 15, the weights 1.5
    assert parameters is not None
    weights, counter = parameters_to_ndarrays(parameters)
    assert counter.dtype == np.int64 and counter.shape == () and int(counter) == 15
    assert weights.dtype == np.float32 and weights == pytest.approx(np.full(3, 1.5))


def test_a_client_that_raised_is_named_in_the_rounds_line(caplog: pytest.LogCaptureFixture) -> None:
    # Prepare: two clients; Flower hands over one result and one client's exception
    import logging

    caplog.set_level(logging.INFO, logger="flwr")

    manager = _Manager(["1", "2"])
    strategy = LBBSPStrategy(initial_batch_size=8, local_steps=2, lr=0.1, min_fit_clients=2,
                             min_available_clients=2)  # fmt: skip
    strategy.configure_fit(1, ndarrays_to_parameters([np.zeros(3, np.float32)]), manager)  # type: ignore[arg-type]
    metrics = {"train-time": 1.0, "batch-size": 8, "samples-processed": 16, "silo-id": "s0"}
    res = FitRes(
        Status(Code.OK, ""), ndarrays_to_parameters([np.ones(3, np.float32)]), 100, metrics
    )

    # Execute
    parameters, _ = strategy.aggregate_fit(1, [(manager.clients[0], res)], [ValueError("boom")])  # type: ignore[list-item]

    # Assert: the round goes on with the result; its line names the failure, as the
    # Message-API strategy's names an error reply
    assert parameters is not None
    line = next(r.getMessage() for r in caplog.records if "[lbbsp] round 1" in r.getMessage())
    assert "left out: ? (rejected: failed: ValueError: boom)" in line


def test_under_secagg_the_shared_mean_is_returned_as_the_protocol_weighted_it(
    fl_log: pytest.LogCaptureFixture,
) -> None:
    # Prepare: two clients of 600 and 100 examples whose FitRes hold one and the same
    # Parameters, the unmasked mean SecAgg+ hands over (weighted by num_examples already)
    from flwr.common import ndarrays_to_parameters

    manager = _Manager(["1", "2"])
    strategy = LBBSPStrategy(initial_batch_size=8, local_steps=2, lr=0.1, min_fit_clients=2,
                             min_available_clients=2)  # fmt: skip
    strategy.configure_fit(1, ndarrays_to_parameters([np.zeros(3, np.float32)]), manager)  # type: ignore[arg-type]
    shared = ndarrays_to_parameters([np.full(3, 0.25, np.float32)])
    results = []
    for k, (client, size) in enumerate(zip(manager.clients, (600, 100), strict=True)):
        metrics = {"train-time": 1.0, "batch-size": 8, "samples-processed": 16,
                   "silo-id": f"s{k}"}  # fmt: skip
        results.append((client, FitRes(Status(Code.OK, ""), shared, size, metrics)))

    # Execute
    parameters, _ = strategy.aggregate_fit(1, results, [])  # type: ignore[arg-type]

    # Assert: that mean, and no weight cap said of a weighting the server did not do
    assert parameters is not None
    assert parameters_to_ndarrays(parameters)[0] == pytest.approx(np.full(3, 0.25))
    assert not [r for r in fl_log.records if "weighs as" in r.getMessage()]


def test_the_legacy_strategy_warns_once_when_on_fit_config_fn_sets_another_lr(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Prepare: the app's on_fit_config_fn sends its own learning rate, as Flower's
    # templates do; every silo trains with the strategy's eta instead
    manager = _Manager(["1", "2"])
    strategy = LBBSPStrategy(initial_batch_size=8, local_steps=2, lr=0.1, min_fit_clients=2,
                             min_available_clients=2,
                             on_fit_config_fn=lambda rnd: {"lr": 0.01})  # fmt: skip
    params = ndarrays_to_parameters([np.zeros(3, np.float32)])

    # Execute: two rounds' instructions
    with caplog.at_level(logging.WARNING, logger="fl_lbbsp"):
        fit = [strategy.configure_fit(rnd, params, manager) for rnd in (1, 2)]  # type: ignore[arg-type]

    # Assert: the strategy's eta is sent, and one warning names both values
    assert {ins.config["lr"] for round_fit in fit for _, ins in round_fit} == {0.1}
    warnings = [r.getMessage() for r in caplog.records if "is overridden" in r.getMessage()]
    assert len(warnings) == 1
    assert "lr=0.01" in warnings[0] and "lr=0.1" in warnings[0]


def test_the_legacy_metric_average_weighs_an_undeclared_huge_claim_at_its_capped_weight() -> None:
    # Prepare: three clients of 100 examples and a loss of 1; a fourth claims 9.9 million
    # examples and a loss of 10; the app averages metrics by num_examples, as Flower's do
    def mean_loss(results: list[tuple[int, dict]]) -> dict:  # type: ignore[type-arg]
        total = sum(n for n, _ in results)
        return {"train-loss": sum(n * float(m["train-loss"]) for n, m in results) / total}

    manager = _Manager(["1", "2", "3", "4"])
    strategy = LBBSPStrategy(initial_batch_size=8, local_steps=2, lr=0.1, min_fit_clients=4,
                             min_available_clients=4,
                             fit_metrics_aggregation_fn=mean_loss)  # fmt: skip
    strategy.configure_fit(1, ndarrays_to_parameters([np.zeros(3, np.float32)]), manager)  # type: ignore[arg-type]
    results = []
    for k, client in enumerate(manager.clients):
        size, loss = (9_900_000, 10.0) if k == 3 else (100, 1.0)
        metrics = {"train-time": 1.0, "batch-size": 8, "samples-processed": 16,
                   "silo-id": f"s{k}", "train-loss": loss}  # fmt: skip
        update = ndarrays_to_parameters([np.full(3, float(k == 3), np.float32)])
        results.append((client, FitRes(Status(Code.OK, ""), update, size, metrics)))

    # Execute
    parameters, metrics = strategy.aggregate_fit(1, results, [])  # type: ignore[arg-type]

    # Assert: the claim weighs 200 (2x the median) in the model and in the metrics alike
    assert parameters is not None
    assert parameters_to_ndarrays(parameters)[0] == pytest.approx(np.full(3, 200 / 500))
    assert metrics["train-loss"] == pytest.approx((300 * 1.0 + 200 * 10.0) / 500)
