"""Cluster mode: weighted gradient aggregation, the server's SGD step, bad reports, and
one short run through the Simulation Engine."""

from __future__ import annotations

import logging
import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from conftest import FakeGrid, make_reply
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from fl_lbbsp.clients.cluster import WorkerSetup, gradient, worker_data
from fl_lbbsp.core.optim import SGD
from fl_lbbsp.models import build_model
from fl_lbbsp.strategies import LBBSPCluster

NODES = (11, 12, 13)


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model("mlp", input_shape=(1, 8, 8), num_classes=10)


def _batches(sizes: tuple[int, ...]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    return [
        (
            torch.randn(n, 1, 8, 8, generator=generator),
            torch.randint(0, 10, (n,), generator=generator),
        )
        for n in sizes
    ]


def _reply(node: int, grads: dict[str, np.ndarray], *, batch_size: int, train_time: float):  # type: ignore[no-untyped-def]
    metrics = MetricRecord(
        {
            "batch-size": batch_size,
            "num-examples": batch_size,
            "train-time": train_time,
            "samples-processed": batch_size,
            "cpu-percent": 50.0,
            "memory-percent": 10.0,
            "max-batch-size": 0,
        }
    )
    content = RecordDict(
        {
            "arrays": ArrayRecord({k: Array(v) for k, v in grads.items()}),
            "metrics": metrics,
            "silo": ConfigRecord({"silo-id": f"w{node}"}),
        }
    )
    return make_reply(content, node_id=node)


def _step(aggregation: str, sizes: tuple[int, ...], times=(1.0, 1.0, 1.0), lr: float = 0.1):  # type: ignore[no-untyped-def]
    """One iteration through LBBSPCluster: returns (start weights, new weights, strategy)."""
    model = _model()
    start = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    strategy = LBBSPCluster(
        initial_batch_size=16, lr=lr, aggregation=aggregation, min_train_nodes=3,
        min_available_nodes=3,
    )  # fmt: skip
    strategy.configure_train(
        1, ArrayRecord(model.state_dict()), ConfigRecord(), FakeGrid(list(NODES))
    )
    # As if the balancer had sent these sizes (a reply must use the batch size it was sent)
    state = strategy.round
    assert state is not None
    state.instructions = {
        node: replace(state.instructions[node], batch_size=size, share=size)
        for node, size in zip(NODES, sizes, strict=True)
    }
    replies = []
    for node, n, t, (x, y) in zip(NODES, sizes, times, _batches(sizes), strict=True):
        grads, _ = gradient(model, x, y)
        replies.append(_reply(node, grads, batch_size=n, train_time=t))
    arrays, _ = strategy.aggregate_train(1, replies)
    assert arrays is not None
    return start, {k: arrays[k].numpy() for k in start}, strategy


def _union_step(sizes: tuple[int, ...], lr: float = 0.1) -> dict[str, np.ndarray]:
    """The same SGD step on the union of all batches, in one process."""
    model = _model()
    batches = _batches(sizes)
    x = torch.cat([b[0] for b in batches])
    y = torch.cat([b[1] for b in batches])
    grads, _ = gradient(model, x, y)
    return {k: v.detach().numpy() - lr * grads[k] for k, v in model.state_dict().items()}


@pytest.mark.usefixtures("flower_task")
def test_weighted_aggregation_equals_the_gradient_of_the_union_of_batches() -> None:
    # Prepare: three workers with very different batch sizes
    sizes = (5, 17, 42)

    # Execute
    _, weighted, _ = _step("weighted", sizes)
    expected = _union_step(sizes)

    # Assert
    for name, value in expected.items():
        np.testing.assert_allclose(weighted[name], value, atol=1e-6, rtol=0)


@pytest.mark.usefixtures("flower_task")
def test_naive_aggregation_is_biased_when_batch_sizes_differ() -> None:
    # Prepare
    sizes = (5, 17, 42)

    # Execute
    _, naive, _ = _step("naive", sizes)
    expected = _union_step(sizes)

    # Assert
    gap = max(float(np.max(np.abs(naive[k] - expected[k]))) for k in expected)
    assert gap > 1e-3


@pytest.mark.usefixtures("flower_task")
def test_naive_and_weighted_agree_when_batch_sizes_are_equal() -> None:
    sizes = (16, 16, 16)
    _, naive, _ = _step("naive", sizes)
    _, weighted, _ = _step("weighted", sizes)
    for name in weighted:
        np.testing.assert_allclose(naive[name], weighted[name], atol=1e-6, rtol=0)


@pytest.mark.usefixtures("flower_task")
@pytest.mark.parametrize(
    ("times", "sizes", "reason"),
    [
        ((1.0, math.nan, 1.0), (8, 16, 24), "train-time"),
        ((1.0, -0.5, 1.0), (8, 16, 24), "train-time"),
        ((1.0, 1.0, 1.0), (8, 0, 24), "batch-size"),
    ],
    ids=["nan-time", "negative-time", "zero-batch"],
)
def test_a_bad_report_is_left_out_of_the_update_and_logged(
    times: tuple[float, ...], sizes: tuple[int, ...], reason: str, caplog
) -> None:
    # Execute
    with caplog.at_level(logging.WARNING, logger="fl_lbbsp"):
        start, updated, strategy = _step("weighted", sizes, times=times)

    # Assert: the update is the union gradient of workers 11 and 13 only
    model = _model()
    batches = _batches(sizes)
    x = torch.cat([batches[0][0], batches[2][0]])
    y = torch.cat([batches[0][1], batches[2][1]])
    grads, _ = gradient(model, x, y)
    for name in start:
        np.testing.assert_allclose(updated[name], start[name] - 0.1 * grads[name], atol=1e-6)
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "w12" in messages and reason in messages


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_server_sgd_matches_torch_sgd(momentum: float) -> None:
    # Prepare
    rng = np.random.default_rng(0)
    params = [rng.normal(size=(3, 4)).astype(np.float32), rng.normal(size=4).astype(np.float32)]
    grads = [[rng.normal(size=p.shape).astype(np.float32) for p in params] for _ in range(3)]
    tensors = [torch.tensor(p, requires_grad=True) for p in params]
    reference = torch.optim.SGD(tensors, lr=0.1, momentum=momentum)
    ours = SGD(lr=0.1, momentum=momentum)

    # Execute
    current = params
    for step in grads:
        current = ours.step(current, step)
        for t, g in zip(tensors, step, strict=True):
            t.grad = torch.tensor(g)
        reference.step()

    # Assert
    for mine, theirs in zip(current, tensors, strict=True):
        np.testing.assert_allclose(mine, theirs.detach().numpy(), atol=1e-6)
        assert mine.dtype == np.float32


@pytest.mark.parametrize(
    ("kwargs", "named"), [({"lr": 0.0}, "lr"), ({"lr": 0.1, "momentum": 1.0}, "momentum")]
)
def test_sgd_rejects_bad_settings(kwargs: dict[str, float], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        SGD(**kwargs)


def test_workers_sample_the_full_set_or_their_own_shard() -> None:
    # Prepare
    full = WorkerSetup(data="full", num_workers=4)
    shard = WorkerSetup(data="shard", num_workers=4)

    # Execute
    everything = worker_data(full, 2)
    shards = [worker_data(shard, k) for k in range(4)]

    # Assert: shards are disjoint, cover the training set, and are about equal
    assert len(worker_data(full, 0)) == len(everything)
    assert sum(len(s) for s in shards) == len(everything)
    assert max(len(s) for s in shards) - min(len(s) for s in shards) <= 1
    rows = {tuple(row) for s in shards for row in s.x.reshape(len(s), -1)[:, :64:7].tolist()}
    assert len(rows) > 0.9 * len(everything)


@pytest.mark.usefixtures("flower_task")
def test_workers_split_one_global_batch_by_offset() -> None:
    # Prepare: the server's configs for three workers with unequal batch sizes
    from fl_lbbsp.clients.cluster import _batch_indices

    strategy = LBBSPCluster(initial_batch_size=16, lr=0.1, min_train_nodes=3)
    messages = strategy.configure_train(
        1, ArrayRecord({"w": Array(np.zeros(2))}), ConfigRecord(), FakeGrid(list(NODES))
    )
    configs = [m.content["config"] for m in sorted(messages, key=lambda m: m.metadata.dst_node_id)]
    setup = WorkerSetup(data="full")
    data = worker_data(setup, 0)

    # Execute: each worker's indices at its offset, for BSP's sizes and for skewed ones
    def union(sizes: list[int]) -> list[int]:
        offset, picked = 0, []
        for k, size in enumerate(sizes):
            config = ConfigRecord({"batch-offset": offset, "batch-size": size})
            picked += _batch_indices(setup, data, str(k), 7, size, config).tolist()
            offset += size
        return picked

    # Assert: offsets are cumulative; any split of X draws the same global batch
    assert [c["batch-offset"] for c in configs] == [0, 16, 32]
    assert union([16, 16, 16]) == union([40, 5, 3]) == union([1, 1, 46])
    assert len(set(union([16, 16, 16]))) == 48
