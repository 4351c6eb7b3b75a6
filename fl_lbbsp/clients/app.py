"""The silo side as a Flower ClientApp: train with the batch size the server sends,
time the compute, report psutil metrics and, if asked, emulate a slower machine."""

from __future__ import annotations

import hashlib
import logging
import time
from functools import lru_cache

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from pydantic import BaseModel, ConfigDict, Field

from ..contract import RecordKeys
from ..datasets import ArrayDataset, PartitionSpec, load_source, partition_indices, train_test_split
from ..models import build_model
from .emulation import SlowdownSchedule, emulate_slowdown
from .trainer import TrainerConfig, evaluate, machine_usage, train_local

__all__ = ["SiloSetup", "make_client_app", "silo_data"]

log = logging.getLogger(__name__)


class SiloSetup(BaseModel):
    """How every silo of a federation finds its data, model and emulated speed.

    Parameters
    ----------
    dataset : str (default: "embedded")
        ``"embedded"``, ``"mnist:PATH"`` or ``"cifar10:PATH"``.
    partition : str (default: "iid")
        ``"iid"``, ``"labels:K"`` or ``"dirichlet:ALPHA"``.
    num_silos : int (default: 5)
        Number of silos the data is split over.
    seed : int (default: 0)
        Seed of the train/test split, the partitioning and the reshuffling.
    model : str (default: "lenet5")
        ``"lenet5"`` or ``"mlp"``, sized to the input.
    slowdowns : tuple of str (default: ())
        Emulated slowdown of silo i (``"4"`` or a schedule ``"1:1,10:4"``); a silo's
        ``node_config["slowdown"]`` overrides it. Empty: the run config's ``slowdowns``
        (``"1;2;2;4;4"``, one entry per partition) if set, else no emulation.
    test_fraction : float (default: 0.2)
        Share of the data held out for the server's evaluation.
    torch_threads : int (default: 1)
        torch intra-op threads per silo process.
    keys : RecordKeys (default: RecordKeys())
        Record key names, the same as the strategy's.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    dataset: str = "embedded"
    partition: str = "iid"
    num_silos: int = Field(default=5, gt=0)
    seed: int = 0
    model: str = "lenet5"
    slowdowns: tuple[str, ...] = ()
    test_fraction: float = Field(default=0.2, gt=0, lt=1)
    torch_threads: int = Field(default=1, gt=0)
    keys: RecordKeys = RecordKeys()


@lru_cache(maxsize=4)
def _split(dataset: str, seed: int, test_fraction: float) -> tuple[ArrayDataset, ArrayDataset]:
    return train_test_split(load_source(dataset), test_fraction=test_fraction, seed=seed)


@lru_cache(maxsize=4)
def _partitions(
    dataset: str, partition: str, num_silos: int, seed: int, test_fraction: float
) -> tuple[np.ndarray, ...]:
    train, _ = _split(dataset, seed, test_fraction)
    spec = PartitionSpec.parse(partition)
    return tuple(partition_indices(train.y, num_silos=num_silos, spec=spec, seed=seed))


def silo_data(setup: SiloSetup, partition_id: int) -> ArrayDataset:
    """The local training data of silo ``partition_id`` (cached per process)."""
    train, _ = _split(setup.dataset, setup.seed, setup.test_fraction)
    parts = _partitions(
        setup.dataset, setup.partition, setup.num_silos, setup.seed, setup.test_fraction
    )
    return train.subset(parts[partition_id])


def test_data(setup: SiloSetup) -> ArrayDataset:
    """The held-out test set the server evaluates the global model on."""
    return _split(setup.dataset, setup.seed, setup.test_fraction)[1]


def _slowdown(setup: SiloSetup, context: Context, partition_id: int) -> SlowdownSchedule:
    value = context.node_config.get("slowdown")
    slowdowns = setup.slowdowns
    if not slowdowns and context.run_config.get("slowdowns"):
        slowdowns = tuple(str(context.run_config["slowdowns"]).split(";"))
    if value is None and partition_id < len(slowdowns):
        value = slowdowns[partition_id]
    return SlowdownSchedule.parse(value if value is not None else 1.0)


def _seed(*parts: object) -> int:
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") & 0x7FFF_FFFF_FFFF_FFFF


def make_client_app(setup: SiloSetup) -> ClientApp:
    """Build the silo ClientApp.

    The silo reads ``partition-id`` (and optionally ``silo-id``, ``slowdown`` and
    ``max-batch-size``) from its node_config, trains exactly tau steps with the batch size
    in the train message, and replies with its parameters and the MetricRecord of the
    contract (:class:`~fl_lbbsp.contract.RecordKeys`), plus ``compute-time`` (the real,
    unemulated seconds), ``busy-time`` (real seconds in the handler, emulated wait
    included: the server's wall time beyond it is messaging), ``slowdown`` (the emulated
    factor k) and ``train-loss``.
    """
    app = ClientApp()
    keys = setup.keys

    def _model_and_data(msg: Message, context: Context) -> tuple[torch.nn.Module, ArrayDataset]:
        torch.set_num_threads(setup.torch_threads)
        partition_id = int(context.node_config.get("partition-id", 0))
        data = silo_data(setup, partition_id)
        model = build_model(setup.model, input_shape=data.input_shape, num_classes=data.num_classes)
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        return model, data

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        started = time.perf_counter()
        config = msg.content["config"]
        instructions = TrainerConfig(
            batch_size=int(config[keys.batch_size]),
            local_steps=int(config[keys.local_steps]),
            lr=float(config[keys.lr]),
            server_round=int(config.get(keys.server_round, 1)),
        )
        partition_id = int(context.node_config.get("partition-id", 0))
        silo_id = str(context.node_config.get(keys.silo_id, partition_id))
        model, data = _model_and_data(msg, context)
        factor = _slowdown(setup, context, partition_id).factor(instructions.server_round)
        generator = torch.Generator().manual_seed(
            _seed(setup.seed, silo_id, instructions.server_round)
        )
        machine_usage()  # start psutil's CPU window at the start of training
        result = train_local(
            model,
            torch.from_numpy(data.x),
            torch.from_numpy(data.y),
            batch_size=instructions.batch_size,
            local_steps=instructions.local_steps,
            lr=instructions.lr,
            generator=generator,
        )
        cpu, memory = machine_usage()
        reported = emulate_slowdown(result.compute_time, factor)
        metrics = MetricRecord(
            {
                keys.num_examples: len(data),
                keys.train_time: reported,
                keys.batch_size: instructions.batch_size,
                keys.samples_processed: result.samples,
                keys.cpu_percent: cpu,
                keys.memory_percent: memory,
                keys.max_batch_size: int(context.node_config.get(keys.max_batch_size, 0)),
                "compute-time": result.compute_time,
                "busy-time": time.perf_counter() - started,
                "slowdown": factor,
                "train-loss": result.loss,
            }
        )
        content = RecordDict(
            {
                "arrays": ArrayRecord(model.state_dict()),
                "metrics": metrics,
                keys.silo_record: ConfigRecord({keys.silo_id: silo_id}),
            }
        )
        return Message(content=content, reply_to=msg)

    @app.evaluate()
    def evaluate_local(msg: Message, context: Context) -> Message:
        model, data = _model_and_data(msg, context)
        loss, accuracy = evaluate(model, torch.from_numpy(data.x), torch.from_numpy(data.y))
        metrics = MetricRecord(
            {keys.num_examples: len(data), "eval-loss": loss, "eval-acc": accuracy}
        )
        return Message(content=RecordDict({"metrics": metrics}), reply_to=msg)

    return app
