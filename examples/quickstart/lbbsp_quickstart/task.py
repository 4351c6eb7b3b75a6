"""Model, data and run-config helpers shared by the ServerApp and the ClientApp."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import numpy as np
from flwr.app import Context

from fl_lbbsp.clients.app import SiloSetup, silo_data, test_data
from fl_lbbsp.datasets import ArrayDataset
from fl_lbbsp.models import build_model

__all__ = ["build_model_for", "central_test_set", "local_train_set", "setup_from"]


def setup_from(context: Context, num_partitions: int) -> SiloSetup:
    """Data, partitioning and model settings of the run, for ``num_partitions`` silos."""
    config = context.run_config
    return SiloSetup(
        dataset=str(config["dataset"]),
        partition=str(config["partition"]),
        num_silos=num_partitions,
        seed=int(config["seed"]),
        model=str(config["model"]),
    )


def local_train_set(context: Context) -> ArrayDataset:
    """This silo's training data: partition ``partition-id`` of ``num-partitions``.

    In a deployment Flower starts a new ClientApp process for every message, so the
    partition is cached as a ``.npz`` file: later rounds skip loading and partitioning
    the source (scikit-learn, flwr-datasets), which takes seconds per process.
    """
    partition_id = int(context.node_config["partition-id"])
    num_partitions = int(context.node_config["num-partitions"])
    setup = setup_from(context, num_partitions)
    key = f"{setup.dataset}|{setup.partition}|{num_partitions}|{setup.seed}|{partition_id}"
    cache = (
        Path(tempfile.gettempdir())
        / "lbbsp-quickstart"
        / (hashlib.sha256(key.encode()).hexdigest()[:24] + ".npz")
    )
    if cache.exists():
        with np.load(cache) as saved:
            x, y, num_classes = saved["x"], saved["y"], int(saved["num_classes"])
        return ArrayDataset(x=x, y=y, num_classes=num_classes, name=setup.dataset)
    data = silo_data(setup, partition_id)
    cache.parent.mkdir(parents=True, exist_ok=True)
    partial = cache.with_suffix(f".{os.getpid()}.npz")
    np.savez(partial, x=data.x, y=data.y, num_classes=data.num_classes)
    os.replace(partial, cache)  # atomic: concurrent processes never read half a file
    return data


def central_test_set(context: Context) -> ArrayDataset:
    """The held-out test split the server evaluates the global model on."""
    return test_data(setup_from(context, 1))


def build_model_for(context: Context, data: ArrayDataset):  # type: ignore[no-untyped-def]
    """The run's model, sized to ``data``."""
    return build_model(
        str(context.run_config["model"]),
        input_shape=data.input_shape,
        num_classes=data.num_classes,
    )
