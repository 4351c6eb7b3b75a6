"""Run LB-BSP or FedAvg on Flower's Simulation Engine with emulated heterogeneous silos."""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, Protocol, cast, get_args

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.simulation import run_simulation
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    computed_field,
    field_validator,
    model_validator,
)

from ..clients.app import SiloSetup, make_client_app, silo_data, test_data
from ..clients.emulation import (
    CostModelText,
    SlowdownSchedule,
    Speeds,
    check_speeds,
    slowdowns_from_speeds,
)
from ..clients.trainer import evaluate
from ..core import BALANCER_DEFAULTS
from ..core.estimators import ESTIMATORS, make_estimator
from ..datasets import ArrayDataset, DataSourceError, PartitionText, SourceSpec, load_source
from ..models import ModelName, build_model
from ..strategies import LBBSPEta, LBBSPFedAvg, LBBSPTau, PartialAggregation
from ..strategies.checkpoint import (
    CheckpointError,
    CheckpointStore,
    check_checkpoint_dir,
    resume_point,
)
from ..telemetry import TelemetryWriter, read_telemetry
from .inprocess import InProcessGrid

__all__ = [
    "SCHEMES",
    "SimulationConfig",
    "central_evaluation",
    "check_estimator_name",
    "check_estimator_options",
    "check_key_files",
    "prepare_run",
    "run",
    "run_engine",
    "start_telemetry",
    "train_federation",
]

log = logging.getLogger("fl_lbbsp")

Scheme = Literal["fedavg", "lbbsp", "lbbsp-tau", "lbbsp-eta", "partial"]
SCHEMES: tuple[str, ...] = get_args(Scheme)
"""Schemes a simulation can run: FedAvg, LB-BSP and the baselines of
:mod:`fl_lbbsp.strategies.baselines`."""


def check_estimator_name(name: str) -> str:
    """A config's speed estimator: one of :data:`~fl_lbbsp.core.estimators.ESTIMATORS`."""
    if name not in ESTIMATORS:
        raise ValueError(f"unknown estimator {name!r}; expected one of {list(ESTIMATORS)}")
    return name


def check_estimator_options(name: str, alpha: float, options: dict[str, Any]) -> None:
    """Refuse, before any round, estimator options the estimator would refuse."""
    try:
        make_estimator(name, alpha=alpha, options=options)
    except TypeError as err:  # an option the estimator does not have
        raise ValueError(f"estimator_options {options}: {err}") from None
    except ValueError as err:
        raise ValueError(f"estimator_options {options}: {err}") from None


