"""The silos of a local federation: their ids and emulated slowdowns (:func:`silo_nodes`),
what each SuperNode is told in its ``--node-config`` (:func:`node_config`), and the folders
and command lines of their warm workers (:class:`WarmFolders`, :func:`worker_args`)."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ...clients.warm import SOCKET_FILE, SOCKET_PATH_MAX
from ...security.identity import check_silo_id, key_file_name

__all__ = ["SiloNode", "WarmFolders", "node_config", "silo_nodes", "worker_args"]


@dataclass(frozen=True)
class SiloNode:
    """One SuperNode of the federation: which silo it is and how slow it pretends to be."""

    silo_id: str
    partition_id: int
    slowdown: float
    port: int
    """Port of the SuperNode's own Runtime API (its ClientApps connect to it)."""
    cpu_quota: float | None = None
    """Fraction of one core its CPU group may use (``None``: no group)."""
    link_mbps: float | None = None
    """Rate of its link to the SuperLink in Mbit/s (``None``: not limited)."""


def silo_nodes(
    num_silos: int,
    slowdowns: Sequence[float] | None,
    silo_ids: Sequence[str] | None,
    *,
    cpu_quotas: Sequence[float] | None = None,
    link_mbps: Sequence[float | None] | None = None,
) -> list[SiloNode]:
    """The federation's silos, ports not chosen yet: silo i is ``silo_ids[i]`` (default
    ``silo-i``), partition i, ``slowdowns[i]`` times slower (default 1), with CPU quota
    ``cpu_quotas[i]`` and link rate ``link_mbps[i]`` (default: none).

    Raises
    ------
    ValueError
        Not one finite slowdown >= 1 and one distinct valid silo id
        (:func:`~fl_lbbsp.security.identity.check_silo_id`) per silo; a quota or rate list
        of another length, or a value not finite and positive.
    """
    quotas = _per_silo("CPU quotas", cpu_quotas, num_silos)
    links = _per_silo("link rates", link_mbps, num_silos)
    if num_silos <= 0:
        raise ValueError(f"num_silos must be positive, got {num_silos!r}")
    slowdowns = tuple(slowdowns) if slowdowns is not None else (1.0,) * num_silos
    if len(slowdowns) != num_silos:
        raise ValueError(f"{len(slowdowns)} slowdowns given for {num_silos} silos")
    if any(not (1.0 <= k < float("inf")) for k in slowdowns):
        raise ValueError(f"slowdowns must be finite and >= 1, got {list(slowdowns)}")
    ids = list(silo_ids) if silo_ids is not None else [f"silo-{i}" for i in range(num_silos)]
    for silo in ids:
        check_silo_id(silo)  # IdentityError (a ValueError): ids go into paths and logs
    if len(ids) != num_silos or len(set(ids)) != num_silos:
        raise ValueError(f"need {num_silos} distinct silo ids, got {ids}")
    return [
        SiloNode(
            silo_id=s,
            partition_id=i,
            slowdown=float(k),
            port=0,
            cpu_quota=quotas[i],
            link_mbps=links[i],
        )
        for i, (s, k) in enumerate(zip(ids, slowdowns, strict=True))
    ]


def _per_silo(
    what: str, values: Sequence[float | None] | None, num_silos: int
) -> list[float | None]:
    """One optional finite positive value per silo (``None`` for all if not given)."""
    if values is None:
        return [None] * num_silos
    if len(values) != num_silos:
        raise ValueError(f"{len(values)} {what} given for {num_silos} silos")
    for v in values:
        if v is not None and not (0 < v < float("inf")):
            raise ValueError(f"{what} must be finite and positive, got {list(values)}")
    return [None if v is None else float(v) for v in values]


def node_config(
    silo: SiloNode,
    *,
    num_silos: int,
    extra: Mapping[str, str | int | float],
    signing_keys: Path | None,
    warm_folder: Path | None,
) -> dict[str, str | int | float]:
    """A SuperNode's ``--node-config``: its ``silo-id``, ``partition-id``,
    ``num-partitions`` and emulated ``slowdown``, the ``extra`` entries, its
    ``signing-key`` in the folder ``signing_keys`` (signed replies) and its
    ``warm-worker`` folder (with a warm worker)."""
    config: dict[str, str | int | float] = {
        "silo-id": silo.silo_id,
        "partition-id": silo.partition_id,
        "num-partitions": num_silos,
        "slowdown": silo.slowdown,
        **extra,
    }
    if signing_keys is not None:
        config["signing-key"] = str(signing_keys / key_file_name(silo.silo_id))
    if warm_folder is not None:
        config["warm-worker"] = str(warm_folder)
    return config


def worker_args(folder: Path) -> list[str]:
    """Command line of a warm worker in ``folder`` (this interpreter)."""
    return [sys.executable, "-m", "fl_lbbsp.clients.warm", "--folder", str(folder)]


class WarmFolders:
    """The folders of the silos' warm workers (socket and token): ``<workdir>/warm/<id>``,
    or, when that makes a socket path too long for Unix, ``<id>`` in a short temporary
    folder (made on first use, removed by :meth:`remove`).

    Parameters
    ----------
    workdir : Path
        The federation's folder.
    silo_ids : sequence of str
        Every silo's id (the longest decides).
    """

    def __init__(self, workdir: Path, silo_ids: Sequence[str]) -> None:
        self.workdir = workdir
        self._ids = tuple(silo_ids)
        self._root: Path | None = None

    def folder(self, silo_id: str) -> Path:
        """The folder of silo ``silo_id``'s warm worker."""
        if self._root is None:
            root = self.workdir / "warm"
            longest = max(len(os.fsencode(root / s / SOCKET_FILE)) for s in self._ids)
            if longest > SOCKET_PATH_MAX:
                root = Path(tempfile.mkdtemp(prefix="lbbsp-warm-"))
            self._root = root
        return self._root / silo_id

    def remove(self) -> None:
        """Remove the temporary folder, if one was made (not the one in the workdir)."""
        root = self._root
        if root is not None and not root.is_relative_to(self.workdir):
            shutil.rmtree(root, ignore_errors=True)
