"""LB-BSP on torch.distributed: the per-rank sampler, the weighted gradient (the loss
scaled by n B_r / X through DDP's own all-reduce, the DDP communication hook and the
explicit all-reduce) against the batch-size-weighted mean of the ranks' gradients and the
single-process gradient of the union batch, the sizes following the balancer from
injected times, ranks that disagree on the sizes taking rank 0's, resuming from a
balancer state, and a dead rank reported. Two gloo ranks spawned with
torch.multiprocessing; every wait is bounded and no assertion depends on wall-clock
speed."""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

from fl_lbbsp.core.balancer import BatchSizeBalancer, SiloReport
from fl_lbbsp.distributed import LBBSPBatchSampler, LBBSPCoordinator, Verdict, lbbsp_data_loader

WORLD = 2
SPAWN_TIMEOUT = 240.0  # seconds for a whole spawned test; generous on a loaded machine
TIMES = ((1.0, 3.0), (1.2, 2.7), (0.9, 3.3))  # injected seconds per iteration, per rank
B_INIT = 8


class FixedPlan:
    """A plan whose sizes the test sets."""

    def __init__(self, sizes: tuple[int, ...], rank: int) -> None:
        self.sizes = sizes
        self.rank = rank


# ----------------------------------------------------------------------------- sampler
def test_global_split_gives_each_rank_its_slice_of_one_global_batch() -> None:
    # Prepare: two ranks' samplers over the same stream, sizes (3, 5) then (6, 2)
    plans = [FixedPlan((3, 5), 0), FixedPlan((3, 5), 1)]
    iters = [iter(LBBSPBatchSampler(20, plan=p, seed=1)) for p in plans]
    reference = iter(LBBSPBatchSampler(20, plan=FixedPlan((8,), 0), seed=1))

    # Execute
    first = [next(i) for i in iters]
    for p in plans:
        p.sizes = (6, 2)
    second = [next(i) for i in iters]

    # Assert: the slices are the global batch in order, at each iteration's sizes
    assert [len(b) for b in first] == [3, 5] and [len(b) for b in second] == [6, 2]
    assert first[0] + first[1] == next(reference)
    assert second[0] + second[1] == next(reference)


def test_global_stream_is_torchs_seeded_permutations_one_pass_after_another() -> None:
    # Prepare: a world of one drawing 8 of 20 indices a batch (draws span two passes)
    sampler = iter(LBBSPBatchSampler(20, plan=FixedPlan((8,), 0), seed=1))
    generator = torch.Generator().manual_seed(1)
    passes = [torch.randperm(20, generator=generator).tolist() for _ in range(2)]

    # Execute
    drawn = [next(sampler) for _ in range(5)]

    # Assert: the batches are the permutations' indices in order, as Python ints
    assert [i for batch in drawn for i in batch] == passes[0] + passes[1]
    assert all(type(i) is int for batch in drawn for i in batch)


def test_shard_split_draws_from_disjoint_shards_at_the_plans_size() -> None:
    # Prepare
    plans = [FixedPlan((4, 7), 0), FixedPlan((4, 7), 1)]
    samplers = [LBBSPBatchSampler(30, plan=p, split="shard", num_batches=3) for p in plans]

    # Execute
    batches = [list(s) for s in samplers]

    # Assert: rank r only sees indices r mod 2; three batches of its size
    assert [[len(b) for b in bs] for bs in batches] == [[4, 4, 4], [7, 7, 7]]
    assert all(i % 2 == 0 for b in batches[0] for i in b)
    assert all(i % 2 == 1 for b in batches[1] for i in b)
    assert len(samplers[0]) == 3


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"num_samples": 0}, "num_samples"),
        ({"num_samples": 10, "split": "rows"}, "unknown split"),
        ({"num_samples": 10, "seed": -1}, "seed"),
        ({"num_samples": 10, "num_batches": 0}, "num_batches"),
        ({"num_samples": 1, "split": "shard"}, "shards"),
    ],
)
def test_sampler_rejects_bad_arguments(options: dict[str, Any], message: str) -> None:
    # Execute / Assert
    with pytest.raises(ValueError, match=message):
        LBBSPBatchSampler(plan=FixedPlan((2, 2), 0), **options)


