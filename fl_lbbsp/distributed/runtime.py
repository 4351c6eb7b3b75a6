"""Starting the process group of a torchrun job: the backend for the hardware, a timeout
so that a dead peer raises instead of hanging."""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist

__all__ = ["default_backend", "init_distributed"]


def default_backend() -> str:
    """``"nccl"`` when CUDA and NCCL are available, else ``"gloo"``."""
    if torch.cuda.is_available() and dist.is_nccl_available():
        return "nccl"
    return "gloo"


def init_distributed(*, backend: str | None = None, timeout: float = 120.0) -> tuple[int, int]:
    """Initialise the default process group from torchrun's environment and return
    ``(rank, world_size)``.

    Parameters
    ----------
    backend : str | None (default: None)
        ``"gloo"`` or ``"nccl"``; ``None``: :func:`default_backend`. Under NCCL the
        current CUDA device is set to ``LOCAL_RANK``.
    timeout : float (default: 120.0)
        Seconds a collective may wait for a peer before failing (a dead rank then
        raises instead of hanging).
    """
    if not timeout > 0:
        raise ValueError(f"timeout must be positive, got {timeout!r}")
    chosen = default_backend() if backend is None else backend
    if chosen not in ("gloo", "nccl"):
        raise ValueError(f"unknown backend {chosen!r}; expected 'gloo' or 'nccl'")
    if chosen == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend=chosen, timeout=datetime.timedelta(seconds=timeout))
    return dist.get_rank(), dist.get_world_size()
