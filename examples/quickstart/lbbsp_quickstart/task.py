"""Model, data and run-config helpers shared by the ServerApp and the ClientApp.

The silo's work itself is :mod:`fl_lbbsp.clients.silo_task` (run by the silo's warm
worker, or by the ClientApp process when there is none); these wrappers take a Flower
``Context``. Importing this module imports torch: the ClientApp does not.
"""

from __future__ import annotations

import torch
from flwr.app import Context

from fl_lbbsp.clients import silo_task
from fl_lbbsp.clients.app import SiloSetup
from fl_lbbsp.datasets import ArrayDataset

__all__ = ["build_model_for", "central_test_set", "local_train_set", "setup_from"]


def setup_from(context: Context, num_partitions: int) -> SiloSetup:
    """Data, partitioning and model settings of the run, for ``num_partitions`` silos."""
    return silo_task.setup_from(context.run_config, num_partitions)


def local_train_set(context: Context) -> ArrayDataset:
    """This silo's training data: partition ``partition-id`` of ``num-partitions``
    (cached as a ``.npz`` file for the next process)."""
    return silo_task.local_train_set(context.run_config, context.node_config)


def central_test_set(context: Context) -> ArrayDataset:
    """The held-out test split the server evaluates the global model on."""
    return silo_task.central_test_set(context.run_config)


def build_model_for(context: Context, data: ArrayDataset) -> torch.nn.Module:
    """The run's model, sized to ``data``."""
    return silo_task.build_model_for(context.run_config, data)
