"""Checkpoints of the Message-API LB-BSP strategies, and resuming from them.

With ``checkpoint_dir`` set, :meth:`LBBSPFedAvg.start <fl_lbbsp.strategies.LBBSPFedAvg.start>`
writes one file per round as soon as the round's training is aggregated: the global
ArrayRecord (encrypted or not), the balancer's state (every silo's speed estimator, cost
history, memory cap and the iterative allocator), the node -> silo ids, the measured
messaging overhead, the strategy's own state (the parameter server's momentum buffers,
the encrypted strategy's per-silo dataset sizes) and a manifest (format version, round,
strategy class, scheme and the settings that decide batch sizes and updates). The file is
Flower's protobuf of a RecordDict behind a SHA-256 digest, written to a temporary file
and renamed into place, so a crash never leaves a half-written checkpoint; the newest
``keep`` files are kept. With a checkpoint key (``checkpoint_key``, ``fl-lbbsp
--checkpoint-key FILE``, made by ``fl-lbbsp keys checkpoint``) the digest is an
HMAC-SHA256 under that key instead, so an edited file is detected, not only a damaged one;
a store with a key refuses files without one, and a store without a key files with one.

A strategy started on a folder that holds a checkpoint of round k resumes: the global
model comes from the checkpoint (the ``initial_arrays`` given to ``start`` are ignored),
the balancer and the rest of the state are restored, and rounds k+1 .. ``num_rounds`` run
with their real numbers (config records, logs, telemetry, the returned ``Result``); the
wrapper strategy :class:`~fl_lbbsp.strategies.checkpointing.Checkpointing` does it. A
checkpoint written by another strategy class, scheme or settings is refused with a
:class:`CheckpointError` that names every difference. Nothing in a checkpoint is obeyed
before it passes :func:`~fl_lbbsp.strategies.checkpoint_schema.validate_checkpoint`
(every field, the strategy's bounds, a trial of the balancer) and :func:`check_arrays`
(the model of the strategy's layout, finite, not far larger than the initial model); a
state that still cannot be restored is refused as a :class:`CheckpointInvalidError`.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from flwr.app import ArrayRecord

from .checkpoint_file import (
    Checkpoint,
    CheckpointKeyError,
    CheckpointStore,
    load_checkpoint_key,
    write_checkpoint_key,
)
from .checkpoint_model import MAX_MODEL_GROWTH, check_arrays
from .checkpoint_run import RUN_FILE, RunRecord
from .checkpoint_schema import (
    CheckpointError,
    CheckpointInvalidError,
    CheckpointLimits,
    validate_checkpoint,
)

__all__ = [
    "FORMAT_VERSION",
    "MAX_MODEL_GROWTH",
    "RUN_FILE",
    "Checkpoint",
    "CheckpointError",
    "CheckpointInvalidError",
    "CheckpointKeyError",
    "CheckpointStore",
    "ResumePoint",
    "RunRecord",
    "check_arrays",
    "check_compatible",
    "limits_of",
    "load_checkpoint_key",
    "restore",
    "resume_from",
    "resume_point",
    "save_checkpoint",
    "store_of",
    "write_checkpoint_key",
]

log = logging.getLogger("fl_lbbsp")

FORMAT_VERSION = 1
"""Version of the checkpoint layout; a file of another version is refused."""


class Checkpointable(Protocol):
    """What a strategy offers to be checkpointed (:class:`~fl_lbbsp.strategies.LBBSPFedAvg`)."""

    server_config: Any
    telemetry: Any

    @property
    def scheme(self) -> str:
        """The scheme's name."""

    def checkpoint_settings(self) -> dict[str, Any]:
        """Settings a checkpoint must have been written with to be resumed."""

    def checkpoint_state(self) -> tuple[dict[str, Any], dict[str, ArrayRecord]]:
        """The state between two rounds."""

    def load_checkpoint_state(self, state: Any, records: Any) -> None:
        """Restore :meth:`checkpoint_state`."""


# ------------------------------------------------------------------ strategy side
def _manifest(strategy: Checkpointable) -> dict[str, Any]:
    return {
        "format": FORMAT_VERSION,
        "strategy": type(strategy).__name__,
        "scheme": strategy.scheme,
        "settings": strategy.checkpoint_settings(),
    }