@pytest.mark.parametrize(
    ("options", "message"),
    [({"num_workers": 2}, "num_workers"), ({"batch_size": 4}, "batch_size"),
     ({"shuffle": True}, "shuffle")],
)  # fmt: skip
def test_data_loader_refuses_what_would_break_the_plan(
    options: dict[str, Any], message: str
) -> None:
    # Execute / Assert
    with pytest.raises(ValueError, match=message):
        lbbsp_data_loader(list(range(10)), plan=FixedPlan((2, 2), 0), **options)


# ------------------------------------------------------------------ single process
def test_coordinator_without_a_process_group_is_a_world_of_one() -> None:
    # Prepare
    coordinator = LBBSPCoordinator(warm_up=0, initial_batch_size=B_INIT, every=1, overlap=False)

    # Execute
    changed = coordinator.step(0.5)

    # Assert: the whole global batch stays with the one rank
    assert changed and coordinator.sizes == (B_INIT,) and coordinator.weight == 1.0
    assert coordinator.overhead.rebalances == 1 and coordinator.overhead.iterations == 1


def test_close_waits_for_the_exchange_in_flight_without_deciding_from_it() -> None:
    # Prepare: an overlapped exchange started by the last step, not yet decided
    coordinator = LBBSPCoordinator(warm_up=0, initial_batch_size=B_INIT, every=1)
    coordinator.step(0.5)

    # Execute: training is over
    coordinator.close()
    coordinator.close()  # a second close has nothing left to wait for

    # Assert: the exchange was waited for but not decided from
    assert coordinator.overhead.rebalances == 0 and coordinator.sizes == (B_INIT,)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"initial_batch_size": 0}, "initial_batch_size"),
        ({"initial_batch_size": 8, "every": 0}, "every"),
        ({"initial_batch_size": 8, "rank_ids": ["a", "b"]}, "rank_ids"),
        ({"initial_batch_size": 8, "every": "often"}, "every"),
        ({"initial_batch_size": 8, "overhead_share": 1.5}, "overhead_share"),
        ({"initial_batch_size": 8, "max_every": 0}, "max_every"),
        ({"initial_batch_size": 8, "backoff": 0}, "backoff"),
        ({"initial_batch_size": 8, "warm_up": -1}, "warm_up"),
        ({"initial_batch_size": 8, "warm_up": True}, "warm_up"),
        ({"initial_batch_size": 8, "tolerance": 1.0}, "tolerance"),
        ({"initial_batch_size": 8, "noise_sigmas": -1.0}, "noise_sigmas"),
    ],
)
def test_coordinator_rejects_bad_arguments(options: dict[str, Any], message: str) -> None:
    # Execute / Assert
    with pytest.raises(ValueError, match=message):
        LBBSPCoordinator(**options)


@pytest.mark.parametrize(("backoff", "expected"), [(8, [2, 4, 8, 16]), (1, [2])])
def test_k_doubles_up_to_the_backoff_while_the_gate_holds_within_tolerance(
    backoff: int, expected: list[int]
) -> None:
    # Prepare: a world of one (nothing to balance: every window within tolerance)
    coordinator = LBBSPCoordinator(
        warm_up=0, initial_batch_size=B_INIT, every=2, backoff=backoff, overlap=False
    )

    # Execute
    seen = []
    for _ in range(60):
        coordinator.step(0.01)
        if coordinator.current_every not in seen:
            seen.append(coordinator.current_every)

    # Assert: k = every x 1, 2, 4, 8 (backoff 8), or every throughout (backoff 1)
    assert seen == expected


def _verdict(reason: str, *, equal: bool) -> Verdict:
    return Verdict(reason == "confirmed", 0.1, 0.05, 0, reason, equal=equal)


