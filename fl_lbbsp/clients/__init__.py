"""The silo side: sampler, trainer, slowdown emulation, the Flower ClientApp and an adapter
for existing train functions (:func:`lbbsp_train`)."""

from .adapter import LocalTraining, lbbsp_train
from .emulation import (
    CostModel,
    OutOfMemoryError,
    SlowdownSchedule,
    emulate_slowdown,
    emulated_time,
)
from .sampler import ResizableBatchSampler, check_batch_size
from .trainer import TrainerConfig, TrainResult, evaluate, machine_usage, train_local

__all__ = [
    "CostModel",
    "LocalTraining",
    "OutOfMemoryError",
    "ResizableBatchSampler",
    "SlowdownSchedule",
    "TrainResult",
    "TrainerConfig",
    "check_batch_size",
    "emulate_slowdown",
    "emulated_time",
    "evaluate",
    "lbbsp_train",
    "machine_usage",
    "train_local",
]
