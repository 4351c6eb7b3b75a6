"""A silo that does not use torch never imports it: a numpy softmax regression under
``@lbbsp_train()`` in a fresh process, the sampler's torch-identical permutations without
torch, and the torch path (``DataLoader``, ``plan.loader``) on the same sampler."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from fl_lbbsp.clients import LocalTraining, ResizableBatchSampler
from fl_lbbsp.clients.sampler import TORCH_DEFAULT_SEED, torch_randperm
from fl_lbbsp.contract import RecordKeys
from fl_lbbsp.instruction import round_seed

KEYS = RecordKeys()
B, TAU, ROUND, N = 12, 5, 3, 60
COST_M, COST_B = 0.001, 0.002

NUMPY_SILO = textwrap.dedent(
    """
    import json, sys

    import numpy as np
    from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.supercore.task_identity import TaskIdentity

    from fl_lbbsp.clients import LocalTraining, lbbsp_train
    from fl_lbbsp.contract import RecordKeys

    keys = RecordKeys()
    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0
    rng = np.random.default_rng(0)
    x = rng.normal(size=({n}, 4))
    y = (x[:, 0] > 0).astype(int)
    drawn = []
    app = ClientApp()

    @app.train()
    @lbbsp_train(cost_model="{m},{b}", emulate_wait=False)
    def train(msg: Message, context: Context, plan: LocalTraining) -> Message:
        w, b = msg.content["arrays"].to_numpy_ndarrays()
        losses = []
        with plan.timed():
            for batch in plan.batch_sampler(len(x)):
                drawn.append(batch)
                xb, yb, rows = x[batch], y[batch], np.arange(len(batch))
                logits = xb @ w + b
                p = np.exp(logits - logits.max(axis=1, keepdims=True))
                p /= p.sum(axis=1, keepdims=True)
                losses.append(float(-np.log(p[rows, yb]).mean()))
                p[rows, yb] -= 1.0
                w = w - plan.lr * xb.T @ p / len(batch)
                b = b - plan.lr * p.mean(axis=0)
        metrics = {{keys.num_examples: len(x), "train_loss": float(np.mean(losses))}}
        content = RecordDict({{"arrays": ArrayRecord([w, b]), "metrics": MetricRecord(metrics)}})
        return Message(content=content, reply_to=msg)

    config = {{keys.batch_size: {B}, keys.local_steps: {tau}, keys.lr: 0.5,
              keys.server_round: {round}}}
    arrays = ArrayRecord([np.zeros((4, 2)), np.zeros(2)])
    message = Message(
        content=RecordDict({{"arrays": arrays, "config": ConfigRecord(config)}}),
        dst_node_id=7,
        message_type="train",
    )
    context = Context(
        run_id=1,
        node_id=7,
        node_config={{"partition-id": 0, "num-partitions": 1, "slowdown": 2.0,
                     keys.silo_id: "bank-a"}},
        state=RecordDict(),
        run_config={{}},
    )
    reply = train(message, context)
    silo = reply.content[keys.silo_record]
    print(json.dumps({{
        "metrics": dict(reply.content["metrics"]),
        "notes": {{k: silo[k] for k in silo}},
        "moved": bool(np.abs(reply.content["arrays"].to_numpy_ndarrays()[0]).sum() > 0),
        "drawn": drawn,
        "torch": "torch" in sys.modules,
    }}))
    """
).format(n=N, m=COST_M, b=COST_B, B=B, tau=TAU, round=ROUND)


def _run(script: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False, timeout=120
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.fixture(scope="module")
def numpy_silo() -> dict[str, Any]:
    """What the numpy silo's process replied, drew and loaded."""
    return _run(NUMPY_SILO)


def test_a_numpy_silo_trains_under_the_decorator_without_importing_torch(
    numpy_silo: dict[str, Any],
) -> None:
    # Assert: the contract's metrics, the cost model's time for a 2x slower silo,
    # exactly tau batches of B drawn (no misuse), the model trained, torch never loaded
    metrics, notes = numpy_silo["metrics"], numpy_silo["notes"]
    assert numpy_silo["torch"] is False
    assert metrics[KEYS.train_time] == pytest.approx(TAU * 2 * (COST_M * B + COST_B))
    assert metrics[KEYS.batch_size] == B and metrics[KEYS.num_examples] == N
    assert metrics[KEYS.samples_processed] == metrics[KEYS.samples_drawn] == B * TAU
    assert {KEYS.cpu_percent, KEYS.memory_percent, "train_loss"} <= set(metrics)
    assert KEYS.misuse not in notes and notes[KEYS.silo_id] == "bank-a"
    assert [len(batch) for batch in numpy_silo["drawn"]] == [B] * TAU
    assert numpy_silo["moved"] is True