class SimulationConfig(BaseModel):
    """One simulated federation: data, silos, emulated speeds and training settings.

    Parameters
    ----------
    scheme : {"fedavg", "lbbsp", "lbbsp-tau", "lbbsp-eta", "partial"} (default: "lbbsp")
        FedAvg (every silo at B_init), LB-BSP (batch size per predicted speed), or a
        baseline: LB-BSP tuning tau instead of B (``lbbsp-tau``), LB-BSP scaling eta
        with B (``lbbsp-eta``), partial aggregation of the fastest silos (``partial``).
    silos : int (default: 5)
        Number of silos.
    speeds : list of float | None (default: None)
        Emulated relative capacity of each silo (e.g. 16,8,8,4,4); silo i runs
        ``max(speeds) / speeds[i]`` times slower than this machine. ``None``: no emulation.
    slowdown_schedules : tuple of str | None (default: None)
        A further slowdown of each silo over the rounds, multiplied onto the one from
        ``speeds``: ``"1:1,10:2,20:1"`` halves the silo's capacity from round 10 to 19
        (see :class:`~fl_lbbsp.clients.SlowdownSchedule`); one entry per silo, ``"1"``
        for none. ``None``: capacities stay fixed.
    partition : str (default: "labels:2")
        ``iid``, ``labels:K`` or ``dirichlet:ALPHA``.
    rounds : int (default: 20)
        Federated rounds.
    local_steps : int (default: 20)
        Local steps tau.
    batch_size : int (default: 32)
        B_init.
    lr : float (default: 0.05)
        Learning rate eta.
    dataset : str (default: "embedded")
        ``embedded``, ``mnist:PATH`` or ``cifar10:PATH``.
    model : {"lenet5", "mlp"} (default: "lenet5")
        The model.
    seed : int (default: 0)
        Seed of the data split, partitioning, model init and reshuffling (>= 0).
    estimator, alpha, allocator, max_change_ratio, min_batch_fraction :
        Balancer settings (see :class:`~fl_lbbsp.strategies.LBBSPFedAvg`; defaults
        :data:`fl_lbbsp.core.BALANCER_DEFAULTS`); ``estimator`` is any name in
        :data:`fl_lbbsp.core.estimators.ESTIMATORS`; no silo gets a batch size below
        ``min_batch_fraction * batch_size``.
    estimator_options : dict (default: {})
        Extra arguments of the estimator (NARX ``warmup``, ...).
    parallel : int (default: 1)
        Silos computing at the same time (compute slots). On the Simulation Engine every
        silo runs at once and waits out its emulated slowdown outside the slots, so the
        waits overlap as on separate machines and a round's wall time follows its
        emulated time (see :attr:`time_dilation`). 1 keeps the measured compute free of
        contention between silos on a small machine.
    partial_replies : int | None (default: None)
        Scheme ``partial``: replies aggregated per round (``None``: all silos but one).
    emulate_wait : bool (default: True)
        Emulated silos wait ``(k - 1) * t`` after computing for ``t``; ``False`` reports
        ``k * t`` without waiting, which keeps the reported times but not the wall
        clock (the silos compute one after the other, so nothing contends).
    cost_model : str | None (default: None)
        Emulated step time ``"m,b"`` of the fastest silo (seconds per sample, per step):
        silo i reports ``tau * k_i * (m * B_i + b)`` instead of its measured compute
        time times k_i, and T* is exact. For runs whose batch sizes must not depend on
        how busy the machine is (tests, balancing benchmarks). ``None``: measured times.
    runtime : {"ray", "inprocess"} (default: "ray")
        ``"ray"``: Flower's Simulation Engine. ``"inprocess"``: the same ServerApp body
        and ClientApp on an :class:`~fl_lbbsp.runs.inprocess.InProcessGrid` in this process,
        silos one after the other (``parallel`` must be 1), with no engine start-up.
    out : Path (default: runs/simulate)
        Folder for telemetry and reports.
    encrypt : Path | None (default: None)
        Key folder from ``fl-lbbsp keys generate``: silos send CKKS-encrypted updates
        (``secret.ckks``), the server only adds them (``public.ckks``), and the test
        accuracy is federated (each silo evaluates on its share of the test split).
        ``None``: plaintext updates and central evaluation.
    checkpoint_dir : Path | None (default: None)
        Checkpoint folder: the strategy checkpoints every round in
        ``checkpoint_dir/<scheme>`` and a rerun resumes from there (the telemetry file
        is then kept, not restarted). ``None``: no checkpoints.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    scheme: Scheme = "lbbsp"
    silos: int = Field(default=5, gt=0, strict=True)
    speeds: Speeds = None
    slowdown_schedules: tuple[str, ...] | None = None
    partition: PartitionText = "labels:2"
    rounds: int = Field(default=20, gt=0, strict=True)
    local_steps: int = Field(default=20, gt=0, strict=True)
    batch_size: int = Field(default=32, gt=0, strict=True)
    lr: float = Field(default=0.05, gt=0, allow_inf_nan=False)
    dataset: SourceSpec = "embedded"
    model: ModelName = "lenet5"
    seed: int = Field(default=0, ge=0)
    estimator: str = "ema"
    alpha: float = Field(default=0.2, gt=0, le=1)
    estimator_options: dict[str, Any] = Field(default_factory=dict)
    allocator: Literal["linear", "proportional"] = "linear"
    max_change_ratio: float | None = Field(
        default=BALANCER_DEFAULTS["max_change_ratio"], gt=1, allow_inf_nan=False
    )
    min_batch_fraction: float = Field(default=BALANCER_DEFAULTS["min_batch_fraction"], ge=0, le=1)
    parallel: int = Field(default=1, gt=0, strict=True)
    out: Path = Path("runs/simulate")
    encrypt: Path | None = None
    checkpoint_dir: Path | None = None
    partial_replies: int | None = Field(default=None, gt=0)
    emulate_wait: bool = True
    cost_model: CostModelText | None = None
    runtime: Literal["ray", "inprocess"] = "ray"

    @field_validator("estimator")
    @classmethod
    def _estimator(cls, value: str) -> str:
        return check_estimator_name(value)

    @model_validator(mode="after")
    def _speeds_per_silo(self) -> SimulationConfig:
        check_estimator_options(self.estimator, self.alpha, self.estimator_options)
        check_speeds(self.speeds, self.silos, "silos")
        if self.slowdown_schedules is not None:
            if len(self.slowdown_schedules) != self.silos:
                raise ValueError(
                    f"slowdown_schedules lists {len(self.slowdown_schedules)} entries but "
                    f"there are {self.silos} silos"
                )
            for text in self.slowdown_schedules:
                SlowdownSchedule.parse(text)
        if self.encrypt is not None and self.scheme not in ("fedavg", "lbbsp"):
            raise ValueError(f"encrypt works with schemes fedavg and lbbsp, not {self.scheme!r}")
        if self.runtime == "inprocess" and self.parallel != 1:
            raise ValueError(
                "runtime 'inprocess' runs silos one after the other: parallel must be 1"
            )
        return self

    @property
    def slowdowns(self) -> tuple[float, ...]:
        """Emulated slowdown factor of each of the silos (1 for the fastest), before
        ``slowdown_schedules``."""
        return slowdowns_from_speeds(self.speeds, self.silos)

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

        On the Simulation Engine silos compute ``parallel`` at a time (each alone on its
        share of this machine) while their emulated waits overlap, so a round's wall time
        follows its emulated time only if this machine can do the federation's compute in
        that time: the federation's capacity, sum_i 1/k_i in units of the fastest silo, must
        fit in ``parallel`` slots. Every silo is therefore emulated ``d`` times slower, with
        ``d = max(1, 1.2 * max_r sum_i 1 / k_i(r) / parallel)`` (20% for queueing): capacity
        ratios, and every ratio reported, stay as given; times are in units of a machine
        ``d`` times slower than this one. 1 in process, without waits, or with a cost model
        (whose times are the model's).
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
        )

    def compute_slots(self) -> Path:
        """Folder of the compute-slot lock files of this run's silos."""
        return self.out / f".compute-slots-{self.scheme}"

    def telemetry_path(self) -> Path:
        """JSON-lines telemetry file of this run."""
        return self.out / f"{self.scheme}.jsonl"

    def checkpoint_path(self) -> Path | None:
        """Checkpoint folder of this run (``None``: no checkpoints)."""
        return None if self.checkpoint_dir is None else self.checkpoint_dir / self.scheme


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

    With ``config.encrypt`` it is :class:`~fl_lbbsp.strategies.encrypted.EncryptedLBBSPFedAvg`
    with federated evaluation on every silo.
    """
    settings: dict[str, Any] = {
        "initial_batch_size": config.batch_size,
        "local_steps": config.local_steps,
        "lr": config.lr,
        "balance": config.scheme not in ("fedavg", "partial"),
        "estimator": config.estimator,
        "alpha": config.alpha,
        "estimator_options": dict(config.estimator_options),
        "allocator": config.allocator,
        "max_change_ratio": config.max_change_ratio,
        "balancer_options": {"min_batch_fraction": config.min_batch_fraction},
        "telemetry_path": config.telemetry_path(),
        "min_train_nodes": config.silos,
        "min_available_nodes": config.silos,
        "checkpoint_dir": config.checkpoint_path(),
    }
    if config.scheme == "partial":
        settings["replies"] = config.partial_replies
    if config.encrypt is None:
        strategy = _STRATEGIES[config.scheme]
        return strategy(fraction_evaluate=0.0, **settings)
    from ..strategies.encrypted import EncryptedLBBSPFedAvg

    return EncryptedLBBSPFedAvg(
        public_context=config.encrypt,
        fraction_evaluate=1.0,
        min_evaluate_nodes=config.silos,
        **settings,
    )


def make_server_app(config: SimulationConfig, strategy: LBBSPFedAvg | None = None) -> ServerApp:
    """A ServerApp running the configured strategy (or ``strategy``) with central
    evaluation each round."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        train_federation(config, grid, strategy=strategy)

    return app


