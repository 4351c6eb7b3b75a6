"""Run LB-BSP or FedAvg on Flower's Simulation Engine with emulated heterogeneous silos."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.simulation import run_simulation
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .clients.app import SiloSetup, make_client_app, test_data
from .clients.emulation import check_speeds, slowdowns_from_speeds
from .clients.trainer import evaluate
from .datasets import ArrayDataset, PartitionSpec, load_source
from .models import build_model
from .strategies import LBBSPFedAvg
from .telemetry import TelemetryWriter, read_telemetry

__all__ = ["SimulationConfig", "central_evaluation", "run", "run_engine", "start_telemetry"]

log = logging.getLogger("fl_lbbsp")


class SimulationConfig(BaseModel):
    """One simulated federation: data, silos, emulated speeds and training settings.

    Parameters
    ----------
    scheme : {"fedavg", "lbbsp"} (default: "lbbsp")
        FedAvg (every silo at B_init) or LB-BSP (batch size per predicted speed).
    silos : int (default: 5)
        Number of silos.
    speeds : list of float | None (default: None)
        Emulated relative capacity of each silo (e.g. 16,8,8,4,4); silo i runs
        ``max(speeds) / speeds[i]`` times slower than this machine. ``None``: no emulation.
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
    model : str (default: "lenet5")
        ``lenet5`` or ``mlp``.
    seed : int (default: 0)
        Seed of the data split, partitioning, model init and reshuffling.
    estimator, alpha, allocator, max_change_ratio :
        Balancer settings (see :class:`~fl_lbbsp.strategies.LBBSPFedAvg`).
    parallel : int (default: 1)
        Silos computing at the same time. 1 keeps the measured compute free of
        contention between silos on a small machine.
    out : Path (default: runs/simulate)
        Folder for telemetry and reports.
    encrypt : Path | None (default: None)
        Key folder from ``fl-lbbsp keys generate``: silos send CKKS-encrypted updates
        (``secret.ckks``), the server only adds them (``public.ckks``), and the test
        accuracy is federated (each silo evaluates on its share of the test split).
        ``None``: plaintext updates and central evaluation.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    scheme: Literal["fedavg", "lbbsp"] = "lbbsp"
    silos: int = Field(default=5, gt=0, strict=True)
    speeds: tuple[float, ...] | None = None
    partition: str = "labels:2"
    rounds: int = Field(default=20, gt=0, strict=True)
    local_steps: int = Field(default=20, gt=0, strict=True)
    batch_size: int = Field(default=32, gt=0, strict=True)
    lr: float = Field(default=0.05, gt=0, allow_inf_nan=False)
    dataset: str = "embedded"
    model: Literal["lenet5", "mlp"] = "lenet5"
    seed: int = 0
    estimator: Literal["ema", "last"] = "ema"
    alpha: float = Field(default=0.2, gt=0, le=1)
    allocator: Literal["linear", "proportional"] = "linear"
    max_change_ratio: float | None = Field(default=2.0, gt=1, allow_inf_nan=False)
    parallel: int = Field(default=1, gt=0, strict=True)
    out: Path = Path("runs/simulate")
    encrypt: Path | None = None

    @classmethod
    def _positive_speeds(cls, speeds: tuple[float, ...] | None) -> tuple[float, ...] | None:
        if speeds is not None and any(not 0 < s < float("inf") for s in speeds):
            raise ValueError(f"every speed must be a finite positive number, got {list(speeds)}")
        return speeds

    @field_validator("partition")
    @classmethod
    def _partition(cls, value: str) -> str:
        PartitionSpec.parse(value)
        return value

    @model_validator(mode="after")
    def _speeds_per_silo(self) -> SimulationConfig:
        check_speeds(self.speeds, self.silos, "silos")
        return self

    @property
    def slowdowns(self) -> tuple[float, ...]:
        """Emulated slowdown factor of each of the silos (1 for the fastest)."""
        return slowdowns_from_speeds(self.speeds, self.silos)

    def silo_setup(self) -> SiloSetup:
        """The data/model/emulation setup shared by every silo."""
        return SiloSetup(
            dataset=self.dataset,
            partition=self.partition,
            num_silos=self.silos,
            seed=self.seed,
            model=self.model,
            slowdowns=tuple(f"{k:g}" for k in self.slowdowns),
            secret_context=None if self.encrypt is None else str(self.encrypt),
            evaluate_on="train" if self.encrypt is None else "test",
        )

    def telemetry_path(self) -> Path:
        """JSON-lines telemetry file of this run."""
        return self.out / f"{self.scheme}.jsonl"


def make_strategy(config: SimulationConfig) -> LBBSPFedAvg:
    """The strategy of a simulated run (LB-BSP, or the same with balancing off).

    With ``config.encrypt`` it is :class:`~fl_lbbsp.strategies.encrypted.EncryptedLBBSPFedAvg`
    with federated evaluation on every silo.
    """
    settings = {
        "initial_batch_size": config.batch_size,
        "local_steps": config.local_steps,
        "lr": config.lr,
        "balance": config.scheme == "lbbsp",
        "estimator": config.estimator,
        "alpha": config.alpha,
        "allocator": config.allocator,
        "max_change_ratio": config.max_change_ratio,
        "telemetry_path": config.telemetry_path(),
        "min_train_nodes": config.silos,
        "min_available_nodes": config.silos,
    }
    if config.encrypt is None:
        return LBBSPFedAvg(fraction_evaluate=0.0, **settings)  # type: ignore[arg-type]
    from .strategies.encrypted import EncryptedLBBSPFedAvg

    return EncryptedLBBSPFedAvg(
        public_context=config.encrypt,
        fraction_evaluate=1.0,
        min_evaluate_nodes=config.silos,
        **settings,
    )


def make_server_app(config: SimulationConfig) -> ServerApp:
    """A ServerApp running the configured strategy with central evaluation each round."""
    app = ServerApp()
    setup = config.silo_setup()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        torch.manual_seed(config.seed)
        test = test_data(setup)
        model = build_model(
            config.model, input_shape=test.input_shape, num_classes=test.num_classes
        )
        strategy = make_strategy(config)
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

    return app


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


def run(config: SimulationConfig) -> list[dict[str, object]]:
    """Run one simulated federation and return its telemetry events.

    The silos' emulated capacities come from ``config.speeds``; every figure derived from
    them is emulated. Data is loaded (and a bad path reported) before Flower starts.
    """
    load_source(config.dataset)  # fail fast on a bad dataset spec or path
    if config.encrypt is not None:  # fail fast on missing or wrong key files
        from .crypto import load_server_keys, load_silo_keys

        server = load_server_keys(config.encrypt)
        load_silo_keys(config.encrypt, fingerprint=server.fingerprint)
    path = config.telemetry_path()
    start_telemetry(path, config)
    run_engine(
        make_server_app(config),
        make_client_app(config.silo_setup()),
        num_supernodes=config.silos,
        parallel=config.parallel,
    )
    return read_telemetry(path)


def start_telemetry(path: Path, config: BaseModel) -> None:
    """Start a fresh telemetry file at ``path`` with the run's config as first event."""
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
