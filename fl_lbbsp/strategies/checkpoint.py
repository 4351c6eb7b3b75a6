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
``keep`` files are kept.

A strategy started on a folder that holds a checkpoint of round k resumes: the global
model comes from the checkpoint (the ``initial_arrays`` given to ``start`` are ignored),
the balancer and the rest of the state are restored, and rounds k+1 .. ``num_rounds`` run
with their real numbers (config records, logs, telemetry, the returned ``Result``). A
checkpoint written by another strategy class, scheme or settings is refused with a
:class:`CheckpointError` that names every difference.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from flwr.common.serde import recorddict_from_proto, recorddict_to_proto
from flwr.proto.recorddict_pb2 import RecordDict as ProtoRecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result

__all__ = [
    "FORMAT_VERSION",
    "Checkpoint",
    "CheckpointError",
    "CheckpointInvalidError",
    "CheckpointStore",
    "check_arrays",
    "check_checkpoint_dir",
    "check_compatible",
    "resume_point",
    "save_checkpoint",
    "start_with_checkpoints",
]

log = logging.getLogger("fl_lbbsp")

FORMAT_VERSION = 1
"""Version of the checkpoint layout; a file of another version is refused."""

_MAGIC = b"FL-LBBSP-CHECKPOINT\n"
_DIGEST = hashlib.sha256().digest_size
_FILE = re.compile(r"^round-(\d+)\.ckpt$")
_ARRAYS = "arrays"
_META = "checkpoint"
_EXTRA = "state-arrays."


class Checkpointable(Protocol):
    """What a strategy offers to be checkpointed (:class:`~fl_lbbsp.strategies.LBBSPFedAvg`).

    ``round_offset`` and ``checkpoints`` are set by :func:`start_with_checkpoints` while
    Flower's loop runs: the strategy adds the offset to every round number it sees and
    writes a checkpoint to ``checkpoints`` after each training round.
    """

    server_config: Any
    telemetry: Any
    round_offset: int
    checkpoints: CheckpointStore | None

    @property
    def scheme(self) -> str:
        """The scheme's name."""

    def checkpoint_settings(self) -> dict[str, Any]:
        """Settings a checkpoint must have been written with to be resumed."""

    def checkpoint_state(self) -> tuple[dict[str, Any], dict[str, ArrayRecord]]:
        """The state between two rounds."""

    def load_checkpoint_state(self, state: Any, records: Any) -> None:
        """Restore :meth:`checkpoint_state`."""


class CheckpointError(ValueError):
    """A checkpoint that cannot be read or resumed by this strategy."""


