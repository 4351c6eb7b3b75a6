"""Silo side: resizable sampler, local trainer, slowdown emulation."""

from __future__ import annotations

import pytest
import torch

from fl_lbbsp.clients import (
    ResizableBatchSampler,
    SlowdownSchedule,
    TrainerConfig,
    emulate_slowdown,
    train_local,
)
from fl_lbbsp.models import build_model


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, None, "8"])
def test_sampler_rejects_bad_batch_sizes_naming_the_value(bad: object) -> None:
    # Execute / Assert
    with pytest.raises(ValueError, match=repr(bad).replace("(", r"\(").replace(")", r"\)")):
        ResizableBatchSampler(10, batch_size=bad)  # type: ignore[arg-type]


def test_sampler_covers_every_sample_once_per_pass_and_reads_size_each_batch() -> None:
    # Prepare
    sampler = ResizableBatchSampler(10, batch_size=5, generator=torch.Generator().manual_seed(0))
    it = iter(sampler)

    # Execute: one pass of 10 in two batches of 5, then the size changes mid-iteration
    first_pass = next(it) + next(it)
    sampler.batch_size = 3
    resized = next(it)

    # Assert
    assert sorted(first_pass) == list(range(10))
    assert len(resized) == 3


def test_sampler_is_deterministic_for_a_seed_and_stops_after_num_batches() -> None:
    # Prepare
    def batches(seed: int) -> list[list[int]]:
        g = torch.Generator().manual_seed(seed)
        return list(ResizableBatchSampler(7, batch_size=4, num_batches=5, generator=g))

    # Execute
    a, b, c = batches(1), batches(1), batches(2)

    # Assert: 5 batches of 4 over 7 samples cycle through reshuffled passes
    assert a == b and a != c
    assert len(a) == 5 and all(len(x) == 4 for x in a)
    flat = [i for batch in a for i in batch]
    assert sorted(flat[:7]) == list(range(7)) and sorted(flat[7:14]) == list(range(7))


def test_train_local_runs_exactly_tau_steps_at_the_given_batch_size() -> None:
    # Prepare
    torch.manual_seed(0)
    model = build_model("mlp", input_shape=(1, 4, 4), num_classes=3)
    x, y = torch.randn(20, 1, 4, 4), torch.randint(0, 3, (20,))
    steps: list[int] = []
    model.register_forward_hook(lambda m, inp, out: steps.append(inp[0].shape[0]))
    before = [p.detach().clone() for p in model.parameters()]

    # Execute
    result = train_local(model, x, y, batch_size=6, local_steps=7, lr=0.1)

    # Assert
    assert steps == [6] * 7
    assert result.samples == 42
    assert result.compute_time > 0
    assert any(not torch.equal(p, q) for p, q in zip(before, model.parameters(), strict=True))


def _trained(optimizer: str | None) -> tuple[list[torch.Tensor], torch.optim.Optimizer | None]:
    torch.manual_seed(0)
    model = build_model("mlp", input_shape=(1, 4, 4), num_classes=3)
    x, y = torch.randn(20, 1, 4, 4), torch.randint(0, 3, (20,))
    opt: torch.optim.Optimizer | None = None
    if optimizer == "plain":  # the app's SGD, with a learning rate the server overrides
        opt = torch.optim.SGD(model.parameters(), lr=9.0)
    elif optimizer == "momentum":
        opt = torch.optim.SGD(model.parameters(), lr=9.0, momentum=0.9)
    train_local(model, x, y, batch_size=6, local_steps=5, lr=0.1,
                generator=torch.Generator().manual_seed(1), optimizer=opt)  # fmt: skip
    return [p.detach().clone() for p in model.parameters()], opt


def test_train_local_steps_the_apps_optimizer_at_the_servers_learning_rate() -> None:
    # Execute
    default, _ = _trained(None)
    plain, plain_opt = _trained("plain")
    momentum, momentum_opt = _trained("momentum")

    # Assert: the app's plain SGD at eta is the default trainer step for step; its
    # momentum is kept (other weights, buffers filled); eta replaces the app's rate
    assert all(torch.equal(a, b) for a, b in zip(default, plain, strict=True))
    assert any(not torch.equal(a, b) for a, b in zip(default, momentum, strict=True))
    assert momentum_opt is not None and plain_opt is not None
    assert all(g["lr"] == 0.1 for g in [*plain_opt.param_groups, *momentum_opt.param_groups])
    assert all("momentum_buffer" in momentum_opt.state[p] for g in momentum_opt.param_groups
               for p in g["params"])  # fmt: skip