@pytest.mark.parametrize(
    ("verdicts", "expected"),
    [
        # held, the ranks shown equal: doubled, at most 4 x 10
        ([("within tolerance", True), ("within noise", True), ("within noise", True)],
         [20, 40, 40]),
        # a lead not yet told from the noise, or seen once: back to 10 at once
        ([("within noise", True), ("within noise", False), ("within tolerance", True)],
         [20, 10, 20]),
        ([("within noise", True), ("within noise", True), ("unconfirmed", False)],
         [20, 40, 10]),
        ([("within noise", True), ("confirmed", False), ("no times", False)], [20, 10, 10]),
    ],
)  # fmt: skip
def test_k_backs_off_only_on_windows_that_show_the_ranks_equal(
    verdicts: list[tuple[str, bool]], expected: list[int]
) -> None:
    # Prepare: every = 10, backoff 4
    from fl_lbbsp.distributed.cadence import Cadence

    cadence = Cadence(every=10, overhead_share=0.01, max_every=100, backoff=4)

    # Execute
    ks = [cadence.update([], _verdict(reason, equal=equal)) for reason, equal in verdicts]

    # Assert
    assert ks == expected


def test_automatic_every_stays_within_its_bounds() -> None:
    # Prepare
    coordinator = LBBSPCoordinator(warm_up=0, initial_batch_size=B_INIT, every="auto", max_every=3)

    # Execute
    seen = set()
    for _ in range(30):
        coordinator.step(0.01)
        seen.add(coordinator.current_every)

    # Assert: k starts at 1 and never leaves [1, max_every]; every exchange is counted
    assert seen <= {1, 2, 3}
    assert 10 <= coordinator.overhead.rebalances <= 30
    assert coordinator.overhead.per_iteration >= 0.0


