"""Checkpoints of the Message-API LB-BSP strategies, and resuming from them.

With ``checkpoint_dir`` set, :meth:`LBBSPFedAvg.start <fl_lbbsp.strategies.LBBSPFedAvg.start>`
writes one file per round once its training is aggregated: a :class:`Manifest` (format,
round, strategy class, scheme, the settings that decide batch sizes and updates) and each
part's state as its own model dumps it (:class:`StrategyState`: the round engine's
:class:`~fl_lbbsp.core.round.engine.EngineState`, which holds the balancer's, the claims'
and the memory caps'; the updates'), with the global model and the parts' array records,
as a JSON header and the arrays' bytes behind a SHA-256 digest or, with a checkpoint key
(``fl-lbbsp keys checkpoint``), an HMAC-SHA256 that detects an edit, not only damage.
Nothing in it is obeyed before the parts' models validate it (``model_validate``), with
the strategy's bounds, a trial of the balancer and :func:`check_arrays`.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
import math
import os
import re
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np
from flwr.app import Array, ArrayRecord
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..contract import is_encrypted
from ..core.balancer import BatchSizeBalancer
from ..core.balancer_state import MAX_BATCH_SIZE
from ..core.round.engine import EngineState
from ..core.settings import BalancingConfig
from ..security.identity import IdentityError, check_private_file, write_file

if TYPE_CHECKING:
    from .fedavg import LBBSPFedAvg

__all__ = [  # noqa: RUF022 - by kind: errors, the file, the strategy's side
    "CheckpointError", "CheckpointInvalidError", "CheckpointKeyError",
    "Checkpoint", "CheckpointLimits", "CheckpointStore", "Manifest", "StrategyState",
    "ResumePoint", "RunLog", "check_arrays", "check_compatible", "limits_of",
    "load_checkpoint_key", "restore", "resume_from", "resume_point", "save_checkpoint",
    "store_of", "validate_checkpoint", "write_checkpoint_key",
]  # fmt: skip

log = logging.getLogger("fl_lbbsp")

FORMAT_VERSION = 2
"""Version of the checkpoint layout; a file of another version is refused."""
MAX_MODEL_GROWTH = 1000.0
"""Largest ratio of a checkpoint model's L2 norm to the initial model's (or to 1)."""
MIN_KEY_BYTES = 32
"""Shortest checkpoint key accepted (``fl-lbbsp keys checkpoint`` writes 256 random bits)."""

_MAGIC = b"FL-LBBSP-CHECKPOINT-2\n"
_MAGIC_KEYED = b"FL-LBBSP-CHECKPOINT-2-HMAC-SHA256\n"
_OLD_MAGIC = b"FL-LBBSP-CHECKPOINT"
_DIGEST = hashlib.sha256().digest_size
_FILE = re.compile(r"^round-(\d+)\.ckpt$")
_MODEL = "arrays"


class CheckpointError(ValueError):
    """A checkpoint (or its run's record) that this strategy cannot read or resume."""


class CheckpointInvalidError(CheckpointError):
    """A readable checkpoint refused: one line naming the field (``field``, dotted), e.g.
    ``<path>: invalid field state.engine.balancer.silos.w1.estimator.value: ...``."""

    def __init__(self, message: str, *, field: str) -> None:
        super().__init__(message)
        self.field = field

    @classmethod
    def caught(cls, err: Exception, *, where: str, field: str, what: str) -> CheckpointInvalidError:
        """The refusal of ``field`` for the exception ``err`` its use raised, on one line
        of at most 300 characters of the exception."""
        message = " ".join(f"{type(err).__name__}: {err}".split())[:300]
        return cls(f"{where}: invalid field {field}: {what} ({message})", field=field)


class CheckpointKeyError(CheckpointInvalidError):
    """A file refused for its key: an HMAC that does not match the checkpoint key, a
    keyed file read without the key, or a file without one read with a key. Never
    skipped for an older checkpoint."""

    def __init__(self, message: str) -> None:
        super().__init__(message, field="hmac")


def load_checkpoint_key(path: str | Path) -> bytes:
    """The checkpoint key in ``path`` (its bytes, surrounding whitespace removed).

    Raises
    ------
    CheckpointError
        The file is accessible by group or others, cannot be read, or holds fewer than
        :data:`MIN_KEY_BYTES` bytes.
    """
    try:
        check_private_file(path)
        key = Path(path).read_bytes().strip()
    except IdentityError as err:
        raise CheckpointError(f"checkpoint key {err}") from None
    except OSError as err:
        raise CheckpointError(f"checkpoint key {path} cannot be read ({err.strerror})") from None
    if len(key) < MIN_KEY_BYTES:
        raise CheckpointError(
            f"checkpoint key {path} holds {len(key)} bytes, fewer than {MIN_KEY_BYTES}: "
            "write one with `fl-lbbsp keys checkpoint --out FILE`"
        )
    return key


def write_checkpoint_key(path: str | Path, *, overwrite: bool = False) -> Path:
    """Write a new checkpoint key (64 random hex characters) to ``path``, mode 0600.

    Raises
    ------
    FileExistsError
        ``path`` exists and ``overwrite`` is false.
    """
    target = Path(path)
    if target.exists() and not overwrite:
        raise FileExistsError(f"{target} exists; not replacing a checkpoint key without overwrite")
    write_file(target, (secrets.token_hex(32) + "\n").encode(), mode=0o600)
    return target


class Manifest(BaseModel):
    """What a checkpoint is of: its format, last finished round, the strategy class and
    scheme that wrote it, and the settings groups that decide its rounds (``balancing``
    is validated as a :class:`~fl_lbbsp.core.settings.BalancingConfig`)."""

    model_config = ConfigDict(extra="forbid")

    format: Literal[2]
    round: int = Field(ge=1, le=10_000_000, strict=True)
    strategy: str = Field(max_length=200)
    scheme: str = Field(max_length=200)
    settings: dict[str, Any] = Field(default_factory=dict)
    saved_at: float = 0.0

    @field_validator("settings")
    @classmethod
    def _balancing(cls, value: dict[str, Any]) -> dict[str, Any]:
        if "balancing" in value:
            BalancingConfig.model_validate(value["balancing"])
        return value


class StrategyState(BaseModel):
    """A strategy's state: each part's, as its state model dumps it (the updates'
    JSON state is checked by their own ``load_state_dict``)."""

    model_config = ConfigDict(extra="forbid")

    engine: EngineState
    updates: dict[str, Any] = Field(default_factory=dict)


@dataclass(frozen=True)
class CheckpointLimits:
    """The resuming strategy's bounds on a checkpoint (``None``: not bounded): the
    configured federation size, and its largest pinned dataset size."""

    max_silos: int | None = None
    max_dataset_size: int | None = None


def _invalid(where: str, field: str, reason: str) -> CheckpointInvalidError:
    return CheckpointInvalidError(f"{where}: invalid field {field}: {reason}", field=field)


def _refuse(where: str, err: ValidationError, prefix: str) -> CheckpointInvalidError:
    first = err.errors()[0]
    loc = [str(part)[:40] for part in first.get("loc", ())]
    msg = str(first.get("msg", "invalid")).removeprefix("Value error, ")[:300]
    named = re.match(r"([a-z]+_[a-z_]+|[a-z_]+\.[\w.-]+)(?=[= ])", msg)
    if named:  # a model-level check names its field first in the message
        loc.append(named.group(1))
    name = ".".join([prefix, *loc])
    more = f" (and {err.error_count() - 1} more)" if err.error_count() > 1 else ""
    return CheckpointInvalidError(
        " ".join(f"{where}: invalid field {name}: {msg}{more}".split()), field=name
    )


def validate_checkpoint(
    manifest: Mapping[str, Any],
    state: Mapping[str, Any],
    *,
    where: str = "checkpoint",
    limits: CheckpointLimits | None = None,
) -> StrategyState:
    """The checkpoint's state, validated (:class:`Manifest`, :class:`StrategyState`, the
    strategy's ``limits``, one trial allocation of the balancer it holds).

    Raises
    ------
    CheckpointInvalidError
        One line: ``<where>: invalid field <dotted.name>: <reason>``.
    """
    try:
        Manifest.model_validate(dict(manifest))
    except ValidationError as err:
        raise _refuse(where, err, "manifest") from None
    try:
        parsed = StrategyState.model_validate(dict(state))
    except ValidationError as err:
        raise _refuse(where, err, "state") from None
    engine, limits = parsed.engine, limits or CheckpointLimits()
    over: list[tuple[str, float, float]] = []
    if limits.max_silos is not None:
        over += [("federation_size", engine.federation_size, limits.max_silos)]
        over += [("silos", len(engine.silos), limits.max_silos)]
    if limits.max_dataset_size is not None:
        pinned = engine.claims.sizes.items()
        over += [(f"claims.sizes.{s}", n, limits.max_dataset_size) for s, n in pinned]
    for name, value, limit in over:
        if value > limit:
            raise CheckpointInvalidError(
                f"{where}: invalid field state.engine.{name}: {value:g} is over this "
                f"strategy's {limit:g}",
                field=f"state.engine.{name}",
            )
    try:  # a state the types admit that the balancer cannot use
        trial = BatchSizeBalancer.from_state_dict(
            engine.balancer.model_dump(mode="json", exclude_unset=True)
        )
        sizes = trial.allocate(trial.silo_ids)
        if any(not 1 <= x <= MAX_BATCH_SIZE for x in sizes.values()):
            raise ValueError(f"it allocates batch sizes out of range: {sizes}"[:200])
    except Exception as err:  # noqa: BLE001 - whatever the balancer cannot use is refused
        raise CheckpointInvalidError.caught(
            err, where=where, field="state.engine.balancer", what="the balancer cannot use it"
        ) from None
    return parsed


@dataclass(frozen=True)
class Checkpoint:
    """One saved round: its round, model, manifest, JSON state and array records (the
    parts' array state), and the file it was read from."""

    server_round: int
    arrays: ArrayRecord
    manifest: dict[str, Any]
    state: dict[str, Any]
    records: dict[str, ArrayRecord] = field(default_factory=dict)
    path: Path | None = None


def _encode(header: dict[str, Any], records: Mapping[str, ArrayRecord]) -> bytes:
    """A JSON header (with every array's dtype, shape, stype and size) and the arrays'
    bytes, in order: the arrays travel as Flower's public ``Array`` fields hold them."""
    blobs, index = [], {}
    for name, record in records.items():
        index[name] = [[k, a.dtype, list(a.shape), a.stype, len(a.data)] for k, a in record.items()]
        blobs += [a.data for a in record.values()]
    head = json.dumps({**header, "records": index}).encode()
    return len(head).to_bytes(8, "big") + head + b"".join(blobs)


def _decode(payload: bytes) -> tuple[dict[str, Any], dict[str, ArrayRecord]]:
    size = int.from_bytes(payload[:8], "big")
    header = json.loads(payload[8 : 8 + size])
    offset, records = 8 + size, {}
    for name, arrays in header.pop("records").items():
        record = ArrayRecord()
        for key, dtype, shape, stype, length in arrays:
            data = payload[offset : offset + length]
            if len(data) != length:
                raise ValueError("truncated")
            record[key] = Array(dtype=dtype, shape=tuple(shape), stype=stype, data=data)
            offset += length
        records[name] = record
    if offset != len(payload):
        raise ValueError(f"{len(payload) - offset} bytes after the last array")
    return header, records


class CheckpointStore:
    """Checkpoint files ``round-NNNNNN.ckpt`` in one folder.

    Parameters
    ----------
    directory : str | Path
        The folder; created on the first save.
    keep : int (default: 2)
        Newest checkpoints kept; older ones are deleted after each save.
    key : bytes | None (default: None)
        Checkpoint key (:func:`load_checkpoint_key`): files are written with an
        HMAC-SHA256 under it, and only such files whose HMAC matches are read. ``None``:
        a SHA-256 digest (damage is detected, edits are not); keyed files are refused.
    """

    def __init__(self, directory: str | Path, *, keep: int = 2, key: bytes | None = None) -> None:
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise ValueError(f"keep must be a positive integer, got {keep!r}")
        if key is not None and not key:
            raise ValueError("an empty checkpoint key")
        self.directory, self.keep, self.key = Path(directory), keep, key

    def _open(self, path: Path, data: bytes) -> bytes:
        """The payload of a checkpoint file, its digest or HMAC checked."""
        keyed = data.startswith(_MAGIC_KEYED)
        magic = _MAGIC_KEYED if keyed else _MAGIC
        tag, payload = data[len(magic) : len(magic) + _DIGEST], data[len(magic) + _DIGEST :]
        if keyed and self.key is None:
            raise CheckpointKeyError(
                f"{path} was written with a checkpoint key: give the same key "
                "(--checkpoint-key) to resume it"
            )
        if keyed and self.key is not None:
            if not hmac.compare_digest(tag, hmac.new(self.key, payload, "sha256").digest()):
                raise CheckpointKeyError(
                    f"{path}: its HMAC does not match the checkpoint key: the file was "
                    "edited, damaged or written under another key; refused (remove it to "
                    "resume from an older checkpoint)"
                )
            return payload
        if not data.startswith(_MAGIC) and data.startswith(_OLD_MAGIC):
            raise CheckpointInvalidError(
                f"{path} is a checkpoint of an older fl_lbbsp (format 1), which this version "
                "cannot resume: use another checkpoint dir, or remove it to start afresh",
                field="manifest.format",
            )
        if not data.startswith(_MAGIC) or hashlib.sha256(payload).digest() != tag:
            raise CheckpointError(f"{path} is damaged or not a checkpoint (digest mismatch)")
        if self.key is not None:
            raise CheckpointKeyError(
                f"{path} was written without a checkpoint key, so an edit to it cannot be "
                "detected: resume without --checkpoint-key, or remove the checkpoints to "
                "start afresh"
            )
        return payload

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
        header = {"manifest": manifest, "state": state, "model": _MODEL}
        parts = {f"state.{name}": record for name, record in (records or {}).items()}
        payload = _encode(header, {_MODEL: arrays, **parts})
        if self.key is None:
            sealed = _MAGIC + hashlib.sha256(payload).digest() + payload
        else:
            sealed = _MAGIC_KEYED + hmac.new(self.key, payload, "sha256").digest() + payload
        self.directory.mkdir(parents=True, exist_ok=True)
        final = self.path(server_round)
        tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
        try:
            with tmp.open("wb") as f:
                f.write(sealed)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, final)
        finally:
            tmp.unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # persist the rename (POSIX; best effort)
            fd = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        for old in self.rounds()[: -self.keep]:
            self.path(old).unlink(missing_ok=True)
        return final

    def load(self, path: str | Path, *, limits: CheckpointLimits | None = None) -> Checkpoint:
        """Read one checkpoint file, validated (:func:`validate_checkpoint` with ``limits``).

        Raises
        ------
        CheckpointError
            A damaged, truncated or foreign file; (``CheckpointKeyError``) a key
            mismatch; (``CheckpointInvalidError``) contents that fail validation, or an
            older format.
        """
        path = Path(path)
        payload = self._open(path, path.read_bytes())
        try:
            header, records = _decode(payload)
            manifest, state, arrays = header["manifest"], header["state"], records.pop(_MODEL)
        except Exception as err:  # noqa: BLE001 - any decoding failure means unreadable
            message = " ".join(str(err).split())[:200]
            raise CheckpointError(f"{path} is not a readable checkpoint: {message}") from None
        for name, value in (("manifest", manifest), ("state", state)):
            if not isinstance(value, dict):
                raise CheckpointInvalidError(
                    f"{path}: invalid field {name}: not a JSON object", field=name
                )
        validate_checkpoint(manifest, state, where=str(path), limits=limits)
        parts = {name.removeprefix("state."): r for name, r in records.items()}
        return Checkpoint(int(manifest["round"]), arrays, manifest, state, parts, path)

    def latest(self, *, limits: CheckpointLimits | None = None) -> Checkpoint | None:
        """The newest readable checkpoint, validated with ``limits`` (a damaged newer
        file is skipped with a warning), or ``None`` when the folder holds none.

        Raises
        ------
        CheckpointError
            If the folder holds checkpoint files but none is readable.
        CheckpointInvalidError
            The newest readable one is refused (never skipped for an older one).
        """
        rounds = self.rounds()
        for server_round in reversed(rounds):
            path = self.path(server_round)
            try:
                return self.load(path, limits=limits)
            except CheckpointInvalidError:
                raise
            except (CheckpointError, OSError) as err:
                log.warning("skipping checkpoint %s: %s", path, err)
        if rounds:
            raise CheckpointError(
                f"no readable checkpoint in {self.directory} ({len(rounds)} damaged files): "
                "remove them to start afresh"
            )
        return None


