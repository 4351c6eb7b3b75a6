"""LB-BSP on torch.distributed: the ranks share their compute times, the balancer decides
the next batch sizes, and every rank weights its gradient by its share of the global batch.

Reference: Chen et al., "Accelerating Distributed Learning in Non-Dedicated
Environments", IEEE TCC 2021: Sec. 3.1 (batch size proportional to predicted speed, so
all workers finish together), Sec. 3.4 (weighted gradient aggregation, g = sum_i B_i g_i /
X, equal to the gradient of the global batch), Sec. 4 (the BatchSizeManager's loop:
gather the workers' times, predict, reallocate).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ..core.balancer import BatchSizeBalancer, SiloReport

__all__ = ["LBBSPCoordinator", "Overhead", "RankFailureError", "RankReport"]

log = logging.getLogger("fl_lbbsp")

STATE_VERSION = 1

T = TypeVar("T")


class RankFailureError(RuntimeError):
    """A collective of the balancer failed: a peer rank died or cannot be reached.

    The message names this rank, the iteration and the backend's error. Let it end the
    process: ``torchrun --max-restarts N`` then restarts the group, and the job resumes
    from its last checkpoint (:meth:`LBBSPCoordinator.load_state_dict`).
    """


@dataclass(frozen=True)
class RankReport:
    """One rank's figures over the last balancing window, as every rank received them.

    Parameters
    ----------
    batch_size : int
        Its batch size in the window.
    compute_time : float
        Seconds of compute summed over the window's iterations (as reported: emulated
        slowdowns included).
    samples : int
        Samples processed in the window.
    iterations : int
        Iterations in the window.
    """

    batch_size: int
    compute_time: float
    samples: int
    iterations: int


@dataclass(frozen=True)
class Overhead:
    """What balancing costs: the exchange of times and the decision.

    Parameters
    ----------
    seconds : float
        Wall time this rank spent in :meth:`LBBSPCoordinator.step` exchanging times
        (all_gather), deciding and sharing the sizes (broadcast), summed; it includes
        waiting for ranks that reached the exchange later.
    cost : float
        The exchanges' own cost, summed: for each, the shortest time any rank spent in it
        (the last rank to arrive waits for nobody), learnt at the next exchange; this
        rank's own time for the latest one.
    rebalances : int
        How many times it ran.
    iterations : int
        Iterations stepped.
    """

    seconds: float
    cost: float
    rebalances: int
    iterations: int

    @property
    def per_rebalance(self) -> float:
        """Mean cost of one exchange in seconds (0 before the first)."""
        return self.cost / self.rebalances if self.rebalances else 0.0

    @property
    def per_iteration(self) -> float:
        """Cost per iteration, amortised over every iteration (0 before the first)."""
        return self.cost / self.iterations if self.iterations else 0.0


def _check_positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


class LBBSPCoordinator:
    """Per-rank batch sizes for a torch.distributed job, driven by the LB-BSP balancer.

    Every k iterations the ranks all_gather their compute times of the window;
    each rank feeds every rank's report (the window's mean iteration) into its own
    :class:`~fl_lbbsp.core.balancer.BatchSizeBalancer`, rank 0's allocation is broadcast
    so that all ranks agree on it, and :attr:`sizes` changes for the next batch. The global
    batch ``X = world_size * initial_batch_size`` stays fixed. Gradients are weighted by
    :attr:`weight` = B_rank / X, through the DDP communication hook (:meth:`register`) or
    the explicit :meth:`all_reduce_gradients`, so the aggregate is the global batch's
    gradient.

    Parameters
    ----------
    initial_batch_size : int
        B_init, every rank's batch size before the first decision; X = world * B_init.
    every : int or "auto" (default: "auto")
        Rebalance every this many iterations (k); the times of the k iterations are
        summed, so k > 1 amortises the exchange and smooths the noise. ``"auto"``: after
        each exchange rank 0 picks the next k (shared with the sizes) as the smallest that
        keeps the exchange's cost within ``overhead_share`` of the iterations' wall time,
        at most ``max_every``; k = 1 until the first cost is known.
    overhead_share : float (default: 0.02)
        With ``every="auto"``: the share of wall time balancing may take, in (0, 1).
    max_every : int (default: 100)
        With ``every="auto"``: the largest k.
    tolerance : float (default: 0.05)
        Keep the current sizes when the window's idle fraction
        ``1 - mean_r t_r / max_r t_r`` (t_r: rank r's compute time per iteration) is at
        most this: the ranks already finish together, and moving samples on noise alone
        only makes the slowest rank slower. The reports still reach the balancer. 0:
        apply every allocation. The paper's target is within 5% of the ideal.
    noise_sigmas : float | None (default: 2.0)
        Keep the current sizes too when the slowest rank is not slower than the others'
        mean by more than this many standard errors of that difference (from each rank's
        spread of per-iteration times within the window): its lead is within the noise
        (ranks sharing cores, co-tenants coming and going), and moving samples after it
        chases the noise. Needs windows of at least 2 iterations; off with ``tolerance``
        0. ``None``: only ``tolerance`` holds the sizes.
    balance : bool (default: True)
        ``False``: the sizes stay at B_init and nothing is exchanged (plain DDP's equal
        split, with the same sampler).
    balancer : BatchSizeBalancer | None (default: None)
        The balancer to drive; ``None``: ``BatchSizeBalancer(initial_batch_size=...)``
        with its default settings.
    group : ProcessGroup | None (default: None)
        Process group of the ranks; ``None``: the default group.
    device : torch.device | None (default: None)
        Device of the tensors exchanged; ``None``: the current CUDA device under NCCL,
        else the CPU.
    rank_ids : sequence of str | None (default: None)
        The balancer's id of each rank (a host name, say); ``None``: ``"0"``, ``"1"``, ...

    Notes
    -----
    Call :meth:`begin` before drawing an iteration's batch and :meth:`step` after the
    optimiser step. The compute time of a rank is measured from :meth:`begin` to the
    moment its last gradient bucket is ready (the hook) or it calls
    :meth:`all_reduce_gradients`: the wait for slower peers is not in it. Without a
    process group (a single process) it runs as a world of one.
    """

    def __init__(
        self,
        *,
        initial_batch_size: int,
        every: int | Literal["auto"] = "auto",
        overhead_share: float = 0.02,
        max_every: int = 100,
        tolerance: float = 0.05,
        noise_sigmas: float | None = 2.0,
        balance: bool = True,
        balancer: BatchSizeBalancer | None = None,
        group: dist.ProcessGroup | None = None,
        device: torch.device | None = None,
        rank_ids: Sequence[str] | None = None,
    ) -> None:
        _check_positive_int("initial_batch_size", initial_batch_size)
        if every != "auto":
            _check_positive_int("every", every)
        _check_positive_int("max_every", max_every)
        if not (isinstance(overhead_share, float | int) and 0 < overhead_share < 1):
            raise ValueError(f"overhead_share must be in (0, 1), got {overhead_share!r}")
        if not (isinstance(tolerance, float | int) and 0 <= tolerance < 1):
            raise ValueError(f"tolerance must be in [0, 1), got {tolerance!r}")
        self.tolerance = float(tolerance)
        if noise_sigmas is not None and not (
            isinstance(noise_sigmas, float | int) and 0 <= noise_sigmas < math.inf
        ):
            raise ValueError(f"noise_sigmas must be a finite number >= 0, got {noise_sigmas!r}")
        self.noise_sigmas = None if noise_sigmas is None else float(noise_sigmas)
        self.group = group
        initialised = dist.is_available() and dist.is_initialized()
        self._rank = dist.get_rank(group) if initialised else 0
        self._world = dist.get_world_size(group) if initialised else 1
        self._distributed = initialised
        if device is None:
            nccl = initialised and dist.get_backend(group) == "nccl"
            device = (
                torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
            )
        self.device = device
        ids = [str(r) for r in range(self._world)] if rank_ids is None else list(rank_ids)
        if len(ids) != self._world or len(set(ids)) != self._world:
            raise ValueError(f"rank_ids must name the {self._world} ranks once each, got {ids!r}")
        self.rank_ids = tuple(ids)
        self.every = every
        self.overhead_share = float(overhead_share)
        self.max_every = max_every
        self._k = 1 if every == "auto" else every
        self.balance = bool(balance)
        self.balancer = (
            BatchSizeBalancer(initial_batch_size=initial_batch_size)
            if balancer is None
            else balancer
        )
        self.initial_batch_size = initial_batch_size
        self.total = self._world * initial_batch_size
        self._sizes = self._allocate()
        self.iteration = 0
        self.last_reports: dict[int, RankReport] = {}
        self._reset_window()
        self._overhead = 0.0
        self._cost = 0.0
        self._last_exchange = 0.0
        self._last_step: float | None = None
        self._rebalances = 0
        self._began: float | None = None
        self._computed: float | None = None
        self._began_cpu: float | None = None
        self._computed_cpu: float | None = None
        self._expected: int | None = None

    # ---------------------------------------------------------------- the plan
    @property
    def rank(self) -> int:
        """This process's rank in the group."""
        return self._rank

    @property
    def world_size(self) -> int:
        """Number of ranks."""
        return self._world

    @property
    def sizes(self) -> tuple[int, ...]:
        """Every rank's batch size of the current iteration, in rank order."""
        return self._sizes

    @property
    def batch_size(self) -> int:
        """This rank's batch size B_rank of the current iteration."""
        return self._sizes[self._rank]

    @property
    def offset(self) -> int:
        """Where this rank's slice starts in the iteration's global batch."""
        return sum(self._sizes[: self._rank])

    @property
    def weight(self) -> float:
        """B_rank / X: this rank's weight in the gradient aggregate (the weights sum to 1)."""
        return self.batch_size / sum(self._sizes)

    @property
    def overhead(self) -> Overhead:
        """Time spent balancing so far."""
        return Overhead(
            self._overhead, self._cost + self._last_exchange, self._rebalances, self.iteration
        )

    @property
    def current_every(self) -> int:
        """k: iterations between the exchanges from now on."""
        return self._k

    # ----------------------------------------------------------------- timing
    def begin(self, *, samples: int | None = None) -> None:
        """Mark the start of an iteration's compute (before its batch is drawn).

        Parameters
        ----------
        samples : int | None (default: None)
            Samples of the batch about to be computed, if already known; ValueError when
            it is not this rank's batch size (a loader that drew ahead of the plan).
        """
        if samples is not None and samples != self.batch_size:
            raise ValueError(
                f"rank {self._rank}: a batch of {samples} samples, but the plan gives "
                f"{self.batch_size} (did the loader draw ahead? use num_workers=0)"
            )
        self._computed = None
        self._computed_cpu = None
        self._began_cpu = time.process_time()
        self._began = time.perf_counter()

    def mark_computed(self) -> None:
        """Mark the end of this rank's local compute (the hook calls it per bucket; the
        last call, the last bucket, counts)."""
        self._computed = time.perf_counter()
        self._computed_cpu = time.process_time()

    def compute_time(self) -> float | None:
        """Seconds from :meth:`begin` to the end of local compute, ``None`` if unknown."""
        if self._began is None or self._computed is None:
            return None
        return self._computed - self._began

    def compute_cpu_time(self) -> float | None:
        """CPU seconds this process used from :meth:`begin` to the end of local compute,
        ``None`` if unknown.

        Unlike :meth:`compute_time` it leaves out the time the rank waited for a core, so
        it is the rank's own work when several ranks share the cores of one host: the
        time to scale when emulating a slower machine of its own
        (:func:`~fl_lbbsp.clients.emulation.emulated_time` with ``started``), where the
        wall time would multiply the ranks' contention by the slowdown. Not for real
        heterogeneity: a co-tenant on a rank's core slows its wall time, not its CPU time.
        """
        if self._began_cpu is None or self._computed_cpu is None:
            return None
        return self._computed_cpu - self._began_cpu

    @property
    def began_at(self) -> float | None:
        """``time.perf_counter()`` at the last :meth:`begin` (``None`` before it, or after
        :meth:`step`)."""
        return self._began

    # ---------------------------------------------------------------- the loop
    def step(self, compute_time: float | None = None, *, samples: int | None = None) -> bool:
        """End an iteration: record this rank's time and, every k iterations, rebalance
        (a collective: every rank must call it); the sizes stay when the ranks already
        finish together (``tolerance``).

        Parameters
        ----------
        compute_time : float | None (default: None)
            Seconds of compute of the iteration to report (e.g. with an emulated
            slowdown, ``emulate_slowdown(t, k)``); ``None``: the measured
            :meth:`compute_time`.
        samples : int | None (default: None)
            Samples processed; ``None``: this rank's batch size.

        Returns
        -------
        bool
            Whether the ranks exchanged their times and decided (the next batch may have
            another size).

        Raises
        ------
        RankFailureError
            When the exchange fails (a peer rank died).
        """
        seconds = self.compute_time() if compute_time is None else float(compute_time)
        if seconds is None:
            raise RuntimeError(
                "no compute time: call begin() before the iteration and let the hook or "
                "all_reduce_gradients() mark its end, or pass compute_time"
            )
        now = time.perf_counter()
        if self._last_step is not None:
            self._window_wall += now - self._last_step
        self._last_step = now
        self._window_time += seconds
        self._window_square += seconds * seconds
        self._window_samples += self.batch_size if samples is None else int(samples)
        self._window_iterations += 1
        self.iteration += 1
        self._began = None
        if not self.balance or self._window_iterations < self._k:
            return False
        started = time.perf_counter()
        mine = [self._window_time, float(self._window_samples), float(self.batch_size),
                float(self._window_iterations), self._last_exchange, self._window_wall,
                self._window_square]  # fmt: skip
        rows = self._gather(mine)
        self._reset_window()
        if self._rebalances:
            self._cost += min(row[4] for row in rows)
        self.last_reports = {
            r: RankReport(int(row[2]), float(row[0]), int(row[1]), int(row[3]))
            for r, row in enumerate(rows)
        }
        # One iteration is the balancer's round: the window's mean per iteration, so that
        # its cost fit (batch size -> time of a round) does not mix windows of different
        # lengths (every="auto" changes k). The ranks' reports are fed together, so that
        # a slowdown they all share (a busy node) is taken out of them.
        counts = {r: max(report.iterations, 1) for r, report in self.last_reports.items()}
        errors = self.balancer.report_round(
            {
                self.rank_ids[r]: SiloReport(
                    batch_size=report.batch_size,
                    train_time=report.compute_time / counts[r],
                    samples=max(1, round(report.samples / counts[r])),
                )
                for r, report in self.last_reports.items()
            }
        )
        if self._rank == 0:
            for r, rank_id in enumerate(self.rank_ids):
                if rank_id in errors:
                    log.warning("rank %d: report left out at iteration %d: %s", r,
                                self.iteration, errors[rank_id])  # fmt: skip
        sizes = self._sizes if self._balanced(rows) else self._allocate()
        decided = self._share([*sizes, self._next_every(rows)])
        self._sizes, self._k = tuple(decided[:-1]), decided[-1]
        self._rebalances += 1
        self._last_exchange = time.perf_counter() - started
        self._overhead += self._last_exchange
        self._last_step = time.perf_counter()
        return True

    def _balanced(self, rows: list[list[float]]) -> bool:
        """Whether the ranks already finish together (Sec. 3.1): the window's idle
        fraction is within the tolerance, or the slowest rank's lead is within the noise
        (``noise_sigmas``). Never with ``tolerance`` 0."""
        if self.tolerance <= 0:
            return False
        times = [row[0] / row[3] for row in rows if row[3] > 0 and math.isfinite(row[0])]
        if len(times) != len(rows) or max(times) <= 0:
            return False
        if 1.0 - sum(times) / len(times) / max(times) <= self.tolerance:
            return True
        if self.noise_sigmas is None or len(rows) < 2:
            return False
        variances = []  # of each rank's mean time per iteration over the window
        for row, mean in zip(rows, times, strict=True):
            count = row[3]
            if count < 2 or not math.isfinite(row[6]):
                return False
            spread = max(row[6] - count * mean * mean, 0.0) / (count - 1)
            variances.append(spread / count)
        slowest = max(range(len(times)), key=times.__getitem__)
        others = [r for r in range(len(times)) if r != slowest]
        lead = times[slowest] - sum(times[r] for r in others) / len(others)
        error = math.sqrt(variances[slowest] + sum(variances[r] for r in others) / len(others) ** 2)
        return lead <= self.noise_sigmas * error

    def _next_every(self, rows: list[list[float]]) -> int:
        """k for the next window: fixed, or (``"auto"``) the smallest that keeps the
        exchange's cost (the shortest time any rank spent in the last one) within the
        overhead share of rank 0's wall time per iteration."""
        if self.every != "auto":
            return self.every
        cost = min(row[4] for row in rows)
        head = rows[0]
        if cost <= 0 or head[5] <= 0:
            return self._k
        per_iteration = (
            head[5] / max(head[3] - 1, 1) if self._rebalances == 0 else head[5] / head[3]
        )
        wanted = math.ceil(cost / (self.overhead_share * per_iteration))
        return max(1, min(self.max_every, wanted))

    def _reset_window(self) -> None:
        self._window_time = 0.0
        self._window_square = 0.0
        self._window_samples = 0
        self._window_iterations = 0
        self._window_wall = 0.0

    def _allocate(self) -> tuple[int, ...]:
        sizes = self.balancer.allocate(self.rank_ids, total=self.total)
        return tuple(int(sizes[i]) for i in self.rank_ids)

    def _collective(self, what: str, call: Callable[[], T]) -> T:
        try:
            return call()
        except RuntimeError as err:
            message = (
                f"rank {self._rank}: the {what} of iteration {self.iteration} failed, a peer "
                f"rank is gone or unreachable ({' '.join(str(err).split())[:300]}); exiting "
                "so that torchrun --max-restarts restarts the group from the last checkpoint"
            )
            log.error(message)
            raise RankFailureError(message) from err

    def _gather(self, row: list[float]) -> list[list[float]]:
        if not self._distributed:
            return [row]
        mine = torch.tensor(row, dtype=torch.float64, device=self.device)
        parts = [torch.empty_like(mine) for _ in range(self._world)]
        self._collective(
            "exchange of compute times", lambda: dist.all_gather(parts, mine, group=self.group)
        )
        return [p.cpu().tolist() for p in parts]

    def _share(self, values: list[int]) -> list[int]:
        if not self._distributed:
            return values
        tensor = torch.tensor(values, dtype=torch.int64, device=self.device)
        source = dist.get_global_rank(self.group, 0) if self.group is not None else 0
        self._collective(
            "broadcast of batch sizes",
            lambda: dist.broadcast(tensor, src=source, group=self.group),
        )
        return [int(x) for x in tensor.cpu().tolist()]

    # ----------------------------------------------------------- aggregation
    def register(self, model: DistributedDataParallel) -> DistributedDataParallel:
        """Install the weighted all-reduce hook on a DDP model and return the model.

        DDP's default hook averages the ranks' gradients equally; this one scales rank
        r's gradient by B_r / X before an all-reduce sum (Sec. 3.4), and marks the end
        of local compute.
        """
        from .hooks import weighted_allreduce_hook

        model.register_comm_hook(self, weighted_allreduce_hook)
        return model

    def all_reduce_gradients(self, parameters: Iterable[torch.Tensor]) -> None:
        """Weighted all-reduce of the gradients of ``parameters`` in place, for a model
        not wrapped in DDP: grad <- sum_r (B_r / X) grad_r (Sec. 3.4). Marks the end of
        local compute first."""
        from .hooks import weighted_all_reduce_

        self.mark_computed()
        weighted_all_reduce_(parameters, weight=self.weight, group=self.group)

    # ------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state: the balancer's, the sizes and the iteration."""
        return {
            "version": STATE_VERSION,
            "balancer": self.balancer.state_dict(),
            "iteration": self.iteration,
            "sizes": list(self._sizes),
            "rank_ids": list(self.rank_ids),
            "every": self._k,
            "total": self.total,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict` (after an elastic restart, say).

        With the same ranks the sizes continue where they were; with another world
        (torchrun restarted fewer or more ranks) the balancer splits the same global
        batch X over the ranks of the new world, those it knows at their predicted speeds.
        """
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"unsupported coordinator state version {state.get('version')!r}")
        self.balancer = BatchSizeBalancer.from_state_dict(state["balancer"])
        self.iteration = int(state["iteration"])
        self.total = int(state["total"])
        if self.total < self._world:
            raise ValueError(f"a global batch of {self.total} cannot feed {self._world} ranks")
        self._reset_window()
        self._k = self._k if self.every != "auto" else int(state.get("every", 1))
        saved = tuple(int(x) for x in state["sizes"])
        if tuple(state["rank_ids"]) == self.rank_ids and sum(saved) == self.total:
            self._sizes = saved
        else:
            self._sizes = self._allocate()
        if any(not math.isfinite(x) or x <= 0 for x in self._sizes):
            raise ValueError(f"invalid batch sizes in the state: {self._sizes}")
