"""LB-BSP on torch.distributed: the ranks share their compute times, the balancer decides
the next batch sizes, and every rank weights its gradient by its share of the global batch.

On equal ranks it costs what plain DDP costs: the weighting is a factor on the loss
(``n B_r / X``, exactly 1 while the sizes are equal), so DDP's own all-reduce and mean give
the weighted gradient; the times travel in one all_gather every k iterations, and every
rank decides the same sizes from the same gathered rows (no broadcast); the sizes stay
while the ranks are equal within their measured noise (:class:`~.gate.HoldGate`).

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
from collections.abc import Iterable, Sequence
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ..core.balancer import BatchSizeBalancer
from ..core.silo.reports import check_positive_int
from .cadence import Cadence
from .clock import ComputeClock
from .decision import Decision
from .exchange import Exchange, Gathering, Overhead, RankFailureError, RankReport, Row, fingerprint
from .gate import HoldGate, Verdict, WindowTally

__all__ = ["LBBSPCoordinator", "Overhead", "RankFailureError", "RankReport"]

log = logging.getLogger("fl_lbbsp")

STATE_VERSION = 1
"""The version of :meth:`LBBSPCoordinator.state_dict`'s layout."""


class LBBSPCoordinator:
    """Per-rank batch sizes for a torch.distributed job, driven by the LB-BSP balancer (the
    loop in the module's docstring): every rank feeds the gathered windows to its own
    :class:`~fl_lbbsp.core.balancer.BatchSizeBalancer` and decides alike
    (:class:`~.decision.Decision`); ``X = world_size * initial_batch_size`` stays fixed.

    Call :meth:`begin` before drawing an iteration's batch and :meth:`step` after the
    optimiser step. A rank's compute time runs from :meth:`begin` to the moment its last
    parameter gradient is accumulated (:meth:`register`), its last gradient bucket is ready
    (the communication hook) or it calls :meth:`all_reduce_gradients`: the wait for slower
    peers is not in it. Without a process group it runs as a world of one.

    Parameters
    ----------
    initial_batch_size : int
        B_init, every rank's batch size before the first decision; X = world * B_init.
    every : int or "auto" (default: 10)
        Exchange the summed times every k iterations (amortises the exchange, smooths the
        noise). ``"auto"``: the smallest k keeping the exchange's cost within
        ``overhead_share`` of the wall time, at most ``max_every`` (1 until it is known).
    overhead_share : float (default: 0.01)
        With ``every="auto"``: the share of wall time balancing may take, in (0, 1).
    max_every : int (default: 100)
        With ``every="auto"``, or backing off: the largest k.
    backoff : int (default: 4)
        While the gate holds the sizes (within tolerance or noise), k doubles from one
        exchange to the next up to ``backoff`` times its base (:class:`~.cadence.Cadence`);
        a lead seen once keeps it, any other verdict brings it back. 1: k stays.
    tolerance : float (default: 0.02)
        Keep the sizes while the predicted gain of a split proportional to the window's
        speeds is at most this share of the slowest rank's time (the reports still reach
        the balancer). 0: apply every allocation.
    noise_sigmas : float | None (default: 2.0)
        Keep them too while that gain is within this many times the ranks' measured
        noise (equal ranks do not chase it). ``None``: only ``tolerance`` holds them.
    review : bool (default: True)
        Once the gate lets a move through, apply the balancer's allocation only if the
        window predicts it faster than the sizes in force
        (:func:`~fl_lbbsp.distributed.gate.review_proposal`). ``False``: apply it as it is.
    overlap : bool (default: True)
        Run the gather behind the next iteration's compute and decide at the next
        :meth:`step` (the new sizes apply one iteration later; that iteration is left out
        of the next window when they change). ``False``: gather and decide at once.
    balance : bool (default: True)
        ``False``: the sizes stay at B_init, nothing is exchanged (plain DDP's split).
    cpu_time : bool (default: False)
        Also measure the CPU seconds of each rank's compute, to emulate slower machines
        (:meth:`compute_cpu_time`; off: the clock can stall, see
        :mod:`~.clock`).
    warm_up : int (default: 1)
        Iterations left out of the first window after the start or a resume (DDP builds
        its buckets, the allocator and the caches fill: set-up, not the rank's speed: 2-5
        times the next ones, measured at 2 gloo ranks, it inflated the first window's spread).
    balancer : BatchSizeBalancer | None (default: None)
        The balancer to drive; ``None``: one with its default settings.
    group : ProcessGroup | None (default: None)
        Process group of the ranks; ``None``: the default group.
    device : torch.device | None (default: None)
        Device of the tensors exchanged; ``None``: the CUDA device under NCCL, else CPU.
    rank_ids : sequence of str | None (default: None)
        The balancer's id of each rank (a host name, say); ``None``: ``"0"``, ``"1"``, ...

    Raises
    ------
    ValueError
        On an argument out of its range (the message names it).
    """

    def __init__(
        self,
        *,
        initial_batch_size: int,
        every: int | Literal["auto"] = 10,
        overhead_share: float = 0.01,
        max_every: int = 100,
        backoff: int = 4,
        tolerance: float = 0.02,
        noise_sigmas: float | None = 2.0,
        review: bool = True,
        overlap: bool = True,
        balance: bool = True,
        cpu_time: bool = False,
        warm_up: int = 1,
        balancer: BatchSizeBalancer | None = None,
        group: dist.ProcessGroup | None = None,
        device: torch.device | None = None,
        rank_ids: Sequence[str] | None = None,
    ) -> None:
        check_positive_int("initial_batch_size", initial_batch_size)
        if every != "auto":
            check_positive_int("every", every)
        check_positive_int("max_every", max_every)
        check_positive_int("backoff", backoff)
        if isinstance(warm_up, bool) or not isinstance(warm_up, int) or warm_up < 0:
            raise ValueError(f"warm_up must be an integer >= 0, got {warm_up!r}")
        if not (isinstance(overhead_share, float | int) and 0 < overhead_share < 1):
            raise ValueError(f"overhead_share must be in (0, 1), got {overhead_share!r}")
        if not (isinstance(tolerance, float | int) and 0 <= tolerance < 1):
            raise ValueError(f"tolerance must be in [0, 1), got {tolerance!r}")
        if noise_sigmas is not None and not (
            isinstance(noise_sigmas, float | int) and 0 <= noise_sigmas < math.inf
        ):
            raise ValueError(f"noise_sigmas must be a finite number >= 0, got {noise_sigmas!r}")
        self.tolerance = float(tolerance)
        self.noise_sigmas = None if noise_sigmas is None else float(noise_sigmas)
        self._exchange = Exchange(group=group, device=device)
        self.group = group
        self.device = self._exchange.device
        self._rank, self._world = self._exchange.rank, self._exchange.world
        ids = [str(r) for r in range(self._world)] if rank_ids is None else list(rank_ids)
        if len(ids) != self._world or len(set(ids)) != self._world:
            raise ValueError(f"rank_ids must name the {self._world} ranks once each, got {ids!r}")
        self.rank_ids = tuple(ids)
        self.balance = bool(balance)
        self.initial_batch_size = initial_batch_size
        self.decision = Decision(
            balancer=balancer or BatchSizeBalancer(initial_batch_size=initial_batch_size),
            rank_ids=ids, total=self._world * initial_batch_size,
            gate=HoldGate(tolerance=self.tolerance, sigmas=self.noise_sigmas),
            cadence=Cadence(every=every, overhead_share=float(overhead_share),
                            max_every=max_every, backoff=backoff),
            review=bool(review),
        )  # fmt: skip
        self.gate, self.cadence = self.decision.gate, self.decision.cadence
        self._sizes = self.decision.allocate()
        self.iteration = 0
        self.disagreements = 0
        self._window = WindowTally()
        self.warm_up = warm_up
        self._warm_up = warm_up  # iterations still to leave out of the window
        self._overhead = self._cost = self._last_exchange = self._started = 0.0
        self._last_step: float | None = None
        self._rebalances = 0
        self._clock = ComputeClock(cpu=cpu_time)
        self._comm_hook = False
        self.overlap = bool(overlap)
        self._gathering: Gathering | None = None

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
    def loss_scale(self) -> float:
        """n B_rank / X: the factor on this rank's mean loss that turns DDP's mean of the
        ranks' gradients into their batch-size-weighted mean (exactly 1 on equal sizes)."""
        return self._world * self.batch_size / sum(self._sizes)

    # ----------------------------------------------------------------- timing
    def begin(self, *, samples: int | None = None) -> None:
        """Mark the start of an iteration's compute (before its batch is drawn).

        Parameters
        ----------
        samples : int | None (default: None)
            Samples of the batch about to be computed, if already known.

        Raises
        ------
        ValueError
            When ``samples`` is not this rank's batch size (a loader that drew ahead of
            the plan).
        """
        if samples is not None and samples != self.batch_size:
            raise ValueError(
                f"rank {self._rank}: a batch of {samples} samples, but the plan gives "
                f"{self.batch_size} (did the loader draw ahead? use num_workers=0)"
            )
        self._clock.begin()

    def mark_computed(self) -> None:
        """Mark the end of this rank's local compute (the hooks call it per gradient or
        bucket; the last call counts)."""
        self._clock.mark()

    def compute_time(self) -> float | None:
        """Seconds from :meth:`begin` to the end of local compute, ``None`` if unknown."""
        return self._clock.wall()

    def compute_cpu_time(self) -> float | None:
        """CPU seconds this process used from :meth:`begin` to the end of local compute
        (``None`` if unknown, and unless the coordinator was made with ``cpu_time=True``):
        without the waits for a core, the rank's own work where ranks share a host's
        cores, to scale when emulating a slower machine
        (:func:`~fl_lbbsp.clients.emulation.emulated_time`); not for real heterogeneity."""
        return self._clock.cpu()

    @property
    def began_at(self) -> float | None:
        """``time.perf_counter()`` at the last :meth:`begin` (``None`` before it, or after
        :meth:`step`)."""
        return self._clock.began_at

    # ----------------------------------------------------------- aggregation
    def register(
        self, model: DistributedDataParallel, *, comm_hook: bool = False
    ) -> DistributedDataParallel:
        """Measure this rank's compute on a DDP model and return the model.

        Default: a hook on every parameter marks the end of local compute (its last
        gradient accumulated, before DDP waits for its peers); DDP keeps its own
        all-reduce, and :meth:`scale_loss` weights the gradient. ``comm_hook=True``:
        :func:`~fl_lbbsp.distributed.hooks.weighted_allreduce_hook` instead, a Python
        communication hook that scales each bucket by B_rank / X before an all-reduce
        sum and marks the end of compute (for a loss that cannot be scaled; slower than
        DDP's built-in all-reduce); :meth:`scale_loss` then leaves the loss as it is.
        The model registered last is the one timed.
        """
        self._clock.detach()
        if comm_hook:
            from .hooks import weighted_allreduce_hook

            model.register_comm_hook(self, weighted_allreduce_hook)
        else:
            self._clock.attach(model)
        self._comm_hook = comm_hook
        return model

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss`` times :attr:`loss_scale` (n B_rank / X), to call before ``backward``:
        DDP's all-reduce then averages ``n B_r / X g_r`` into ``sum_r B_r / X g_r``, the
        global batch's gradient (Sec. 3.4). The loss itself while the sizes are equal, or
        when a communication hook weights the gradient."""
        scale = self.loss_scale
        return loss if scale == 1.0 or self._comm_hook else loss * scale

    def all_reduce_gradients(self, parameters: Iterable[torch.Tensor]) -> None:
        """Weighted all-reduce of the gradients of ``parameters`` in place, for a model
        not wrapped in DDP (and a loss not scaled): grad <- sum_r (B_r / X) grad_r
        (Sec. 3.4). Marks the end of local compute first."""
        from .hooks import weighted_all_reduce_

        self.mark_computed()
        weighted_all_reduce_(parameters, weight=self.weight, group=self.group)

    # ------------------------------------------------------------- balancing
    @property
    def overhead(self) -> Overhead:
        """Time spent balancing so far."""
        return Overhead(
            self._overhead, self._cost + self._last_exchange, self._rebalances, self.iteration
        )

    @property
    def balancer(self) -> BatchSizeBalancer:
        """The balancer every rank drives alike."""
        return self.decision.balancer

    @property
    def total(self) -> int:
        """X, the global batch."""
        return self.decision.total

    @property
    def last_reports(self) -> dict[int, RankReport]:
        """Every rank's window at the last exchange, by rank."""
        return self.decision.last_reports

    @property
    def last_verdict(self) -> Verdict | None:
        """The gate's verdict on the last exchange's windows."""
        return self.decision.last_verdict

    @property
    def current_every(self) -> int:
        """k: iterations between the exchanges from now on."""
        return self.cadence.k

    @property
    def every(self) -> int | Literal["auto"]:
        """The base k (``every`` as given)."""
        return self.cadence.every

    # ------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state: the balancer's, the sizes and the iteration."""
        return {
            "version": STATE_VERSION,
            "balancer": self.decision.balancer.state_dict(),
            "iteration": self.iteration,
            "sizes": list(self._sizes),
            "rank_ids": list(self.rank_ids),
            "every": self.cadence.base,  # k before the backoff, which a resume starts anew
            "total": self.decision.total,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict` (after an elastic restart, say).

        With the same ranks the sizes continue where they were; with another world
        (torchrun restarted fewer or more ranks) the balancer splits the same global
        batch X over the ranks of the new world, those it knows at their predicted speeds.

        Raises
        ------
        ValueError
            On a state of another version, or sizes that cannot feed the ranks.
        """
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"unsupported coordinator state version {state.get('version')!r}")
        self.decision.balancer = BatchSizeBalancer.from_state_dict(state["balancer"])
        self.iteration = int(state["iteration"])
        self.decision.total = int(state["total"])
        if self.decision.total < self._world:
            raise ValueError(
                f"a global batch of {self.decision.total} cannot feed {self._world} ranks"
            )
        self._window = WindowTally()
        self._warm_up = self.warm_up
        self.gate.reset()
        self._gathering = None
        self.cadence.restart(int(state.get("every", 1)))
        saved = tuple(int(x) for x in state["sizes"])
        if tuple(state["rank_ids"]) == self.rank_ids and sum(saved) == self.decision.total:
            self._sizes = saved
        else:
            self._sizes = self.decision.allocate()
        if any(not math.isfinite(x) or x <= 0 for x in self._sizes):
            raise ValueError(f"invalid batch sizes in the state: {self._sizes}")

    # ---------------------------------------------------------------- the loop
    def step(self, compute_time: float | None = None, *, samples: int | None = None) -> bool:
        """End an iteration: record this rank's time and, every k iterations, exchange the
        times and decide the next sizes (a collective: every rank must call it); the sizes
        stay while the gate holds them (``tolerance``, ``noise_sigmas``).

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
        RuntimeError
            Without a time: no ``compute_time`` given and none measured.
        RankFailureError
            When the exchange fails (a peer rank died).
        """
        seconds = self.compute_time() if compute_time is None else float(compute_time)
        if seconds is None:
            raise RuntimeError(
                "no compute time: call begin() before the iteration and register() the model "
                "(or let all_reduce_gradients() mark its end), or pass compute_time"
            )
        now = time.perf_counter()
        wall = 0.0 if self._last_step is None else now - self._last_step
        self._last_step = now
        if self._warm_up:  # left out of the first window: set-up, not the rank's speed
            self._warm_up -= 1
        else:
            self._window.add(seconds, self.batch_size if samples is None else int(samples), wall)
        self.iteration += 1
        self._clock.stop()
        if not self.balance:
            return False
        decided = self._gathering is not None
        if decided:
            self._decide()
        if self._window.iterations >= self.cadence.k:
            self._start_exchange()
            if not self.overlap:
                self._decide()
                decided = True
        return decided

    def close(self) -> None:
        """Wait for the exchange of times still in flight, if any, without deciding from
        it: every rank calls it once training is over, before ``destroy_process_group``
        (a collective left running when the group is torn down can abort the process).

        Raises
        ------
        RankFailureError
            When the exchange fails (a peer rank died).
        """
        gathering, self._gathering = self._gathering, None
        if gathering is not None:
            gathering.rows()

    def _start_exchange(self) -> None:
        """Send this rank's window (the gather runs in the background) and open the next."""
        started = time.perf_counter()
        window, self._window = self._window, WindowTally()
        row = [window.time, float(window.samples), float(self.batch_size),
               float(window.iterations), self._last_exchange, window.wall,
               window.square, fingerprint(self._sizes, self.cadence.k)]  # fmt: skip
        self._gathering = self._exchange.start(row, iteration=self.iteration)
        self._started = time.perf_counter() - started
        self._last_step = time.perf_counter()

    def _decide(self) -> None:
        """Wait for the gathered windows, feed them to the balancer and the gate, and take
        the next sizes and k (the same on every rank, from the same rows)."""
        started = time.perf_counter()
        assert self._gathering is not None
        rows, self._gathering = self._gathering.rows(), None
        if any(row[Row.PRINT] != rows[0][Row.PRINT] for row in rows):
            self._adopt_rank0()
        if self._rebalances:
            self._cost += min(row[Row.EXCHANGE] for row in rows)
        before = self._sizes
        self._sizes = self.decision.decide(rows, before)
        for r, rank_id in enumerate(self.rank_ids):
            if self._rank == 0 and rank_id in self.decision.errors:
                log.warning("rank %d: report left out at iteration %d: %s", r,
                            self.iteration, self.decision.errors[rank_id])  # fmt: skip
        if self._sizes != before:
            self._window = WindowTally()  # the iteration run while the gather was under way
        self._rebalances += 1
        self._last_exchange = self._started + time.perf_counter() - started
        self._overhead += self._last_exchange
        self._last_step = time.perf_counter()

    def _adopt_rank0(self) -> None:
        """The ranks' checksums of the sizes in force differ (their decisions parted, say
        by floating point on unlike hosts): every rank takes rank 0's balancer, sizes
        and k."""
        state = self._exchange.adopt(
            {
                "balancer": self.balancer.state_dict(),
                "sizes": list(self._sizes),
                "cadence": self.cadence.state(),
            },  # fmt: skip
            iteration=self.iteration,
        )
        self.decision.balancer = BatchSizeBalancer.from_state_dict(state["balancer"])
        self._sizes = tuple(int(x) for x in state["sizes"])
        self.cadence.adopt(state["cadence"])
        self.gate.reset()
        self.disagreements += 1
        if self._rank == 0:
            log.warning("the ranks' batch sizes disagreed at iteration %d; rank 0's taken",
                        self.iteration)  # fmt: skip
