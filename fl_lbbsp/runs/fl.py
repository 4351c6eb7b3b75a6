"""Run LB-BSP or FedAvg on Flower's Simulation Engine (or in process) with emulated
heterogeneous silos."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, ClassVar, Literal, get_args

from flwr.app import ArrayRecord
from pydantic import Field, computed_field, model_validator

from ..clients.app import make_client_app
from ..clients.emulation import SlowdownSchedule
from ..clients.silo_setup import SiloSetup, initial_model, silo_data
from ..datasets import DataSourceError, PartitionText
from ..security.silo_keys import check_silo_keys
from ..strategies import LBBSPEta, LBBSPFedAvg, LBBSPTau, PartialAggregation
from ..telemetry import start_telemetry
from .config import RunSettings, check_schedule_order
from .engine import ResolvedRun, Runtime, check_key_files, execute, plan_run
from .resume import resume_run

__all__ = [
    "SCHEMES",
    "SimulationConfig",
    "make_strategy",
    "resolve",
    "run",
]

log = logging.getLogger("fl_lbbsp")

Scheme = Literal["fedavg", "lbbsp", "lbbsp-tau", "lbbsp-eta", "partial"]
SCHEMES: tuple[str, ...] = get_args(Scheme)
"""Schemes a simulation can run: FedAvg, LB-BSP and the baselines of
:mod:`fl_lbbsp.strategies.baselines`."""


class SimulationConfig(RunSettings):
    """One simulated federation: what is particular to FL runs; the settings shared with
    cluster runs (``speeds``, ``dataset``, B_init, eta, ``balancing``, ...) are those of
    :class:`~fl_lbbsp.runs.config.RunSettings` (FL allocators: ``linear`` or
    ``proportional``; ``iterative`` is cluster mode's).

    Parameters
    ----------
    scheme : {"fedavg", "lbbsp", "lbbsp-tau", "lbbsp-eta", "partial"} (default: "lbbsp")
        FedAvg (every silo at B_init), LB-BSP, or a baseline of
        :mod:`fl_lbbsp.strategies.baselines`: LB-BSP tuning tau instead of B, scaling eta
        with B, or partial aggregation of the fastest silos.
    silos : int (default: 5)
        Number of silos.
    slowdown_schedules : tuple of str | None (default: None)
        A further slowdown of each silo over the rounds, times the one from ``speeds``:
        ``"1:1,10:2,20:1"`` halves its capacity from round 10 to 19
        (:class:`~fl_lbbsp.clients.SlowdownSchedule`); one entry per silo, ``"1"`` for
        none. ``None``: capacities stay fixed.
    partition : str (default: "labels:2")
        ``iid``, ``labels:K`` or ``dirichlet:ALPHA``.
    rounds : int (default: 20)
        Federated rounds.
    local_steps : int (default: 20)
        Local steps tau.
    parallel : int (default: 1)
        Silos computing at the same time (compute slots); on the Simulation Engine every
        silo waits out its slowdown outside the slots, so the waits overlap as on
        separate machines (see :attr:`time_dilation`).
    partial_replies : int | None (default: None)
        Scheme ``partial``: replies aggregated per round (``None``: all silos but one).
    emulate_wait : bool (default: True)
        Emulated silos wait ``(k - 1) * t`` after computing for ``t``; ``False`` reports
        ``k * t`` at once: the reported times are kept, the wall clock is not.
    cost_model : str | None (default: None)
        Step time ``"m,b"`` of the fastest silo: silo i reports ``tau * k_i * (m * B_i +
        b)``, whatever the machine's load, and T* is exact (tests, balancing benchmarks).
    runtime : {"ray", "inprocess"} (default: "ray")
        Flower's Simulation Engine, or the same apps on an
        :class:`~fl_lbbsp.runs.inprocess.InProcessGrid`, silos one after the other
        (``parallel`` 1), with no engine start-up.
    out : Path (default: runs/simulate)
        Folder for telemetry and reports.
    encrypt : Path | None (default: None)
        Key folder from ``fl-lbbsp keys generate``: CKKS-encrypted updates, which the
        server only adds; the test accuracy is then federated (each silo evaluates on its
        share of the test split). ``None``: plaintext.
    silo_registry : Path | None (default: None)
        Key folder from ``fl-lbbsp keys silos``: the server checks every reply's
        signature against its ``registry.json`` and silo ``i`` signs with its
        ``silo-<i>.key``. ``None``: unsigned replies, silo ids believed.
    spend_saved_time : bool (default: False)
        The strategy's :class:`~fl_lbbsp.strategies.config.ServerConfig` setting: after
        ``rounds``, as many more rounds as the time saved on the equal split buys.
    """

    unit: ClassVar[str] = "silos"

    scheme: Scheme = "lbbsp"
    silos: int = Field(default=5, gt=0, strict=True)
    slowdown_schedules: tuple[str, ...] | None = None
    partition: PartitionText = "labels:2"
    rounds: int = Field(default=20, gt=0, strict=True)
    local_steps: int = Field(default=20, gt=0, strict=True)
    out: Path = Path("runs/simulate")
    partial_replies: int | None = Field(default=None, gt=0)
    emulate_wait: bool = True
    runtime: Runtime = "ray"
    silo_registry: Path | None = None
    spend_saved_time: bool = False

    @model_validator(mode="after")
    def _fl_checks(self) -> SimulationConfig:
        if self.balancing.tuning.allocator == "iterative":
            raise ValueError(
                "allocator 'iterative' (Alg. 2) steps one iteration at a time: cluster runs "
                "only; FL runs take 'linear' or 'proportional'"
            )
        if self.slowdown_schedules is not None:
            if len(self.slowdown_schedules) != self.silos:
                raise ValueError(
                    f"slowdown_schedules lists {len(self.slowdown_schedules)} entries but "
                    f"there are {self.silos} silos"
                )
            for text in self.slowdown_schedules:
                SlowdownSchedule.parse(text)
                check_schedule_order(text)
        if self.encrypt is not None and self.scheme not in ("fedavg", "lbbsp"):
            raise ValueError(f"encrypt works with schemes fedavg and lbbsp, not {self.scheme!r}")
        if self.runtime == "inprocess" and self.parallel != 1:
            raise ValueError(
                "runtime 'inprocess' runs silos one after the other: parallel must be 1"
            )
        return self

    @property
    def size(self) -> int:
        """Number of silos."""
        return self.silos

    def schedules(self) -> tuple[SlowdownSchedule, ...]:
        """Each silo's emulated slowdown over the rounds: its speed's factor times its
        ``slowdown_schedules`` entry, times :attr:`time_dilation`."""
        dilation = self.time_dilation
        return tuple(
            SlowdownSchedule(steps={r: dilation * k for r, k in schedule.steps.items()})
            for schedule in self._capacity_schedules()
        )

    def _capacity_schedules(self) -> tuple[SlowdownSchedule, ...]:
        extra = self.slowdown_schedules or ("1",) * self.silos
        out = []
        for k, text in zip(self.slowdowns, extra, strict=True):
            steps = {1: 1.0} | SlowdownSchedule.parse(text).steps
            out.append(SlowdownSchedule(steps={r: k * f for r, f in steps.items()}))
        return tuple(out)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def time_dilation(self) -> float:
        """Wall-clock seconds per second of the fastest emulated silo's own machine.

        Silos compute ``parallel`` at a time while their emulated waits overlap, so a
        round's wall time follows its emulated time only if this machine can do the
        federation's compute in that time: its capacity, sum_i 1/k_i in units of the
        fastest silo, must fit in ``parallel`` slots. Every silo is therefore emulated
        ``d = max(1, 1.2 * max_r sum_i 1 / k_i(r) / parallel)`` times slower (20% for
        queueing); capacity ratios stay as given. 1 in process, without waits, or with a
        cost model (whose times are the model's).
        """
        if self.runtime != "ray" or not self.emulate_wait or self.cost_model is not None:
            return 1.0
        schedules = self._capacity_schedules()
        rounds = sorted({r for schedule in schedules for r in schedule.steps})
        capacity = max(sum(1.0 / s.factor(r) for s in schedules) for r in rounds)
        return max(1.0, round(_QUEUEING_SLACK * capacity / self.parallel, 3))

    def silo_setup(self) -> SiloSetup:
        """The data/model/emulation setup shared by every silo."""
        return SiloSetup(
            dataset=self.dataset,
            partition=self.partition,
            num_silos=self.silos,
            seed=self.seed,
            model=self.model,
            slowdowns=tuple(str(s) for s in self.schedules()),
            secret_context=None if self.encrypt is None else str(self.encrypt),
            evaluate_on="train" if self.encrypt is None else "test",
            emulate_wait=self.emulate_wait,
            cost_model=self.cost_model,
            compute_lock=None if self.runtime == "inprocess" else str(self.compute_slots()),
            compute_slots=self.parallel,
            signing_key=None if self.silo_registry is None else str(self.silo_registry),
        )

    def compute_slots(self) -> Path:
        """Folder of the compute-slot lock files of this run's silos."""
        return self.out / f".compute-slots-{self.scheme}"


_STRATEGIES: dict[str, type[LBBSPFedAvg]] = {
    "fedavg": LBBSPFedAvg,
    "lbbsp": LBBSPFedAvg,
    "lbbsp-tau": LBBSPTau,
    "lbbsp-eta": LBBSPEta,
    "partial": PartialAggregation,
}


def make_strategy(config: SimulationConfig) -> LBBSPFedAvg:
    """The strategy of a simulated run: LB-BSP, FedAvg (LB-BSP with balancing off) or
    a baseline (:mod:`fl_lbbsp.strategies.baselines`).

    With ``config.encrypt``: :class:`~fl_lbbsp.strategies.encrypted.EncryptedLBBSPFedAvg`,
    evaluated by the silos, on the key files checked (:func:`~.engine.check_key_files`).

    Raises
    ------
    IdentityError
        A silo registry that cannot be read.
    KeyFileError
        Missing or mismatched CKKS key files.
    """
    he_keys = None if config.encrypt is None else check_key_files(config.encrypt)
    settings: dict[str, Any] = {
        **config.strategy_settings(),
        "local_steps": config.local_steps,
        "balance": config.scheme not in ("fedavg", "partial"),
        # Claimed times are checked against the wall time only where silos really wait
        # (None: on Flower's grids, off in process), not with emulated times.
        "check_times": None if config.emulate_wait and config.cost_model is None else False,
        "spend_saved_time": config.spend_saved_time,
    }
    if config.scheme == "partial":
        settings["replies"] = config.partial_replies
    if config.silo_registry is not None:
        settings["silo_registry"] = config.silo_registry
    if he_keys is None:
        strategy = _STRATEGIES[config.scheme]
        return strategy(fraction_evaluate=0.0, **settings)
    from ..strategies.encrypted import EncryptedLBBSPFedAvg

    return EncryptedLBBSPFedAvg(
        public_context=he_keys,
        fraction_evaluate=1.0,
        min_evaluate_nodes=config.silos,
        **settings,
    )


def resolve(
    config: SimulationConfig, *, strategy: LBBSPFedAvg | None = None
) -> ResolvedRun[LBBSPFedAvg]:
    """The run's parts, each built once, everything checked before Flower starts: the
    plan, the strategy (``strategy``, else :func:`make_strategy`), the initial model and
    the resume point, every partition, the ClientApp, the silos' keys, the telemetry.

    Raises
    ------
    DataSourceError
        A data source that cannot be read, or a partition it cannot give.
    CheckpointError
        A checkpoint folder that cannot be written, or a resume that differs from the run
        that wrote the checkpoint (each differing field named with both values).
    CheckpointInvalidError
        A checkpoint that fails validation or that the strategy cannot restore.
    IdentityError
        A silo registry that cannot be read, or a silo's key file that does not match it.
    KeyFileError
        Missing or mismatched CKKS key files.
    """
    setup = config.silo_setup()
    # Every silo runs at once; the compute slots let `parallel` compute at a time.
    plan = plan_run(config, rounds=config.rounds, parallel=config.silos)
    strategy = strategy or make_strategy(config)
    initial = initial_model(setup)
    arrays = ArrayRecord(initial.model.state_dict())
    resume = resume_run(strategy, plan.record, max_silos=plan.nodes, initial_arrays=arrays)
    try:  # partitions every silo's data (cached), refusing a split the data cannot give
        silo_data(setup, 0)
    except DataSourceError:
        raise
    except ValueError as err:
        raise DataSourceError(f"--partition {config.partition}: {err}") from None
    client_app = make_client_app(setup)
    if config.silo_registry is not None:  # the silos sign with the folder's key files
        check_silo_keys(config.silo_registry, [str(k) for k in range(config.silos)])
    start_telemetry(plan.telemetry, config, resume=resume is not None)
    return ResolvedRun(
        plan=plan, strategy=strategy, initial=initial, client_app=client_app, resume=resume
    )


def run(config: SimulationConfig, *, strategy: LBBSPFedAvg | None = None) -> list[dict[str, Any]]:
    """Run one simulated federation (:func:`resolve`, then Flower) and return its
    telemetry events; ``strategy``: one from :func:`make_strategy`, e.g. observed by the
    caller. Every figure derived from ``config.speeds`` is emulated."""
    resolved = resolve(config, strategy=strategy)
    return execute(resolved, runtime=config.runtime)


_QUEUEING_SLACK = 1.2
"""Headroom of the compute slots over the federation's capacity (see time_dilation)."""