def train_federation(
    config: SimulationConfig, grid: Grid, *, strategy: LBBSPFedAvg | None = None
) -> LBBSPFedAvg:
    """The ServerApp's body: run the configured strategy on ``grid`` for
    ``config.rounds`` rounds, with central evaluation every round; return the strategy.

    Parameters
    ----------
    config : SimulationConfig
        The federation.
    grid : Grid
        Flower's grid, or an :class:`~fl_lbbsp.runs.inprocess.InProcessGrid`.
    strategy : LBBSPFedAvg | None (default: None)
        A strategy from :func:`make_strategy` ``(config)``, e.g. one the caller observes;
        ``None`` builds it.
    """
    torch.manual_seed(config.seed)
    test = test_data(config.silo_setup())
    model = build_model(config.model, input_shape=test.input_shape, num_classes=test.num_classes)
    strategy = strategy or make_strategy(config)
    strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(model.state_dict()),
        num_rounds=config.rounds,
        train_config=ConfigRecord(),
        # Encrypted: the server cannot read the model; the silos evaluate it.
        evaluate_fn=None
        if config.encrypt is not None
        else central_evaluation(strategy, model, test),
    )
    return strategy


def central_evaluation(
    strategy: LBBSPFedAvg, model: torch.nn.Module, test: ArrayDataset, *, every: int = 1
) -> Callable[[int, ArrayRecord], MetricRecord | None]:
    """``evaluate_fn`` for ``strategy.start``: test accuracy of the global model every
    ``every`` rounds (and round 0), logged and written to the strategy's telemetry."""
    x, y = torch.from_numpy(test.x), torch.from_numpy(test.y)

    def evaluate_global(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        if server_round % every:
            return None
        model.load_state_dict(arrays.to_torch_state_dict())
        loss, accuracy = evaluate(model, x, y)
        strategy.telemetry.write(
            {
                "event": "evaluate",
                "scheme": strategy.scheme,
                "round": server_round,
                "loss": loss,
                "accuracy": accuracy,
            }
        )
        log.info("[%s] round %d | test accuracy %.4f", strategy.scheme, server_round, accuracy)
        return MetricRecord({"loss": loss, "accuracy": accuracy})

    return evaluate_global


def check_key_files(key_dir: Path) -> None:
    """Fail fast on missing or mismatched key files: the server's public context and the
    silos' secret context must both load, under the same fingerprint."""
    from ..crypto import load_server_keys, load_silo_keys

    server = load_server_keys(key_dir)
    load_silo_keys(key_dir, fingerprint=server.fingerprint)


def run(config: SimulationConfig, *, strategy: LBBSPFedAvg | None = None) -> list[dict[str, Any]]:
    """Run one simulated federation and return its telemetry events.

    The silos' emulated capacities come from ``config.speeds``; every figure derived from
    them is emulated. Data is loaded (and a bad path reported) before Flower starts.
    ``strategy``: as in :func:`train_federation`.
    """
    load_source(config.dataset)  # fail fast on a bad dataset spec or path
    try:  # partitions every silo's data (cached), refusing a split the data cannot give
        silo_data(config.silo_setup(), 0)
    except ValueError as err:
        raise DataSourceError(f"--partition {config.partition}: {err}") from None
    prepare_run(config, strategy or make_strategy(config))
    path = config.telemetry_path()
    if config.runtime == "inprocess":
        grid = InProcessGrid(make_client_app(config.silo_setup()), num_nodes=config.silos)
        train_federation(config, grid, strategy=strategy)
    else:
        # Every silo runs at once; the compute slots let `parallel` compute at a time.
        run_engine(
            make_server_app(config, strategy),
            make_client_app(config.silo_setup()),
            num_supernodes=config.silos,
            parallel=config.silos,
        )
    return read_telemetry(path)


_QUEUEING_SLACK = 1.2
"""Headroom of the compute slots over the federation's capacity (see time_dilation)."""

RUN_FILE = "run.json"
"""File beside a run's checkpoints recording the settings that decide the run."""

_NOT_RUN_SETTINGS = frozenset(
    {"out", "rounds", "iterations", "runtime", "parallel", "emulate_wait", "wait",
     "checkpoint_dir", "encrypt", "eval_every", "time_dilation"}
)  # fmt: skip
"""Config fields a resumed run may change: where output goes, how long it runs and how
the silos are scheduled, none of which changes a round's result."""


class RunConfig(Protocol):
    """What :func:`prepare_run` needs of a simulation or cluster config."""

    dataset: str
    encrypt: Path | None
    checkpoint_dir: Path | None

    def telemetry_path(self) -> Path: ...

    def checkpoint_path(self) -> Path | None: ...

    def model_dump(self, *, mode: str) -> dict[str, Any]: ...


def prepare_run(config: RunConfig, strategy: LBBSPFedAvg) -> None:
    """Check everything that can be checked before round 1, then start the telemetry.

    The data source loads; the key files (encrypted runs) load under one fingerprint;
    the checkpoint folder is a writable directory; a resume (a checkpoint in the folder)
    has the settings of the run that wrote it (:data:`RUN_FILE`: model, data, silos,
    partition, seed, tau, eta, B_init, balancer, ...) and the telemetry of its earlier
    rounds, copied from the first run's output folder when ``out`` changed.

    Raises
    ------
    DataSourceError
        A data source that cannot be read.
    CheckpointError
        A checkpoint folder that cannot be written, or a resume that differs from the
        run that wrote the checkpoint (each differing field named with both values).
    KeyFileError
        Missing or mismatched key files.
    """
    load_source(config.dataset)  # fail fast on a bad dataset spec or path
    if config.encrypt is not None:
        check_key_files(config.encrypt)
    directory = config.checkpoint_path()
    if config.checkpoint_dir is not None and directory is not None:
        check_checkpoint_dir(config.checkpoint_dir, directory)
    telemetry = config.telemetry_path()
    settings = {
        k: v for k, v in config.model_dump(mode="json").items() if k not in _NOT_RUN_SETTINGS
    }
    run_file = None if directory is None else directory / RUN_FILE
    saved = None
    if directory is not None and run_file is not None and CheckpointStore(directory).rounds():
        saved = _check_same_run(run_file, settings) if run_file.is_file() else None
    # A checkpoint of another strategy or other settings is refused here.
    checkpoint = resume_point(strategy)
    if checkpoint is not None:
        earlier = None if saved is None else Path(saved)
        if not telemetry.exists() and earlier is not None and earlier.is_file():
            telemetry.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(earlier, telemetry)
        if not telemetry.is_file():
            raise CheckpointError(
                f"resuming after round {checkpoint.server_round} needs the telemetry of the "
                f"earlier rounds, {telemetry}: rerun with the first run's output folder"
            )
    if run_file is not None and (checkpoint is None or not run_file.is_file()):
        record = {"telemetry": str(telemetry.resolve()), "settings": settings}
        _write_atomically(run_file, json.dumps(record, indent=2, sort_keys=True))
    start_telemetry(telemetry, cast(BaseModel, config), resume=checkpoint is not None)


def _check_same_run(run_file: Path, settings: dict[str, Any]) -> str:
    """Refuse settings other than those of the run that wrote the checkpoints beside
    ``run_file``; return that run's telemetry path."""
    try:
        saved = json.loads(run_file.read_text())
        earlier, before = str(saved["telemetry"]), dict(saved["settings"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise CheckpointError(f"{run_file} is unreadable ({err})") from None
    differences = [
        f"{name} {before.get(name)!r} (now {value!r})"
        for name, value in settings.items()
        if before.get(name) != value
    ]
    if differences:
        raise CheckpointError(
            f"the checkpoint in {run_file.parent} is of a run with {'; '.join(differences)}: "
            "resume with the same settings, or use another checkpoint dir"
        )
    return earlier


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def start_telemetry(path: Path, config: BaseModel, *, resume: bool = False) -> None:
    """Start a fresh telemetry file at ``path`` with the run's config as first event.

    With ``resume`` (a run that resumes from a checkpoint) an existing file is kept: the
    strategy continues it and drops the events of rounds after its checkpoint.
    """
    if resume and path.exists():
        log.info("resuming from a checkpoint: telemetry %s is continued", path)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    TelemetryWriter(path).write({"event": "config", **config.model_dump(mode="json")})


def run_engine(
    server_app: ServerApp, client_app: ClientApp, *, num_supernodes: int, parallel: int
) -> None:
    """Run a ServerApp and ClientApp on Flower's Simulation Engine (Ray), with
    ``parallel`` ClientApps computing at once."""
    cpus = os.cpu_count() or 1
    backend_config = {
        "client_resources": {"num_cpus": cpus / parallel, "num_gpus": 0.0},
        "init_args": {"num_cpus": cpus, "include_dashboard": False, "log_to_driver": False},
    }
    run_simulation(
        server_app=server_app,
        client_app=client_app,
        num_supernodes=num_supernodes,
        backend_config=backend_config,  # type: ignore[arg-type]
    )