def save_checkpoint(
    store: CheckpointStore, strategy: Checkpointable, server_round: int, arrays: ArrayRecord
) -> Path:
    """Write ``strategy``'s checkpoint of ``server_round`` with global model ``arrays``."""
    state, records = strategy.checkpoint_state()
    manifest = {**_manifest(strategy), "round": server_round, "saved_at": time.time()}
    return store.save(server_round, arrays=arrays, manifest=manifest, state=state, records=records)


def _flat(manifest: dict[str, Any]) -> dict[str, Any]:
    """Strategy, scheme and every setting as one flat mapping (JSON values)."""
    flat = {"format": manifest.get("format"), "strategy": manifest.get("strategy")}
    flat["scheme"] = manifest.get("scheme")
    for group, value in dict(manifest.get("settings") or {}).items():
        flat.update(value if isinstance(value, dict) else {group: value})
    return json.loads(json.dumps(flat))  # type: ignore[no-any-return]


def check_compatible(checkpoint: Checkpoint, strategy: Checkpointable) -> None:
    """Raise :class:`CheckpointError` unless ``strategy`` can resume ``checkpoint``:
    same format version, strategy class, scheme and settings. A setting newer than the
    checkpoint (absent from its manifest) is not compared: the run resumes with the
    strategy's value of it."""
    found, expected = _flat(checkpoint.manifest), _flat(_manifest(strategy))
    newer = [name for name in expected if name not in found]
    if newer:
        log.info(
            "checkpoint %s predates the settings %s: resumed with this strategy's values",
            checkpoint.path,
            ", ".join(newer),
        )
    differences = [
        f"{name}={found.get(name)!r} (this strategy: {expected.get(name)!r})"
        for name in dict.fromkeys([*expected, *found])
        if name in found and found.get(name) != expected.get(name)
    ]
    if differences:
        raise CheckpointError(
            f"checkpoint {checkpoint.path} was written with {'; '.join(differences)}: resume "
            "with the same strategy and settings, or use another checkpoint_dir"
        )


def limits_of(strategy: Checkpointable, *, max_silos: int | None = None) -> CheckpointLimits:
    """The bounds ``strategy`` puts on a checkpoint it resumes (see
    :class:`~fl_lbbsp.strategies.checkpoint_schema.CheckpointLimits`): its
    ``max_dataset_size``, ``deadline_ceiling`` and twice its ``max_claimed_time``, as far
    as it has them, and ``max_silos``."""
    config = getattr(strategy, "config", None)
    max_time = getattr(config, "max_claimed_time", None)
    size = getattr(config, "max_dataset_size", None)
    ceiling = getattr(strategy.server_config, "deadline_ceiling", None)
    return CheckpointLimits(
        max_silos=max_silos,
        max_dataset_size=size if isinstance(size, int) else None,
        max_overhead=float(ceiling) if isinstance(ceiling, int | float) else None,
        max_seconds=2.0 * float(max_time) if isinstance(max_time, int | float) else None,
    )


def store_of(strategy: Checkpointable) -> CheckpointStore | None:
    """The strategy's checkpoint folder (``server_config.checkpoint_dir``), with its
    checkpoint key if it has one; ``None``: the strategy has no checkpoint folder.

    Raises
    ------
    CheckpointKeyError
        The checkpoint key file cannot be used.
    """
    server = strategy.server_config
    directory = server.checkpoint_dir
    if directory is None:
        return None
    key_file = getattr(server, "checkpoint_key", None)
    key = None if key_file is None else load_checkpoint_key(key_file)
    return CheckpointStore(directory, key=key)


def _encrypted(strategy: Checkpointable) -> bool:
    """Whether the strategy's model is encrypted (its settings carry a key fingerprint)."""
    return "fingerprint" in _flat(_manifest(strategy))


