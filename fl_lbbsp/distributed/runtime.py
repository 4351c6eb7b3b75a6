"""Starting the process group of a torchrun job: the backend for the hardware, a timeout
so that a dead peer raises instead of hanging, and a store namespace of its own for each
restart attempt."""

from __future__ import annotations

import datetime
import logging
import os

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, Store, TCPStore

__all__ = ["attempt_store", "default_backend", "init_distributed"]

log = logging.getLogger("fl_lbbsp")


def default_backend() -> str:
    """``"nccl"`` when CUDA and NCCL are available, else ``"gloo"``."""
    if torch.cuda.is_available() and dist.is_nccl_available():
        return "nccl"
    return "gloo"


def attempt_store(timeout: datetime.timedelta) -> Store | None:
    """The torchrun agent's TCPStore, under a prefix of this restart attempt, or ``None``
    when the default rendezvous is safe.

    torchrun's c10d rendezvous (``--standalone`` included) hosts one TCPStore in the agent
    and hands the same one to every attempt (``TORCHELASTIC_USE_AGENT_STORE=True``); the
    process group's keys carry no attempt number, so after a restart a rank can read a
    dead peer's gloo address (or NCCL id) left by the previous attempt and connect to it:
    refused (the attempt fails and spends a restart), or accepted by a socket that now
    belongs to someone else (it hangs until the timeout). PyTorch issue #135712. With a
    single agent (``GROUP_WORLD_SIZE=1``) every worker of an attempt sees the same
    ``TORCHELASTIC_RESTART_COUNT``, so prefixing the keys with it isolates the attempts.
    With several agents the counts may differ between nodes (an agent restarted for a
    membership change does not count it): ``None``, and a warning to launch with
    ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` (a new store per attempt).

    Parameters
    ----------
    timeout : datetime.timedelta
        The store's timeout.
    """
    env = os.environ
    if env.get("TORCHELASTIC_USE_AGENT_STORE") != str(True):
        return None
    if env.get("GROUP_WORLD_SIZE", "1") != "1":
        if int(env.get("TORCHELASTIC_MAX_RESTARTS", "0")) > 0:
            log.warning(
                "torchrun shares its rendezvous store between restart attempts and this job "
                "runs on several nodes: a restarted group may read the previous attempt's "
                "addresses; launch with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (PyTorch #135712)"
            )
        return None
    store = TCPStore(
        host_name=env["MASTER_ADDR"],
        port=int(env["MASTER_PORT"]),
        world_size=int(env["WORLD_SIZE"]),
        is_master=False,
        timeout=timeout,
    )
    run = env.get("TORCHELASTIC_RUN_ID", "none")
    attempt = env.get("TORCHELASTIC_RESTART_COUNT", "0")
    return PrefixStore(f"fl_lbbsp/{run}/attempt_{attempt}", store)


def init_distributed(*, backend: str | None = None, timeout: float = 120.0) -> tuple[int, int]:
    """Initialise the default process group from torchrun's environment and return
    ``(rank, world_size)``.

    Under torchrun with one agent the group's keys go to a namespace of the restart
    attempt (:func:`attempt_store`), so that an elastic restart never reads the addresses
    of the attempt before.

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
    delta = datetime.timedelta(seconds=timeout)
    store = attempt_store(delta)
    if store is None:
        dist.init_process_group(backend=chosen, timeout=delta)
    else:
        dist.init_process_group(
            backend=chosen,
            store=store,
            rank=int(os.environ["RANK"]),
            world_size=int(os.environ["WORLD_SIZE"]),
            timeout=delta,
        )
    return dist.get_rank(), dist.get_world_size()