def test_cpu_time_of_the_compute_leaves_out_the_wait_for_a_core(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Prepare: injected clocks; the rank computes 0.02 s of CPU over 0.05 s of wall time
    # (it queued for a core the rest of the time)
    from fl_lbbsp.distributed import coordinator as module

    wall, cpu = iter([10.0, 10.05]), iter([3.0, 3.02])
    monkeypatch.setattr(module.time, "perf_counter", lambda: next(wall))
    monkeypatch.setattr(module.time, "process_time", lambda: next(cpu))
    coordinator = LBBSPCoordinator(warm_up=0, initial_batch_size=B_INIT, cpu_time=True)
    assert coordinator.compute_cpu_time() is None and coordinator.began_at is None

    # Execute
    coordinator.begin()
    coordinator.mark_computed()

    # Assert: the CPU seconds and the wall seconds of the same compute, and its start
    assert coordinator.compute_cpu_time() == pytest.approx(0.02)
    assert coordinator.compute_time() == pytest.approx(0.05)
    assert coordinator.began_at == 10.0


def test_without_cpu_time_the_process_cpu_clock_is_never_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Prepare: a CPU clock that fails if read; a model whose 4 parameters mark the compute
    def unread() -> float:
        raise AssertionError("process_time read")

    monkeypatch.setattr(time, "process_time", unread)
    coordinator = LBBSPCoordinator(warm_up=0, initial_batch_size=B_INIT)
    model = _model()
    coordinator._clock.attach(model)
    x, y = _data()

    # Execute: two iterations of a timed backward
    for _ in range(2):
        coordinator.begin()
        F.cross_entropy(model(x[:B_INIT]), y[:B_INIT]).backward()
        coordinator.step()

    # Assert: the wall time is measured, the CPU time is not
    assert coordinator.compute_time() is None  # step() ended the iteration
    coordinator.begin()
    coordinator.mark_computed()
    assert coordinator.compute_time() is not None
    assert coordinator.compute_cpu_time() is None


def test_the_cpu_clock_is_read_once_an_iteration_at_its_last_mark(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Prepare: a CPU clock that counts its reads and advances 1 s per read; 3 marks per
    # iteration (3 gradients), then an iteration of 2 marks
    from fl_lbbsp.distributed.clock import ComputeClock

    reads = [0]

    def counted() -> float:
        reads[0] += 1
        return float(reads[0])

    monkeypatch.setattr(time, "process_time", counted)
    clock = ComputeClock(cpu=True)
    per_iteration = []

    # Execute
    for marks in (3, 3, 3, 2, 2):
        before = reads[0]
        clock.begin()
        for _ in range(marks):
            clock.mark()
        per_iteration.append((reads[0] - before, clock.cpu()))

    # Assert: every mark reads it in the first iteration (the count unknown), then only
    # the last (plus begin's read); an iteration with fewer marks than any before has no
    # CPU time, and the next reads at its new last mark
    assert [n for n, _ in per_iteration] == [4, 2, 2, 1, 2]
    assert [t is not None for _, t in per_iteration] == [True, True, True, False, True]
    assert per_iteration[1][1] == pytest.approx(1.0)  # begin's read, then the last mark's


def test_the_balancer_sees_the_windows_mean_iteration_whatever_its_length() -> None:
    # Prepare: a world of one, windows of 1 then 3 then 2 iterations of 0.5 s each
    coordinator = LBBSPCoordinator(warm_up=0, initial_batch_size=B_INIT, every=1, overlap=False)

    # Execute
    for every in (1, 3, 2):
        coordinator.cadence.every = coordinator.cadence.k = every
        for _ in range(every):
            coordinator.step(0.5)

    # Assert: every report the balancer took is one iteration (0.5 s at B); the exchanged
    # window keeps its totals
    silo = coordinator.balancer.state_dict()["silos"]["0"]
    assert silo["reports"] == 3
    assert silo["history"] == [[B_INIT, 0.5]] * 3
    assert coordinator.last_reports[0].compute_time == pytest.approx(1.0)
    assert coordinator.last_reports[0].iterations == 2


def test_step_without_a_time_is_an_error() -> None:
    # Prepare: no time given, none measured (no registered model marked the compute)
    coordinator = LBBSPCoordinator(warm_up=0, initial_batch_size=B_INIT)
    coordinator.begin()

    # Execute / Assert
    with pytest.raises(RuntimeError, match="no compute time"):
        coordinator.step()


def test_begin_refuses_a_batch_of_another_size() -> None:
    # Prepare
    coordinator = LBBSPCoordinator(warm_up=0, initial_batch_size=B_INIT)

    # Execute / Assert
    with pytest.raises(ValueError, match="draw ahead"):
        coordinator.begin(samples=B_INIT + 1)


# --------------------------------------------------------------- two spawned ranks
def _expected_sizes(every: int) -> list[tuple[int, int]]:
    """Sizes after each iteration: the default balancer fed the same (summed) reports,
    allocating as DDP's coordinator does (no noise budget: DDP weights by batch size)."""
    balancer = BatchSizeBalancer(initial_batch_size=B_INIT)
    sizes = balancer.allocate(["0", "1"], total=WORLD * B_INIT, budget=False)
    out, window = [], [0.0, 0.0]
    for k, times in enumerate(TIMES, start=1):
        window = [w + t for w, t in zip(window, times, strict=True)]
        if k % every == 0:
            for r in range(WORLD):
                report = SiloReport(
                    batch_size=sizes[str(r)], train_time=window[r], samples=every * sizes[str(r)]
                )
                balancer.report(str(r), report)
            sizes = balancer.allocate(["0", "1"], total=WORLD * B_INIT, budget=False)
            window = [0.0, 0.0]
        out.append((sizes["0"], sizes["1"]))
    return out


def _init(rank: int, store: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{store}",
        rank=rank,
        world_size=WORLD,
        timeout=datetime.timedelta(seconds=60),
    )


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    return torch.randn(40, 6, generator=generator), torch.randint(0, 3, (40,), generator=generator)


def _union_gradient(indices: list[int]) -> list[torch.Tensor]:
    x, y = _data()
    model = _model()
    F.cross_entropy(model(x[indices]), y[indices]).backward()
    return [p.grad.clone() for p in model.parameters() if p.grad is not None]


def _max_error(grads: list[torch.Tensor], expected: list[torch.Tensor]) -> float:
    return max(float((g - e).abs().max()) for g, e in zip(grads, expected, strict=True))


def _gradient_check(coordinator: LBBSPCoordinator, *, path: str) -> dict[str, Any]:
    """One iteration at the coordinator's sizes through ``path`` ("loss": DDP's own
    all-reduce of the scaled loss; "hook": the communication hook; "explicit"); this rank's
    aggregated gradient against the batch-size-weighted mean of every rank's own gradient
    (each rank's mean loss over its batch) and against the union batch's gradient."""
    x, y = _data()
    model = _model()
    sampler = iter(LBBSPBatchSampler(len(x), plan=coordinator, seed=5))
    mine = next(sampler)
    gathered: list[list[int] | None] = [None] * WORLD
    dist.all_gather_object(gathered, mine)
    parts = [part or [] for part in gathered]
    union = [i for part in parts for i in part]
    coordinator.begin(samples=len(mine))
    if path == "explicit":
        F.cross_entropy(model(x[mine]), y[mine]).backward()
        coordinator.all_reduce_gradients(model.parameters())
    else:
        ddp = nn.parallel.DistributedDataParallel(model)
        wrapped = coordinator.register(ddp, comm_hook=path == "hook")
        coordinator.scale_loss(F.cross_entropy(wrapped(x[mine]), y[mine])).backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    own = [_union_gradient(part) for part in parts]  # every rank's gradient, alone
    weighted = [
        sum((len(part) / len(union)) * g[k] for part, g in zip(parts, own, strict=True))
        for k in range(len(grads))
    ]
    expected = _union_gradient(union)
    return {
        "sizes": [len(part) for part in parts],
        "union": len(union),
        "loss_scale": coordinator.loss_scale,
        "error_weighted": _max_error(grads, weighted),
        "error_mean": _max_error(
            grads, [sum(g[k] for g in own) / WORLD for k in range(len(grads))]
        ),
        "max_error": _max_error(grads, expected),
        "scale": max(float(e.abs().max()) for e in expected),
        "compute_time_measured": coordinator.compute_time() is not None,
    }


def _worker_main(rank: int, store: str, out: str) -> None:
    _init(rank, store)
    try:
        result: dict[str, Any] = {}
        for every in (1, 2):
            coordinator = LBBSPCoordinator(
                warm_up=0, initial_batch_size=B_INIT, every=every, noise_sigmas=None, overlap=False
            )
            sizes = []
            for times in TIMES:
                coordinator.step(times[rank])
                sizes.append(list(coordinator.sizes))
            result[f"sizes_every_{every}"] = sizes
            result[f"rebalances_every_{every}"] = coordinator.overhead.rebalances
        # Times within 5% of each other: the sizes stay; with no tolerance they move.
        for tolerance in (0.05, 0.0):
            coordinator = LBBSPCoordinator(
                warm_up=0, initial_batch_size=64, tolerance=tolerance, every=1, overlap=False
            )
            coordinator.step((1.0, 1.04)[rank])
            result[f"near_equal_{tolerance}"] = list(coordinator.sizes)
        # Backoff: equal windows double k (1, 2, 4); an unequal one brings it back to 1.
        backing = LBBSPCoordinator(
            warm_up=0, initial_batch_size=B_INIT, every=1, noise_sigmas=None, overlap=False
        )
        result["backoff"] = []
        for times in [(1.0, 1.0)] * 3 + [(1.0, 3.0)] * 4:
            backing.step(times[rank])
            result["backoff"].append(backing.current_every)
        # ... but a window whose gain (7%) is within a noise known only from its own spread
        # (no window before it) does not show the ranks equal: k stays.
        noisy = LBBSPCoordinator(warm_up=0, initial_batch_size=B_INIT, every=2, overlap=False)
        for seconds in ((1.0, 1.3), (1.0, 1.0))[rank]:
            noisy.step(seconds)
        verdict = noisy.last_verdict
        result["backoff_noise"] = [noisy.current_every, verdict.reason if verdict else None]
        # Unequal sizes from the injected times, then the gradients at those sizes.
        # Overlapped (the default): the first window's gather waits for the next step.
        overlapped = LBBSPCoordinator(
            warm_up=0, initial_batch_size=B_INIT, every=1, noise_sigmas=None
        )
        result["overlapped"] = []
        for times in TIMES[:2]:
            decided = overlapped.step(times[rank])
            result["overlapped"].append([list(overlapped.sizes), decided])
        coordinator = LBBSPCoordinator(
            warm_up=0, initial_batch_size=B_INIT, every=1, noise_sigmas=None, overlap=False
        )
        coordinator.step(TIMES[0][rank])
        for path in ("loss", "hook", "explicit"):
            result[path] = _gradient_check(coordinator, path=path)
        # Resume: a new coordinator from the state continues exactly.
        state = json.loads(json.dumps(coordinator.state_dict()))
        resumed = LBBSPCoordinator(
            warm_up=0, initial_batch_size=B_INIT, every=1, noise_sigmas=None, overlap=False
        )
        resumed.load_state_dict(state)
        result["resumed_sizes"] = list(resumed.sizes)
        result["resumed_iteration"] = resumed.iteration
        for times in TIMES[1:]:
            coordinator.step(times[rank])
            resumed.step(times[rank])
        result["after_resume"] = [list(coordinator.sizes), list(resumed.sizes)]
        # Disagreement: rank 1 holds other sizes (as if it had decided otherwise); at the
        # next exchange both ranks take rank 0's sizes and balancer.
        coordinator = LBBSPCoordinator(warm_up=0, initial_batch_size=B_INIT, every=1, overlap=False)
        if rank == 1:
            coordinator._sizes = (B_INIT - 3, B_INIT + 3)
        coordinator.step(1.0)
        result["disagreement"] = [list(coordinator.sizes), coordinator.disagreements]
        Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()
    # Leave without the interpreter's finalization, where gloo's worker threads can still
    # abort the process after the work is done (pytorch/pytorch#179291).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _dying_worker(rank: int, store: str, out: str) -> None:
    _init(rank, store)
    # Rank 1 dies only once rank 0 has finished setting up the group: a rank that leaves
    # while its peer is still connecting makes init_process_group fail there instead.
    dist.barrier()
    ready = Path(out, "rank0-ready")
    if rank == 1:
        deadline = time.monotonic() + SPAWN_TIMEOUT
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        os._exit(0)  # dies without a word, as a killed process would
    ready.touch()
    from fl_lbbsp.distributed import RankFailureError

    coordinator = LBBSPCoordinator(warm_up=0, initial_batch_size=B_INIT, every=1)
    outcome = "no error"
    try:
        coordinator.step(1.0)  # starts the gather in the background
        coordinator.step(1.0)  # waits for it
    except RankFailureError as err:
        outcome = f"RankFailureError: {err}"
    Path(out, "rank0.json").write_text(json.dumps({"outcome": outcome}))
    os._exit(0)  # the group cannot be torn down cleanly without its peer


def _spawn(target: Any, tmp: Path) -> None:
    """Run ``target(rank, store, out)`` on 2 spawned ranks; kill them after the timeout."""
    context = mp.start_processes(
        target, args=(str(tmp / "store"), str(tmp)), nprocs=WORLD, join=False,
        start_method="spawn",
    )  # fmt: skip
    deadline = time.monotonic() + SPAWN_TIMEOUT
    try:
        while not context.join(timeout=1.0):
            if time.monotonic() > deadline:
                pytest.fail(f"spawned ranks did not finish within {SPAWN_TIMEOUT:.0f} s")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
                process.join(5)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("ddp")
    _spawn(_worker_main, tmp)
    return [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(WORLD)]


def test_k_backs_off_while_the_ranks_are_equal_and_returns_when_one_falls_behind(
    ranks: list[dict[str, Any]],
) -> None:
    # Assert: windows of 1 then 2 iterations within tolerance: k 2 then 4; the window of 4
    # iterations in which rank 1 takes 3x as long: k back to every = 1, on both ranks; a
    # first window within the noise of its own spread: k kept
    assert ranks[0]["backoff"] == [2, 2, 4, 4, 4, 4, 1]
    assert ranks[1]["backoff"] == ranks[0]["backoff"]
    assert ranks[0]["backoff_noise"] == ranks[1]["backoff_noise"] == [2, "within noise"]


@pytest.mark.parametrize("every", [1, 2])
def test_sizes_follow_the_balancer_from_injected_times(
    ranks: list[dict[str, Any]], every: int
) -> None:
    # Prepare: what the default balancer makes of the same reports
    expected = [list(s) for s in _expected_sizes(every)]

    # Assert: both ranks hold the balancer's sizes after every iteration
    for result in ranks:
        assert result[f"sizes_every_{every}"] == expected
        assert result[f"rebalances_every_{every}"] == len(TIMES) // every
    assert expected[-1][0] > expected[-1][1]  # the rank reporting 3x the time gets less


def test_an_overlapped_exchange_decides_at_the_next_step(ranks: list[dict[str, Any]]) -> None:
    # Prepare: what the synchronous exchange decides from the first window
    expected = [list(s) for s in _expected_sizes(1)]

    # Assert: nothing decided at the first step (the gather is under way), the first
    # window's sizes at the second
    for result in ranks:
        (first, decided_first), (second, decided_second) = result["overlapped"]
        assert (first, decided_first) == ([B_INIT, B_INIT], False)
        assert (second, decided_second) == (expected[0], True)


def test_sizes_stay_when_the_ranks_already_finish_together(
    ranks: list[dict[str, Any]],
) -> None:
    # Prepare: what the default balancer would do with times 1.0 and 1.04 s
    balancer = BatchSizeBalancer(initial_batch_size=64)
    for r, t in enumerate((1.0, 1.04)):
        balancer.report(str(r), SiloReport(batch_size=64, train_time=t))
    moved = balancer.allocate(["0", "1"], total=128, budget=False)

    # Assert: idle 2% is within the 5% tolerance; with 0 the allocation applies
    for result in ranks:
        assert result["near_equal_0.05"] == [64, 64]
        assert result["near_equal_0.0"] == [moved["0"], moved["1"]]


@pytest.mark.parametrize("path", ["loss", "hook", "explicit"])
def test_weighted_gradient_is_the_batch_size_weighted_mean_of_the_ranks(
    ranks: list[dict[str, Any]], path: str
) -> None:
    # Assert: unequal sizes, the global batch kept; the aggregate is sum_r B_r / X g_r
    # (the loss path: n B_r / X on the loss, DDP's plain mean), which is the union batch's
    # gradient, and not the unweighted mean of the ranks' gradients
    for rank, result in enumerate(ranks):
        check = result[path]
        tolerance = 1e-5 * max(1.0, check["scale"])
        assert check["sizes"][0] != check["sizes"][1]
        assert check["union"] == WORLD * B_INIT
        assert check["loss_scale"] == pytest.approx(WORLD * check["sizes"][rank] / check["union"])
        assert check["error_weighted"] <= tolerance
        assert check["max_error"] <= tolerance
        assert check["error_mean"] > 100 * tolerance
        assert check["compute_time_measured"]


def test_ranks_that_disagree_on_the_sizes_take_rank_0s(ranks: list[dict[str, Any]]) -> None:
    # Assert: the checksums differed at the exchange; both ranks hold rank 0's sizes
    (sizes_0, count_0), (sizes_1, count_1) = (r["disagreement"] for r in ranks)
    assert count_0 == count_1 == 1
    assert sizes_0 == sizes_1
    assert sum(sizes_0) == WORLD * B_INIT


def test_resume_from_the_balancer_state_continues_the_same_sizes(
    ranks: list[dict[str, Any]],
) -> None:
    # Assert
    for result in ranks:
        assert result["resumed_iteration"] == 1
        assert result["resumed_sizes"] == result["loss"]["sizes"]
        before, after = result["after_resume"]
        assert before == after


def test_a_dead_rank_is_reported(tmp_path: Path) -> None:
    # Execute: rank 1 exits before the exchange of times
    _spawn(_dying_worker, tmp_path)

    # Assert: rank 0 raised a RankFailureError naming itself and the iteration
    outcome = json.loads((tmp_path / "rank0.json").read_text())["outcome"]
    assert outcome.startswith("RankFailureError: rank 0: the exchange of compute times")
    assert "torchrun --max-restarts" in outcome


def test_resume_changes_world_size_keeps_the_global_batch() -> None:
    # Prepare: a state saved by a 2-rank job
    balancer = BatchSizeBalancer(initial_batch_size=B_INIT)
    balancer.report("0", SiloReport(batch_size=B_INIT, train_time=1.0))
    balancer.report("1", SiloReport(batch_size=B_INIT, train_time=3.0))
    state = {
        "version": 1, "balancer": balancer.state_dict(), "iteration": 7, "sizes": [12, 4],
        "rank_ids": ["0", "1"], "every": 1, "total": 16,
    }  # fmt: skip
    coordinator = LBBSPCoordinator(warm_up=0, initial_batch_size=B_INIT)

    # Execute: restarted as a world of one
    coordinator.load_state_dict(state)

    # Assert: the one rank takes the whole global batch
    assert coordinator.sizes == (16,) and coordinator.iteration == 7


@pytest.mark.parametrize(
    ("change", "message"),
    [({"version": 99}, "version"), ({"total": 0}, "cannot feed")],
)
def test_load_state_dict_rejects_bad_states(change: dict[str, Any], message: str) -> None:
    # Prepare
    coordinator = LBBSPCoordinator(warm_up=0, initial_batch_size=B_INIT)
    state = {**coordinator.state_dict(), **change}

    # Execute / Assert
    with pytest.raises(ValueError, match=message):
        LBBSPCoordinator(warm_up=0, initial_batch_size=B_INIT).load_state_dict(state)


# ------------------------------------------------------------------- restart attempts
TORCHRUN_ENV = ("TORCHELASTIC_USE_AGENT_STORE", "GROUP_WORLD_SIZE", "TORCHELASTIC_MAX_RESTARTS",
                "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "TORCHELASTIC_RUN_ID",
                "TORCHELASTIC_RESTART_COUNT")  # fmt: skip


def test_attempt_store_namespaces_the_keys_of_each_restart(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Prepare: a store standing in for torchrun's agent store, shared by two attempts
    from fl_lbbsp.distributed.runtime import attempt_store

    timeout = datetime.timedelta(seconds=30)
    agent = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timeout)
    env = {"TORCHELASTIC_USE_AGENT_STORE": "True", "GROUP_WORLD_SIZE": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(agent.port), "WORLD_SIZE": "2",
           "TORCHELASTIC_RUN_ID": "job"}  # fmt: skip
    for name, value in env.items():
        monkeypatch.setenv(name, value)

    # Execute: attempt 0 writes a rank's address, attempt 1 looks for it
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    first = attempt_store(timeout)
    assert first is not None
    first.set("rank_1", "dead peer")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    second = attempt_store(timeout)
    assert second is not None

    # Assert: the key lives under the first attempt's prefix; the second does not see it
    assert agent.get("fl_lbbsp/job/attempt_0/rank_1") == b"dead peer"
    assert first.check(["rank_1"]) and not second.check(["rank_1"])


def test_attempt_store_is_none_outside_a_single_torchrun_agent(
    monkeypatch: pytest.MonkeyPatch, fl_log: pytest.LogCaptureFixture
) -> None:
    # Prepare
    from fl_lbbsp.distributed.runtime import attempt_store

    timeout = datetime.timedelta(seconds=1)
    for name in TORCHRUN_ENV:
        monkeypatch.delenv(name, raising=False)

    # Execute / Assert: no agent store (a plain launch): the default rendezvous
    assert attempt_store(timeout) is None
    # several agents: the restart counts may differ between nodes, so no prefix, a warning
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("GROUP_WORLD_SIZE", "2")
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "3")
    assert attempt_store(timeout) is None
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in fl_log.text