@pytest.mark.parametrize(
    ("field", "value"),
    [("batch_size", 0), ("batch_size", -1), ("local_steps", 0), ("lr", 0.0), ("lr", float("nan"))],
)
def test_trainer_config_rejects_bad_values_naming_the_field(field: str, value: object) -> None:
    # Prepare
    settings = {"batch_size": 8, "local_steps": 5, "lr": 0.1, field: value}

    # Execute / Assert
    with pytest.raises(ValueError, match=field):
        TrainerConfig(**settings)  # type: ignore[arg-type]


def test_slowdown_waits_k_minus_one_times_and_reports_k_times() -> None:
    # Prepare
    slept: list[float] = []

    # Execute
    reported = emulate_slowdown(0.5, 4.0, sleep=slept.append)

    # Assert
    assert reported == 2.0
    assert slept == [1.5]


def test_slowdown_without_wait_reports_k_times_at_once() -> None:
    # Prepare
    slept: list[float] = []

    # Execute
    reported = emulate_slowdown(0.5, 4.0, wait=False, sleep=slept.append)

    # Assert
    assert reported == 2.0
    assert slept == []


def test_slowdown_schedule_changes_k_over_rounds() -> None:
    # Execute
    constant = SlowdownSchedule.parse("4")
    schedule = SlowdownSchedule.parse("1:1,10:4")

    # Assert
    assert [constant.factor(r) for r in (1, 50)] == [4.0, 4.0]
    assert [schedule.factor(r) for r in (1, 9, 10, 30)] == [1.0, 1.0, 4.0, 4.0]
    assert str(schedule) == "1:1,10:4"


@pytest.mark.parametrize("bad", ["0.5", "x", "1:2,y", "0:2", "inf"])
def test_slowdown_schedule_rejects_bad_values(bad: str) -> None:
    # Execute / Assert
    with pytest.raises(ValueError, match="slowdown"):
        SlowdownSchedule.parse(bad)


@pytest.mark.parametrize(
    ("partition", "slowdowns", "message"),
    [
        (1, "1,4,1", "lists 1 entries for 3 partitions"),  # commas, as --speeds takes them
        (0, "1;4", "lists 2 entries for 3 partitions"),
        (0, "1;x;1", "invalid slowdown 'x'"),  # another silo's entry: every silo refuses
    ],
)
def test_run_config_slowdowns_of_the_wrong_shape_are_refused_by_every_silo(
    partition: int, slowdowns: str, message: str
) -> None:
    # Prepare: a simulation's node config (3 partitions)
    from fl_lbbsp.clients.emulated import slowdown_schedule

    node_config = {"partition-id": partition, "num-partitions": 3}

    # Execute / Assert
    with pytest.raises(ValueError, match=message):
        slowdown_schedule(node_config, run_config={"slowdowns": slowdowns})


@pytest.mark.parametrize(
    ("node_config", "run_config", "setup_slowdowns", "expected"),
    [
        ({"partition-id": 1, "slowdown": "3"}, {}, ("1", "2"), 3.0),
        ({"partition-id": 1}, {}, ("1", "2"), 2.0),
        ({"partition-id": 1}, {"slowdowns": "1;5"}, (), 5.0),
        ({"partition-id": 1}, {}, (), 1.0),
    ],
)
def test_slowdown_comes_from_node_config_then_setup_then_run_config(
    node_config: dict[str, object],
    run_config: dict[str, object],
    setup_slowdowns: tuple[str, ...],
    expected: float,
) -> None:
    # Prepare
    from flwr.app import Context, RecordDict

    from fl_lbbsp.clients.app import SiloSetup, _slowdown

    context = Context(
        run_id=1, node_id=1, node_config=node_config, state=RecordDict(), run_config=run_config
    )

    # Execute
    schedule = _slowdown(SiloSetup(slowdowns=setup_slowdowns), context)

    # Assert
    assert schedule.factor(1) == expected
