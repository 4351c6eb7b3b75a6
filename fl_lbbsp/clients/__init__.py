"""The silo side: sampler, trainer, slowdown emulation, the Flower ClientApp, an adapter
for existing train functions (:func:`lbbsp_train`), the warm silo worker
(:mod:`fl_lbbsp.clients.warm`) and the one silo round they all run (:func:`run_round`,
plain; the simulation runners wrap it with :func:`run_emulated_round`).

The names below are imported on first use (PEP 562), so that a light module of this
package (:mod:`~fl_lbbsp.clients.warm`, which Flower's per-message ClientApp process
imports) does not pull in torch through the package. A silo that does not use torch
never imports it: :func:`lbbsp_train`, :class:`LocalTraining` (its batch sampler,
``timed()``), :func:`run_round`, the emulation and :class:`ResizableBatchSampler` are
torch-free; torch is imported by :func:`train_local`, :func:`evaluate`,
:data:`TrainerConfig`/:class:`TrainResult` (their module), ``plan.loader(...)`` and the
bundled ClientApps.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .adapter import lbbsp_train
    from .emulated import Emulation, run_emulated_round
    from .emulation import (
        CostModel,
        OutOfMemoryError,
        SlowdownSchedule,
        emulate_slowdown,
        emulated_time,
    )
    from .round import (
        LocalTraining,
        RoundReport,
        WorkDone,
        machine_usage,
        misuse_of,
        run_round,
    )
    from .sampler import ResizableBatchSampler, check_batch_size
    from .trainer import TrainerConfig, TrainResult, evaluate, train_local

_WHERE = {
    "lbbsp_train": ".adapter",
    "Emulation": ".emulated",
    "run_emulated_round": ".emulated",
    "LocalTraining": ".round",
    "RoundReport": ".round",
    "WorkDone": ".round",
    "misuse_of": ".round",
    "run_round": ".round",
    "CostModel": ".emulation",
    "OutOfMemoryError": ".emulation",
    "SlowdownSchedule": ".emulation",
    "emulate_slowdown": ".emulation",
    "emulated_time": ".emulation",
    "ResizableBatchSampler": ".sampler",
    "check_batch_size": ".sampler",
    "TrainerConfig": ".trainer",
    "TrainResult": ".trainer",
    "evaluate": ".trainer",
    "machine_usage": ".round",
    "train_local": ".trainer",
}

__all__ = [
    "CostModel",
    "Emulation",
    "LocalTraining",
    "OutOfMemoryError",
    "ResizableBatchSampler",
    "RoundReport",
    "SlowdownSchedule",
    "TrainResult",
    "TrainerConfig",
    "WorkDone",
    "check_batch_size",
    "emulate_slowdown",
    "emulated_time",
    "evaluate",
    "lbbsp_train",
    "machine_usage",
    "misuse_of",
    "run_emulated_round",
    "run_round",
    "train_local",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