# ------------------------------------------------------------------ strategy side
def _manifest(strategy: LBBSPFedAvg) -> dict[str, Any]:
    return {
        "format": FORMAT_VERSION,
        "strategy": type(strategy).__name__,
        "scheme": strategy.scheme,
        "settings": strategy.checkpoint_settings(),
    }


def save_checkpoint(
    store: CheckpointStore, strategy: LBBSPFedAvg, server_round: int, arrays: ArrayRecord
) -> Path:
    """Write ``strategy``'s checkpoint of ``server_round`` with global model ``arrays``."""
    state, records = strategy.checkpoint_state()
    manifest = {**_manifest(strategy), "round": server_round, "saved_at": time.time()}
    return store.save(server_round, arrays=arrays, manifest=manifest, state=state, records=records)


def _flat(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """Strategy, scheme and every setting as one flat mapping (JSON values)."""
    flat = {k: manifest.get(k) for k in ("format", "strategy", "scheme")}
    for group, value in dict(manifest.get("settings") or {}).items():
        flat.update(value if isinstance(value, dict) else {group: value})
    return json.loads(json.dumps(flat))  # type: ignore[no-any-return]


def check_compatible(checkpoint: Checkpoint, strategy: LBBSPFedAvg) -> None:
    """Raise :class:`CheckpointError` unless ``strategy`` can resume ``checkpoint``: the
    same strategy class, scheme and settings (a setting newer than the checkpoint, absent
    from its manifest, is not compared: the run resumes with the strategy's value)."""
    found, expected = _flat(checkpoint.manifest), _flat(_manifest(strategy))
    newer = [name for name in expected if name not in found]
    if newer:
        log.info(
            "checkpoint %s predates the settings %s: resumed with this strategy's values",
            checkpoint.path,
            ", ".join(newer),
        )
    differences = [
        f"{name}={found[name]!r} (this strategy: {expected[name]!r})"
        for name in expected
        if name in found and found[name] != expected[name]
    ]
    if differences:
        raise CheckpointError(
            f"checkpoint {checkpoint.path} was written with {'; '.join(differences)}: resume "
            "with the same strategy and settings, or use another checkpoint_dir"
        )


def limits_of(strategy: LBBSPFedAvg, *, max_silos: int | None = None) -> CheckpointLimits:
    """The bounds ``strategy`` puts on a checkpoint it resumes: ``max_silos`` and its
    ``max_dataset_size`` (where it has one)."""
    size = getattr(
        getattr(getattr(strategy, "config", None), "tuning", None), "max_dataset_size", None
    )
    return CheckpointLimits(max_silos, size if isinstance(size, int) else None)


def store_of(strategy: LBBSPFedAvg) -> CheckpointStore | None:
    """The strategy's checkpoint folder (``server_config.checkpoint_dir``) with its
    checkpoint key, if any; ``None``: the strategy has no checkpoint folder.

    Raises
    ------
    CheckpointError
        The checkpoint key file cannot be used.
    """
    server = strategy.server_config
    if server.checkpoint_dir is None:
        return None
    key_file = getattr(server, "checkpoint_key", None)
    key = None if key_file is None else load_checkpoint_key(key_file)
    return CheckpointStore(server.checkpoint_dir, key=key)


def resume_point(
    strategy: LBBSPFedAvg,
    *,
    store: CheckpointStore | None = None,
    max_silos: int | None = None,
    initial_arrays: ArrayRecord | None = None,
) -> Checkpoint | None:
    """The checkpoint ``strategy.start`` would resume from (``None``: a fresh start), with
    the strategy's bounds (:func:`limits_of`; ``max_silos``: the federation size), its
    settings (:func:`check_compatible`) and model (``initial_arrays``, :func:`check_arrays`)
    checked; ``store=None``: the strategy's own (:func:`store_of`).

    Raises
    ------
    CheckpointError, CheckpointInvalidError
        As :func:`check_compatible`, :meth:`CheckpointStore.latest` and
        :func:`check_arrays`.
    """
    store = store if store is not None else store_of(strategy)
    limits = limits_of(strategy, max_silos=max_silos)
    checkpoint = None if store is None else store.latest(limits=limits)
    if checkpoint is not None:
        check_compatible(checkpoint, strategy)
        if initial_arrays is not None:
            encrypted = "fingerprint" in _flat(_manifest(strategy))
            check_arrays(checkpoint, initial_arrays, encrypted=encrypted)
    return checkpoint


def restore(strategy: LBBSPFedAvg, checkpoint: Checkpoint) -> None:
    """Restore ``checkpoint``'s state into ``strategy``.

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


class RunLog(Protocol):
    """A runner's record of its run beside the checkpoints
    (:class:`~fl_lbbsp.runs.resume.RunRecord`)."""

    def check_same(self) -> Path | None:
        """Refuse another run's folder; the recorded run's telemetry file."""

    def keep(self, earlier: Path | None, *, after_round: int) -> None:
        """Keep the telemetry of the rounds before ``after_round``."""

    def write(self) -> None:
        """Record the run."""


@dataclass(frozen=True)
class ResumePoint:
    """A checkpoint validated for a strategy and restored into it (:func:`resume_from`),
    with the store it was read from and the next ones are written to."""

    checkpoint: Checkpoint
    store: CheckpointStore


def resume_from(
    strategy: LBBSPFedAvg,
    *,
    store: CheckpointStore | None = None,
    run: RunLog | None = None,
    max_silos: int | None = None,
    initial_arrays: ArrayRecord | None = None,
) -> ResumePoint | None:
    """The newest checkpoint in ``store`` (``None``: the strategy's own), validated
    (:func:`resume_point`) and restored into ``strategy`` (:func:`restore`); ``None``: a
    fresh start. With ``run`` (:class:`~fl_lbbsp.runs.resume.RunRecord`) the folder must
    record the same run (checked first), a resumed run keeps the telemetry of its
    earlier rounds, and the record is written when the folder had none.

    Raises
    ------
    CheckpointError, CheckpointInvalidError
        As :func:`resume_point`, :func:`restore` and the run record's checks.
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


# ------------------------------------------------------------------------ the model
def _layout(record: ArrayRecord) -> list[tuple[str, tuple[int, ...], str]]:
    return [(key, tuple(a.shape), str(a.dtype)) for key, a in record.items()]


def _values(record: ArrayRecord, where: str, name: str) -> list[np.ndarray]:
    """Every array of a plaintext record as numpy, each checked finite."""
    out: list[np.ndarray] = []
    for key, array in record.items():
        try:
            values = np.asarray(array.numpy())
        except Exception as err:  # noqa: BLE001 - bytes that are not an array
            raise _invalid(where, f"{name}.{key}", f"unreadable ({type(err).__name__})") from None
        if values.dtype.kind in "fc" and not np.isfinite(values).all():
            raise _invalid(where, f"{name}.{key}", "holds NaN or infinite values")
        out.append(values)
    return out


def _norm(values: list[np.ndarray]) -> float:
    return math.sqrt(math.fsum(float(np.sum(np.square(v, dtype=np.float64))) for v in values))


def check_arrays(
    checkpoint: Checkpoint,
    initial_arrays: ArrayRecord,
    *,
    encrypted: bool = False,
    max_growth: float = MAX_MODEL_GROWTH,
) -> None:
    """Refuse a checkpoint whose model (or array state) the strategy cannot take.

    Every plaintext record must hold finite values. The model, the momentum buffers
    (``optimizer``) and any record named like the model (a kept initial model) must
    have the model's names in order and shapes (the model its dtypes too) and an L2 norm
    at most ``max_growth`` times the initial model's (or 1). An encrypted record (only
    for an ``encrypted`` strategy; checked last, it is decoded) must be a readable
    encrypted record of the model's layout.

    Raises
    ------
    CheckpointInvalidError
        Naming the first array that fails, e.g. ``arrays.w: shape [30, 4] and dtype
        float32, the model's are [3, 4] and float32``.
    """
    where, model = str(checkpoint.path), _layout(initial_arrays)
    bound = max_growth * max(1.0, _norm(_values(initial_arrays, where, "initial")))
    records = {_MODEL: checkpoint.arrays}
    records |= {f"records.{k[:40]}": r for k, r in checkpoint.records.items()}
    for name, record in sorted(records.items(), key=lambda item: is_encrypted(item[1])):
        if is_encrypted(record):
            plain = "an encrypted model, but this strategy's is plaintext"
            reason = _encrypted_layout(record, model) if encrypted else plain
            if reason is not None:
                raise _invalid(where, name, reason)
            continue
        values, found = _values(record, where, name), _layout(record)
        names, want = [k for k, _, _ in found], [k for k, _, _ in model]
        if name not in (_MODEL, "records.optimizer") and names != want:
            continue  # other array state: finite is all it must be
        if names != want:
            raise _invalid(where, name, f"arrays {names[:8]} are not the model's {want[:8]}")
        for (key, shape, dtype), (_, shape_, dtype_) in zip(found, model, strict=True):
            if shape != shape_ or (name == _MODEL and dtype != dtype_):
                reason = f"shape {list(shape)} and dtype {dtype}, the model's are {list(shape_)} and {dtype_}"  # noqa: E501
                raise _invalid(where, f"{name}.{key}", reason)
        if not (norm := _norm(values)) <= bound:
            reason = f"L2 norm {norm:.4g} is over {bound:.4g} ({max_growth:g} times the initial model's, or 1)"  # noqa: E501
            raise _invalid(where, name, reason)


def _encrypted_layout(
    record: ArrayRecord, model: list[tuple[str, tuple[int, ...], str]]
) -> str | None:
    """Why ``record`` is not a readable encrypted model of ``model`` (``None``: it is)."""
    from ..crypto.records import update_from_record  # tenseal: encrypted strategies only

    try:
        update = update_from_record(record)
    except Exception as err:  # noqa: BLE001 - any unreadable ciphertext record
        return f"not a readable encrypted model ({err})"[:300]
    found = [(s.name, tuple(s.shape), str(np.dtype(s.dtype))) for s in update.layout]
    return None if found == model else "its encrypted layout is not the model's"
