"""The silo side: sampler, trainer, slowdown emulation and the Flower ClientApp."""

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
    "OutOfMemoryError",
    "ResizableBatchSampler",
    "SlowdownSchedule",
    "TrainResult",
    "TrainerConfig",
    "check_batch_size",
    "emulate_slowdown",
    "emulated_time",
    "evaluate",
    "machine_usage",
    "train_local",
]
