"""What every silo of a simulated federation is set up with (:class:`SiloSetup`: data,
model, emulated speed, keys), and the data it finds from it: its training partition, the
held-out test split, its share of that split (each cached per process), and the
federation's initial model (:func:`initial_model`)."""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import Literal, NamedTuple

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

from ..contract import RecordKeys
from ..datasets import (
    ArrayDataset,
    PartitionSpec,
    PartitionText,
    SourceSpec,
    load_source,
    partition_indices,
    train_test_split,
)
from ..models import ModelName, build_model
from .emulation import CostModelText, SlowdownText

__all__ = [
    "InitialModel",
    "SiloSetup",
    "initial_model",
    "model_for",
    "silo_data",
    "test_data",
    "test_shard",
]


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
        Seed of the train/test split, the partitioning and the reshuffling (>= 0).
    model : {"lenet5", "mlp"} (default: "lenet5")
        The model, sized to the input.
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
    secret_context : str | None (default: None)
        Encrypted mode: the silos' secret CKKS context (``secret.ckks`` or its key folder,
        from ``fl-lbbsp keys generate``); a node's ``node_config["secret-context"]``
        overrides it. ``None``: plaintext updates.
    evaluate_on : {"train", "test"} (default: "train")
        Data a silo evaluates the global model on: its training partition, or its share
        (every ``num_silos``-th sample) of the held-out test split, for federated test
        accuracy when the server cannot evaluate (encrypted mode).
    emulate_wait : bool (default: True)
        A silo emulated k times slower waits ``(k - 1) * t`` after computing for ``t``;
        ``False``: it reports ``k * t`` at once (round and wall-clock times then differ).
    cost_model : str | None (default: None)
        Emulated step time ``"m,b"`` of the fastest machine
        (:class:`~fl_lbbsp.clients.emulation.CostModel`): a silo reports ``tau * k * (m *
        B + b)``, the same on a quiet or a busy machine. ``None``: measured times.
    compute_lock : str | None (default: None)
        Folder of the compute slots shared by the silos of one machine
        (:func:`~fl_lbbsp.clients.emulation.compute_slot`). ``None``: no slots.
    compute_slots : int (default: 1)
        Silos computing at the same time when ``compute_lock`` is set.
    signing_key : str | None (default: None)
        The silos' Ed25519 signing keys from ``fl-lbbsp keys silos``: a key file, or their
        folder (silo ``s`` then uses ``silo-<s>.key``); a node's
        ``node_config["signing-key"]`` overrides it. With a key every train reply is
        signed (:mod:`fl_lbbsp.security.identity`). ``None``: replies are unsigned.
    max_model_ratio : float | None (default: 10.0)
        A global model (decrypted aggregate) whose L2 norm is more than this factor
        above or below the silo's last model's, or that holds NaN or inf, is refused with
        one warning: the silo trains from its last model instead and says so in its reply
        (``model-refused`` in its ``silo`` ConfigRecord). ``None``: only NaN and inf are
        refused.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    dataset: SourceSpec = "embedded"
    partition: PartitionText = "iid"
    num_silos: int = Field(default=5, gt=0)
    seed: int = Field(default=0, ge=0)
    model: ModelName = "lenet5"
    slowdowns: tuple[SlowdownText, ...] = ()
    test_fraction: float = Field(default=0.2, gt=0, lt=1)
    torch_threads: int = Field(default=1, gt=0)
    keys: RecordKeys = RecordKeys()
    secret_context: str | None = None
    evaluate_on: Literal["train", "test"] = "train"
    emulate_wait: bool = True
    cost_model: CostModelText | None = None
    compute_lock: str | None = None
    compute_slots: int = Field(default=1, gt=0)
    signing_key: str | None = None
    max_model_ratio: float | None = Field(default=10.0, gt=1)


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


def test_shard(setup: SiloSetup, partition_id: int) -> ArrayDataset:
    """Silo ``partition_id``'s share of the held-out test set (every ``num_silos``-th)."""
    test = test_data(setup)
    return test.subset(np.arange(partition_id, len(test), setup.num_silos))


def model_for(
    name: str, data: ArrayDataset, state: Mapping[str, torch.Tensor] | None = None
) -> torch.nn.Module:
    """Model ``name`` (:func:`~fl_lbbsp.models.build_model`) sized to ``data``, with
    ``state`` loaded when given."""
    model = build_model(name, input_shape=data.input_shape, num_classes=data.num_classes)
    if state is not None:
        model.load_state_dict(state)
    return model


class InitialModel(NamedTuple):
    """A run's initial global model and the held-out test split it is evaluated on."""

    model: torch.nn.Module
    test: ArrayDataset


def initial_model(setup: SiloSetup) -> InitialModel:
    """The federation's initial global model (torch seeded with the setup's seed), sized to
    its data, and the held-out test split.

    The data source is loaded here, once per process (the split is cached for the
    silos of an in-process run).

    Raises
    ------
    DataSourceError
        A data source that cannot be read.
    """
    test = test_data(setup)
    torch.manual_seed(setup.seed)
    return InitialModel(model_for(setup.model, test), test)
