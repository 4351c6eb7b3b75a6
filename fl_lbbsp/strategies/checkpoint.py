"""The checkpoint file, which knows no strategy (its side: :mod:`.checkpointing`).

One file per round, ``round-NNNNNN.ckpt`` (format 2): a JSON header (the :class:`Manifest`,
each part's state as its model dumps it, :class:`StrategyState`, and every array's layout)
and the arrays' bytes, behind a SHA-256 digest or, with a checkpoint key (``fl-lbbsp keys
checkpoint``), an HMAC-SHA256 that detects an edit, not only damage. Nothing is obeyed
before the same models validate it (:func:`validate_checkpoint`) and :func:`check_arrays`
passes its arrays.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import io
import json
import logging
import os
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from flwr.app import Array, ArrayRecord
from flwr.serverapp.strategy import Result
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..contract import is_encrypted
from ..core.balancer import BatchSizeBalancer
from ..core.balancer_state import MAX_BATCH_SIZE
from ..core.round.engine import EngineState
from ..core.settings import BalancingConfig
from ..security.identity import IdentityError, check_private_file, write_file
from ..security.screening import model_norm

__all__ = [  # noqa: RUF022 - by kind: errors, keys, the file's models, the store, checks
    "CheckpointError", "CheckpointInvalidError", "CheckpointKeyError", "CheckpointWriteError",
    "load_checkpoint_key", "write_checkpoint_key",
    "Checkpoint", "CheckpointLimits", "Manifest", "StrategyState", "CheckpointStore",
    "check_arrays", "validate_checkpoint",
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
_FORMAT_1 = (
    "a checkpoint of an older fl_lbbsp (format 1), which this version cannot resume: use "
    "another checkpoint dir, or remove it to start afresh"
)
_KEY_ADVICE = {
    True: "it was written with a checkpoint key: give the same key (--checkpoint-key)",
    False: "it was written without a checkpoint key, so an edit to it cannot be detected: "
    "start afresh under the key (another checkpoint dir, or remove these checkpoints), or "
    "re-sign only checkpoints you trust with `fl-lbbsp keys checkpoint --out KEY --sign DIR`",
}


class CheckpointError(ValueError):
    """A checkpoint (or its run's record) that cannot be read, resumed or written."""


class CheckpointInvalidError(CheckpointError):
    """A readable checkpoint refused, in one line naming the field (``field``, dotted):
    ``<where>: invalid field state.engine.balancer.silos.w1.estimator.value: ...``."""

    def __init__(self, where: object, field: str, reason: str) -> None:
        super().__init__(" ".join(f"{where}: invalid field {field}: {reason}".split()))
        self.field = field


class CheckpointKeyError(CheckpointInvalidError):
    """A file refused for its key (field ``hmac``): an HMAC that does not match it, a keyed
    file read without it, or an unkeyed one read with it; never skipped for an older one."""


class CheckpointWriteError(CheckpointError):
    """A run asked to checkpoint that wrote no checkpoint (every write failed: a full
    disk, say); ``result`` is the run's :class:`~flwr.serverapp.strategy.Result`."""

    def __init__(self, message: str, *, result: Result | None = None) -> None:
        super().__init__(message)
        self.result = result


def load_checkpoint_key(path: str | Path) -> bytes:
    """The checkpoint key in ``path``, surrounding whitespace removed.

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
    """What a checkpoint is of: format, last finished round, the strategy class and scheme
    that wrote it, and the settings that decide its rounds (``balancing`` validated as a
    :class:`~fl_lbbsp.core.settings.BalancingConfig`)."""

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
    """A strategy's state: each part's, as its state model dumps it (the updates' state
    is checked by their own ``load_state_dict``)."""

    model_config = ConfigDict(extra="forbid")

    engine: EngineState
    updates: dict[str, Any] = Field(default_factory=dict)


class _Contents(BaseModel):
    """A checkpoint's JSON: what :func:`validate_checkpoint` validates, as one model."""

    manifest: Manifest
    state: StrategyState


@dataclass(frozen=True)
class CheckpointLimits:
    """The resuming strategy's bounds (``None``: not bounded): the federation's size and
    the largest pinned dataset size."""

    max_silos: int | None = None
    max_dataset_size: int | None = None


def validate_checkpoint(
    manifest: Mapping[str, Any],
    state: Mapping[str, Any],
    *,
    where: str = "checkpoint",
    limits: CheckpointLimits | None = None,
) -> StrategyState:
    """The checkpoint's state, validated: :class:`Manifest` and :class:`StrategyState`,
    the strategy's ``limits``, and one trial allocation of the balancer it holds.

    Raises
    ------
    CheckpointInvalidError
        One line: ``<where>: invalid field <dotted.name>: <reason>``.
    """
    try:
        parsed = _Contents.model_validate({"manifest": manifest, "state": state}).state
    except ValidationError as err:  # pydantic's first error, named by its dotted location
        first, more = err.errors()[0], err.error_count() - 1
        loc = [str(part)[:40] for part in first["loc"]]
        msg = str(first["msg"]).removeprefix("Value error, ")[:300]
        if named := re.match(r"([a-z]+_[a-z_]+|[a-z_]+\.[\w.-]+)(?=[= ])", msg):
            loc.append(named.group(1))  # a model-level check names its field first
        raise CheckpointInvalidError(
            where, ".".join(loc), msg + (f" (and {more} more)" if more else "")
        ) from None
    engine, limits = parsed.engine, limits or CheckpointLimits()
    for name, value, limit in [
        ("federation_size", engine.federation_size, limits.max_silos),
        ("silos", len(engine.silos), limits.max_silos),
        *(
            (f"claims.sizes.{s}", n, limits.max_dataset_size)
            for s, n in engine.claims.sizes.items()
        ),
    ]:
        if limit is not None and value > limit:
            raise CheckpointInvalidError(
                where, f"state.engine.{name}", f"{value:g} is over this strategy's {limit:g}"
            )
    try:  # a state the types admit that the balancer cannot use
        trial = BatchSizeBalancer.from_state_dict(
            engine.balancer.model_dump(mode="json", exclude_unset=True)
        )
        sizes = trial.allocate(trial.silo_ids)
        if any(not 1 <= x <= MAX_BATCH_SIZE for x in sizes.values()):
            raise ValueError(f"it allocates batch sizes out of range: {sizes}"[:200])
    except Exception as err:  # noqa: BLE001 - whatever the balancer cannot use is refused
        reason = f"the balancer cannot use it ({f'{type(err).__name__}: {err}'[:300]})"
        raise CheckpointInvalidError(where, "state.engine.balancer", reason) from None
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


def _tag(payload: bytes, key: bytes | None) -> bytes:
    """The SHA-256 digest of ``payload``, or its HMAC-SHA256 under ``key``."""
    if key is None:
        return hashlib.sha256(payload).digest()
    return hmac.new(key, payload, "sha256").digest()


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
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1 or key == b"":
            raise ValueError(f"keep must be a positive integer and a key not empty: {keep!r}")
        self.directory, self.keep, self.key = Path(directory), keep, key

    def path(self, server_round: int) -> Path:
        """File of the checkpoint of ``server_round``."""
        return self.directory / f"round-{server_round:06d}.ckpt"

    def rounds(self) -> list[int]:
        """Rounds with a checkpoint file, oldest first."""
        found = (_FILE.match(p.name) for p in self.directory.glob("round-*.ckpt"))
        return sorted(int(m.group(1)) for m in found if m)

    def _open(self, path: Path) -> bytes:
        """The payload of a checkpoint file, its digest or HMAC checked."""
        data = path.read_bytes()
        keyed = data.startswith(_MAGIC_KEYED)
        if not keyed and not data.startswith(_MAGIC):
            if data.startswith(_OLD_MAGIC):
                raise CheckpointInvalidError(path, "manifest.format", _FORMAT_1)
            raise CheckpointError(f"{path} is damaged or not a checkpoint (no header)")
        if keyed != (self.key is not None):
            raise CheckpointKeyError(path, "hmac", _KEY_ADVICE[keyed])
        start = len(_MAGIC_KEYED if keyed else _MAGIC)
        payload = data[start + _DIGEST :]
        if hmac.compare_digest(data[start : start + _DIGEST], _tag(payload, self.key)):
            return payload
        if keyed:
            raise CheckpointKeyError(
                path,
                "hmac",
                "it does not match the checkpoint key: the file was edited, "
                "damaged or written under another key (remove it to resume from an older one)",
            )
        raise CheckpointError(f"{path} is damaged (digest mismatch)")

    def _clean(self) -> None:
        """Remove the temporary files of writers killed mid-write."""
        for stale in self.directory.glob(".round-*.ckpt.*.tmp"):  # as _write names them
            log.warning("removing %s, left by a checkpoint write that was cut short", stale)
            stale.unlink(missing_ok=True)

    def _write(self, final: Path, payload: bytes) -> None:
        """``payload`` sealed into ``final`` through a temporary file, synced and renamed
        (a crash leaves the old file or the new, never half of one)."""
        tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
        try:
            with tmp.open("wb") as f:
                f.write(_MAGIC if self.key is None else _MAGIC_KEYED)
                f.write(_tag(payload, self.key))
                f.write(payload)
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

    def save(
        self,
        server_round: int,
        *,
        arrays: ArrayRecord,
        manifest: dict[str, Any],
        state: dict[str, Any],
        records: dict[str, ArrayRecord] | None = None,
    ) -> Path:
        """Write the checkpoint of ``server_round`` atomically; return its path. (The
        header's length, 8 bytes; the header, with each array's public ``Array`` fields.)"""
        parts = {_MODEL: arrays, **{f"state.{k}": r for k, r in (records or {}).items()}}
        index = {
            name: [[k, a.dtype, list(a.shape), a.stype, len(a.data)] for k, a in record.items()]
            for name, record in parts.items()
        }
        head = json.dumps({"manifest": manifest, "state": state, "records": index}).encode()
        blobs = [a.data for record in parts.values() for a in record.values()]
        self.directory.mkdir(parents=True, exist_ok=True)
        self._clean()
        self._write(self.path(server_round), b"".join([len(head).to_bytes(8, "big"), head, *blobs]))
        for old in self.rounds()[: -self.keep]:
            self.path(old).unlink(missing_ok=True)
        return self.path(server_round)

    def sign(self, path: str | Path) -> Path:
        """Rewrite the unkeyed checkpoint ``path`` under this store's key (only a file
        you trust: an edit made before is then obeyed); one signed under it is left.

        Raises
        ------
        CheckpointError
            The file is damaged, keyed under another key, or this store has no key.
        """
        path = Path(path)
        if self.key is None:
            raise CheckpointError("signing a checkpoint needs a checkpoint key")
        if not path.read_bytes().startswith(_MAGIC_KEYED):
            self._write(path, CheckpointStore(self.directory)._open(path))
        self._open(path)
        return path

    def load(self, path: str | Path, *, limits: CheckpointLimits | None = None) -> Checkpoint:
        """Read one checkpoint file, validated (:func:`validate_checkpoint` with ``limits``).

        Raises
        ------
        CheckpointError
            A damaged, truncated or foreign file; its subclasses for a key mismatch or
            contents that fail validation (an older format too).
        """
        path = Path(path)
        payload = io.BytesIO(self._open(path))
        try:
            header, records = json.loads(payload.read(int.from_bytes(payload.read(8), "big"))), {}
            for name, arrays in header["records"].items():
                records[name] = ArrayRecord()
                for key, dtype, shape, stype, length in arrays:
                    if len(data := payload.read(length)) != length:
                        raise ValueError("truncated")
                    records[name][key] = Array(
                        dtype=dtype, shape=tuple(shape), stype=stype, data=data
                    )
            if rest := len(payload.read()):
                raise ValueError(f"{rest} bytes after the last array")
            manifest, state, model = header["manifest"], header["state"], records.pop(_MODEL)
        except Exception as err:  # noqa: BLE001 - any decoding failure means unreadable
            message = " ".join(str(err).split())[:200]
            raise CheckpointError(f"{path} is not a readable checkpoint: {message}") from None
        validate_checkpoint(manifest, state, where=str(path), limits=limits)
        parts = {name.removeprefix("state."): r for name, r in records.items()}
        return Checkpoint(manifest["round"], model, manifest, state, parts, path)

    def latest(self, *, limits: CheckpointLimits | None = None) -> Checkpoint | None:
        """The newest readable checkpoint, validated with ``limits`` (a damaged newer file
        is skipped with a warning; a refused one is raised), or ``None``: none. The
        temporary files of a killed writer are removed first.

        Raises
        ------
        CheckpointError
            The folder holds checkpoint files but none is readable, or one is refused.
        """
        self._clean()
        rounds = self.rounds()
        for server_round in reversed(rounds):
            try:
                return self.load(self.path(server_round), limits=limits)
            except CheckpointInvalidError:
                raise
            except (CheckpointError, OSError) as err:
                log.warning("skipping checkpoint %s: %s", self.path(server_round), err)
        if rounds:
            raise CheckpointError(
                f"no readable checkpoint in {self.directory} ({len(rounds)} damaged files): "
                "remove them to start afresh"
            )
        return None


def check_arrays(
    checkpoint: Checkpoint, initial_arrays: ArrayRecord, *, encrypted: bool = False
) -> None:
    """Refuse a checkpoint whose model (or array state) the strategy cannot take.

    Every plaintext record must be finite. The model, the momentum buffers (``optimizer``)
    and any record named like the model must have its names in order and shapes (the model
    its dtypes too) and an L2 norm at most :data:`MAX_MODEL_GROWTH` times the initial
    model's (or 1); an encrypted record (only if ``encrypted``), a readable one of the
    model's layout.

    Raises
    ------
    CheckpointInvalidError
        Naming the first array that fails, e.g. ``arrays.w: shape [30, 4] and dtype ...``.
    """
    where, model = checkpoint.path, _layout(initial_arrays)
    bound = MAX_MODEL_GROWTH * max(1.0, model_norm(_values(initial_arrays, where, "initial")))
    records = {_MODEL: checkpoint.arrays}
    records |= {f"records.{k[:40]}": r for k, r in checkpoint.records.items()}
    for name, record in sorted(records.items(), key=lambda item: is_encrypted(item[1])):
        if is_encrypted(record):  # checked last: it is decoded
            plain = "an encrypted model, but this strategy's is plaintext"
            if (reason := _encrypted_layout(record, model) if encrypted else plain) is not None:
                raise CheckpointInvalidError(where, name, reason)
            continue
        values, found = _values(record, where, name), _layout(record)
        names, want = [k for k, _, _ in found], [k for k, _, _ in model]
        if name not in (_MODEL, "records.optimizer") and names != want:
            continue  # other array state: finite is all it must be
        if names != want:
            raise CheckpointInvalidError(
                where, name, f"arrays {names[:8]} are not the model's {want[:8]}"
            )
        for (key, shape, dtype), (_, shape_, dtype_) in zip(found, model, strict=True):
            if shape != shape_ or (name == _MODEL and dtype != dtype_):
                reason = f"shape {list(shape)} and dtype {dtype}, the model's are {list(shape_)} and {dtype_}"  # noqa: E501
                raise CheckpointInvalidError(where, f"{name}.{key}", reason)
        if not (norm := model_norm(values)) <= bound:
            reason = f"L2 norm {norm:.4g} is over {bound:.4g} ({MAX_MODEL_GROWTH:g} times the initial model's, or 1)"  # noqa: E501
            raise CheckpointInvalidError(where, name, reason)


def _layout(record: ArrayRecord) -> list[tuple[str, tuple[int, ...], str]]:
    return [(key, tuple(a.shape), str(a.dtype)) for key, a in record.items()]


def _values(record: ArrayRecord, where: object, name: str) -> list[np.ndarray]:
    """Every array of a plaintext record as numpy, each checked finite."""
    out: list[np.ndarray] = []
    for key, array in record.items():
        try:
            values = np.asarray(array.numpy())
        except Exception as err:  # noqa: BLE001 - bytes that are not an array
            raise CheckpointInvalidError(
                where, f"{name}.{key}", f"unreadable ({type(err).__name__})"
            ) from None
        if values.dtype.kind in "fc" and not np.isfinite(values).all():
            raise CheckpointInvalidError(where, f"{name}.{key}", "holds NaN or infinite values")
        out.append(values)
    return out


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