def resume_point(
    strategy: Checkpointable,
    *,
    store: CheckpointStore | None = None,
    max_silos: int | None = None,
    initial_arrays: ArrayRecord | None = None,
) -> Checkpoint | None:
    """The checkpoint ``strategy.start`` would resume from (``None``: a fresh start).

    Parameters
    ----------
    strategy : Checkpointable
        The strategy.
    store : CheckpointStore | None (default: None)
        Where to search; ``None``: the strategy's ``server_config.checkpoint_dir`` (with
        its ``checkpoint_key``, if any, :func:`store_of`).
    max_silos : int | None (default: None)
        The configured federation size (a registry, a deployment's silos): a checkpoint
        that knows more silos or a larger federation is refused. ``None``: the silos
        the checkpoint has seen bound its federation size (always checked on load).
    initial_arrays : ArrayRecord | None (default: None)
        The model the strategy would start from: the checkpoint's model must have its
        layout (:func:`check_arrays`). ``None``: not checked here (``start`` checks it).

    Raises
    ------
    CheckpointError
        If the newest readable checkpoint belongs to another strategy or settings, none
        of the checkpoint files is readable, or the checkpoint key cannot be used.
    CheckpointInvalidError
        If the newest readable checkpoint's contents fail validation against the
        strategy's bounds (:func:`limits_of`) or its model is not the strategy's.
    """
    limits = limits_of(strategy, max_silos=max_silos)
    encrypted = _encrypted(strategy)
    store = store if store is not None else store_of(strategy)
    checkpoint = None if store is None else store.latest()
    if checkpoint is not None:
        validate_checkpoint(
            checkpoint.manifest, checkpoint.state, where=str(checkpoint.path), limits=limits
        )
        check_compatible(checkpoint, strategy)
        if initial_arrays is not None:
            check_arrays(checkpoint, initial_arrays, encrypted=encrypted)
    return checkpoint


def restore(strategy: Checkpointable, checkpoint: Checkpoint) -> None:
    """Restore ``checkpoint``'s state into ``strategy``; a state the strategy cannot take
    (state the validation does not know, from a newer strategy) is refused.

    Raises
    ------
    CheckpointInvalidError
        Naming the exception the strategy raised (field ``state``).
    """
    try:
        strategy.load_checkpoint_state(checkpoint.state, checkpoint.records)
    except Exception as err:  # noqa: BLE001 - whatever the strategy cannot restore is refused
        raise CheckpointInvalidError.caught(
            err, where=str(checkpoint.path), field="state", what="the strategy cannot restore it"
        ) from None


@dataclass(frozen=True)
class ResumePoint:
    """A checkpoint validated for a strategy and restored into it: where its run resumes
    (:func:`resume_from`), with the store it was read from and the rest are written to.

    Attributes
    ----------
    checkpoint : Checkpoint
        The checkpoint: its round is the last one done, its model the next start's.
    store : CheckpointStore
        The checkpoint folder (with its key, if any).
    """

    checkpoint: Checkpoint
    store: CheckpointStore


def resume_from(
    strategy: Checkpointable,
    *,
    store: CheckpointStore | None = None,
    run: RunRecord | None = None,
    max_silos: int | None = None,
    initial_arrays: ArrayRecord | None = None,
) -> ResumePoint | None:
    """The newest checkpoint in ``store``, validated (:func:`resume_point`) and restored
    into ``strategy`` (:func:`restore`); ``None``: a fresh start (no checkpoint there).
    ``store=None``: the strategy's own checkpoint folder (:func:`store_of`), if any.

    With ``run`` (a runner's run, :class:`~fl_lbbsp.strategies.checkpoint_run.RunRecord`)
    the checkpoints must be that run's: a folder with checkpoints must record the same
    settings (checked first), a resumed run keeps the telemetry of its earlier rounds
    (copied from the recorded run's output folder when it moved), and the record is
    written when the run starts afresh or the folder had none.

    Raises
    ------
    CheckpointError
        As :func:`resume_point`; with ``run``: a recorded run of other settings, an
        unreadable record, or a resume without the telemetry of its earlier rounds.
    CheckpointInvalidError
        As :func:`resume_point` and :func:`restore`.
    """
    store = store if store is not None else store_of(strategy)
    if store is None or not store.rounds():
        if run is not None:
            run.write()
        return None
    earlier = None if run is None else run.check_same()
    checkpoint = resume_point(
        strategy, store=store, max_silos=max_silos, initial_arrays=initial_arrays
    )
    if checkpoint is None:
        return None
    restore(strategy, checkpoint)
    if run is not None:
        run.keep(earlier, after_round=checkpoint.server_round)
    return ResumePoint(checkpoint, store)