def test_a_numpy_silo_draws_the_batches_a_torch_silo_draws(numpy_silo: dict[str, Any]) -> None:
    # Prepare: the same silo, round and run seed, with torch loaded in this process
    seed = round_seed(0, "bank-a", ROUND)
    generator = torch.Generator().manual_seed(seed)

    # Execute
    plan = LocalTraining(batch_size=B, local_steps=TAU, lr=0.5, server_round=ROUND, seed=seed)
    with_plan = list(plan.batch_sampler(N))
    with_torch = list(ResizableBatchSampler(N, batch_size=B, num_batches=TAU, generator=generator))

    # Assert
    assert numpy_silo["drawn"] == with_plan == with_torch


@pytest.mark.parametrize("seed", [0, 1, 12345, 2**32 + 7, 2**63 - 1, TORCH_DEFAULT_SEED])
def test_torch_randperm_reproduces_torch_without_it(seed: int) -> None:
    # Prepare: consecutive permutations of several sizes from one generator
    sizes = [1, 2, 7, 50, 1000, 1, 333]
    generator = torch.Generator().manual_seed(seed)

    # Execute
    stream = torch_randperm(seed)
    ours = [stream(n) for n in sizes]
    theirs = [torch.randperm(n, generator=generator).tolist() for n in sizes]

    # Assert
    assert ours == theirs


def test_an_unseeded_sampler_shuffles_as_a_fresh_torch_generator() -> None:
    # Execute
    unseeded = list(ResizableBatchSampler(9, batch_size=4, num_batches=6))
    fresh = list(ResizableBatchSampler(9, batch_size=4, num_batches=6, generator=torch.Generator()))

    # Assert
    assert unseeded == fresh


def test_the_sampler_refuses_a_generator_and_a_seed_together() -> None:
    # Execute / Assert
    with pytest.raises(ValueError, match="not both"):
        ResizableBatchSampler(9, batch_size=4, generator=torch.Generator(), seed=1)


def test_torch_dataloaders_take_the_plain_sampler_and_plan_loader_recuts_one() -> None:
    # Prepare
    data = TensorDataset(torch.arange(40).float(), torch.arange(40))
    plans = [
        LocalTraining(batch_size=6, local_steps=4, lr=0.1, server_round=1, seed=9) for _ in range(3)
    ]

    # Execute
    expected = list(plans[0].batch_sampler(40))
    direct = [y.tolist() for _, y in DataLoader(data, batch_sampler=plans[1].batch_sampler(40))]
    recut = plans[2].loader(DataLoader(data, batch_size=32, shuffle=True))
    loaded = [y.tolist() for _, y in recut]

    # Assert: the DataLoaders yield exactly the sampler's batches, and count them
    assert direct == loaded == expected
    assert len(recut) == 4
    assert plans[1].samples_drawn == plans[2].samples_drawn == 24


LIGHT = textwrap.dedent(
    """
    import json, sys

    import fl_lbbsp
    import fl_lbbsp.clients.adapter, fl_lbbsp.clients.emulation, fl_lbbsp.clients.round
    import fl_lbbsp.clients.emulated
    import fl_lbbsp.clients.sampler, fl_lbbsp.clients.task
    from fl_lbbsp.clients import (
        CostModel, Emulation, LocalTraining, ResizableBatchSampler, SlowdownSchedule,
        check_batch_size, emulate_slowdown, emulated_time, lbbsp_train, machine_usage,
        misuse_of, run_emulated_round, run_round,
    )

    light = "torch" in sys.modules
    from fl_lbbsp.clients import train_local

    print(json.dumps({"light": light, "heavy": "torch" in sys.modules}))
    """
)


def test_the_torch_free_names_leave_torch_out_until_a_torch_helper_is_used() -> None:
    # Execute
    loaded = _run(LIGHT)

    # Assert
    assert loaded == {"light": False, "heavy": True}


def test_a_sampler_without_torch_matches_one_with_it_in_a_fresh_process() -> None:
    # Prepare: a plan whose sampler is built before torch is loaded, then one after
    script = textwrap.dedent(
        """
        import json, sys
        from fl_lbbsp.clients import ResizableBatchSampler
        before = list(ResizableBatchSampler(11, batch_size=4, num_batches=7, seed=5))
        light = "torch" in sys.modules
        import torch
        after = list(ResizableBatchSampler(11, batch_size=4, num_batches=7, seed=5))
        print(json.dumps({"light": light, "same": before == after, "batches": after}))
        """
    )
    generator = torch.Generator().manual_seed(5)

    # Execute
    result = _run(script)

    # Assert
    assert result["light"] is False and result["same"] is True
    assert result["batches"] == list(
        ResizableBatchSampler(11, batch_size=4, num_batches=7, generator=generator)
    )