class CheckpointInvalidError(CheckpointError):
    """A readable checkpoint whose contents fail validation (an edited file whose digest
    was recomputed, or a bug): one line naming the field, e.g.
    ``<path>: invalid field state.balancer.silos.w1.estimator.value: ...``.

    Parameters
    ----------
    message : str
        The one-line message.
    field : str
        Dotted name of the field that failed (``state.federation_size``, ...).
    """

    def __init__(self, message: str, *, field: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class Checkpoint:
    """One saved round.

    Parameters
    ----------
    server_round : int
        The last finished round.
    arrays : ArrayRecord
        The global model after that round.
    manifest : dict
        Format version, round, strategy class, scheme, settings and save time.
    state : dict
        The strategy's JSON state (balancer, silo ids, ...).
    records : dict of str to ArrayRecord (default: {})
        The strategy's array state (momentum buffers, ...).
    path : Path | None (default: None)
        The file it was read from.
    """

    server_round: int
    arrays: ArrayRecord
    manifest: dict[str, Any]
    state: dict[str, Any]
    records: dict[str, ArrayRecord] = field(default_factory=dict)
    path: Path | None = None


class CheckpointStore:
    """Checkpoint files ``round-NNNNNN.ckpt`` in one folder.

    Parameters
    ----------
    directory : str | Path
        The folder; created on the first save.
    keep : int (default: 2)
        Newest checkpoints kept; older ones are deleted after each save.
    """

    def __init__(self, directory: str | Path, *, keep: int = 2) -> None:
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise ValueError(f"keep must be a positive integer, got {keep!r}")
        self.directory = Path(directory)
        self.keep = keep

    def path(self, server_round: int) -> Path:
        """File of the checkpoint of ``server_round``."""
        return self.directory / f"round-{server_round:06d}.ckpt"

    def rounds(self) -> list[int]:
        """Rounds with a checkpoint file, oldest first."""
        if not self.directory.is_dir():
            return []
        found = (_FILE.match(p.name) for p in self.directory.iterdir())
        return sorted(int(m.group(1)) for m in found if m)

    def save(
        self,
        server_round: int,
        *,
        arrays: ArrayRecord,
        manifest: dict[str, Any],
        state: dict[str, Any],
        records: dict[str, ArrayRecord] | None = None,
    ) -> Path:
        """Write the checkpoint of ``server_round`` atomically; return its path."""
        content = RecordDict(
            {
                _ARRAYS: arrays,
                _META: ConfigRecord({"manifest": json.dumps(manifest), "state": json.dumps(state)}),
                **{_EXTRA + name: record for name, record in (records or {}).items()},
            }
        )
        payload = recorddict_to_proto(content).SerializeToString()
        self.directory.mkdir(parents=True, exist_ok=True)
        final = self.path(server_round)
        tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
        try:
            with tmp.open("wb") as f:
                f.write(_MAGIC + hashlib.sha256(payload).digest() + payload)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, final)
        finally:
            tmp.unlink(missing_ok=True)
        _sync_folder(self.directory)
        for old in self.rounds()[: -self.keep]:
            self.path(old).unlink(missing_ok=True)
        return final

    def load(self, path: str | Path) -> Checkpoint:
        """Read one checkpoint file.

        Raises
        ------
        CheckpointError
            If the file is damaged, truncated or not a checkpoint.
        """
        path = Path(path)
        data = path.read_bytes()
        head, digest = data[: len(_MAGIC)], data[len(_MAGIC) : len(_MAGIC) + _DIGEST]
        payload = data[len(_MAGIC) + _DIGEST :]
        if head != _MAGIC or hashlib.sha256(payload).digest() != digest:
            raise CheckpointError(f"{path} is damaged or not a checkpoint (digest mismatch)")
        try:
            content = recorddict_from_proto(ProtoRecordDict.FromString(payload))
            meta = content.config_records[_META]
            manifest = json.loads(str(meta["manifest"]))
            state = json.loads(str(meta["state"]))
            arrays = content.array_records[_ARRAYS]
        except Exception as err:  # noqa: BLE001 - any decoding failure means unreadable
            raise CheckpointError(f"{path} is not a readable checkpoint: {err}") from err
        from .checkpoint_schema import validate_checkpoint

        if not isinstance(manifest, dict) or not isinstance(state, dict):
            raise CheckpointInvalidError(
                f"{path}: invalid field {'manifest' if not isinstance(manifest, dict) else 'state'}"
                ": not a JSON object",
                field="manifest" if not isinstance(manifest, dict) else "state",
            )
        validate_checkpoint(manifest, state, where=str(path))
        server_round = int(manifest["round"])
        records = {
            name.removeprefix(_EXTRA): record
            for name, record in content.array_records.items()
            if name.startswith(_EXTRA)
        }
        return Checkpoint(server_round, arrays, manifest, state, records, path)

    def latest(self) -> Checkpoint | None:
        """The newest readable checkpoint (a damaged newer file is skipped with a
        warning), or ``None`` when the folder holds none.

        Raises
        ------
        CheckpointError
            If the folder holds checkpoint files but none is readable.
        """
        rounds = self.rounds()
        for server_round in reversed(rounds):
            path = self.path(server_round)
            try:
                return self.load(path)
            except CheckpointInvalidError:
                raise  # readable but edited: refused, never skipped for an older one
            except (CheckpointError, OSError) as err:
                log.warning("skipping checkpoint %s: %s", path, err)
        if rounds:
            raise CheckpointError(
                f"no readable checkpoint in {self.directory} ({len(rounds)} damaged files): "
                "remove them to start afresh"
            )
        return None


def _sync_folder(directory: Path) -> None:
    """Persist a rename on POSIX file systems (best effort elsewhere)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


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


def check_checkpoint_dir(given: Path, directory: Path) -> None:
    """Refuse, before any round, a checkpoint folder that cannot be written.

    Parameters
    ----------
    given : Path
        The folder the user named (``--checkpoint-dir``); it must be a directory or not
        exist yet.
    directory : Path
        The run's own folder under it, created here, where one file is written and
        removed as a probe.

    Raises
    ------
    CheckpointError
        ``given`` is not a directory, or ``directory`` cannot be created or written.
    """
    if given.exists() and not given.is_dir():
        raise CheckpointError(f"{given} is not a directory")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / f".probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise CheckpointError(f"{directory} is not a writable directory ({err.strerror})") from None


def resume_point(strategy: Checkpointable, *, max_silos: int | None = None) -> Checkpoint | None:
    """The checkpoint ``strategy.start`` would resume from (``None``: a fresh start).

    Parameters
    ----------
    strategy : Checkpointable
        The strategy; its ``server_config.checkpoint_dir`` is searched.
    max_silos : int | None (default: None)
        The configured federation size (a registry, a deployment's silos): a checkpoint
        that knows more silos or a larger federation is refused. ``None``: the silos
        the checkpoint has seen bound its federation size (always checked on load).

    Raises
    ------
    CheckpointError
        If the newest readable checkpoint belongs to another strategy or settings, or
        none of the checkpoint files is readable.
    CheckpointInvalidError
        If the newest readable checkpoint's contents fail validation.
    """
    directory = strategy.server_config.checkpoint_dir
    checkpoint = None if directory is None else CheckpointStore(directory).latest()
    if checkpoint is not None:
        if max_silos is not None:
            from .checkpoint_schema import validate_checkpoint

            validate_checkpoint(
                checkpoint.manifest,
                checkpoint.state,
                where=str(checkpoint.path),
                max_silos=max_silos,
            )
        check_compatible(checkpoint, strategy)
    return checkpoint


def check_arrays(checkpoint: Checkpoint, initial_arrays: ArrayRecord) -> None:
    """Refuse a checkpoint whose model has the initial model's names but other shapes.

    A model of other names (an encrypted model, whose records hold ciphertexts) is not
    compared.

    Raises
    ------
    CheckpointInvalidError
        Naming the first array whose shape differs.
    """
    if set(checkpoint.arrays) != set(initial_arrays):
        return
    for name, array in checkpoint.arrays.items():
        found, expected = tuple(array.shape), tuple(initial_arrays[name].shape)
        if found != expected:
            raise CheckpointInvalidError(
                f"{checkpoint.path}: invalid field arrays.{name}: shape {list(found)}, "
                f"the model's is {list(expected)}",
                field=f"arrays.{name}",
            )


def start_with_checkpoints(
    strategy: Checkpointable,
    start: Callable[..., Result],
    *,
    grid: Grid,
    initial_arrays: ArrayRecord,
    num_rounds: int,
    timeout: float,
    train_config: ConfigRecord | None,
    evaluate_config: ConfigRecord | None,
    evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None,
) -> Result:
    """Run Flower's round loop ``start`` for ``strategy``, resuming from and writing to
    ``strategy.server_config.checkpoint_dir``.

    Flower's loop counts from 1; on a resume from round k it runs ``num_rounds - k``
    rounds and every round number the strategy, ``evaluate_fn`` and the returned
    ``Result`` see is shifted by k (Flower's own "[ROUND i/n]" log lines still count
    from 1). ``evaluate_fn`` first evaluates the checkpoint's model as round k.
    """
    directory = strategy.server_config.checkpoint_dir
    if directory is None:
        raise ValueError("the strategy has no checkpoint_dir")
    store = CheckpointStore(directory)
    checkpoint = resume_point(strategy)
    done = 0
    if checkpoint is not None:
        check_arrays(checkpoint, initial_arrays)
        strategy.load_checkpoint_state(checkpoint.state, checkpoint.records)
        done = checkpoint.server_round
        initial_arrays = checkpoint.arrays
        dropped = strategy.telemetry.drop_rounds_after(done)
        log.info(
            "[%s] resuming from %s: round %d of %d done; the initial arrays passed to start "
            "are ignored%s",
            strategy.scheme,
            checkpoint.path,
            done,
            num_rounds,
            f"; {dropped} telemetry events of later rounds removed" if dropped else "",
        )
        if done >= num_rounds:
            return Result(arrays=checkpoint.arrays)
    strategy.round_offset, strategy.checkpoints = done, store
    try:
        result = start(
            grid=grid,
            initial_arrays=initial_arrays,
            num_rounds=num_rounds - done,
            timeout=timeout,
            train_config=train_config,
            evaluate_config=evaluate_config,
            evaluate_fn=None if evaluate_fn is None else _shift_fn(evaluate_fn, done),
        )
    finally:
        strategy.round_offset, strategy.checkpoints = 0, None
    return Result(
        arrays=result.arrays,
        train_metrics_clientapp=_shift_keys(result.train_metrics_clientapp, done),
        evaluate_metrics_clientapp=_shift_keys(result.evaluate_metrics_clientapp, done),
        evaluate_metrics_serverapp=_shift_keys(result.evaluate_metrics_serverapp, done),
    )


def _shift_fn(
    fn: Callable[[int, ArrayRecord], MetricRecord | None], offset: int
) -> Callable[[int, ArrayRecord], MetricRecord | None]:
    return lambda server_round, arrays: fn(server_round + offset, arrays)


def _shift_keys(metrics: dict[int, MetricRecord], offset: int) -> dict[int, MetricRecord]:
    return {server_round + offset: record for server_round, record in metrics.items()}
