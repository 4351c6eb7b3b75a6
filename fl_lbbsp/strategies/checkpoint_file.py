"""Checkpoint files: the format (Flower's protobuf of a RecordDict behind a SHA-256
digest, or an HMAC-SHA256 under a checkpoint key), atomic writes, and the checkpoint key.

See :mod:`fl_lbbsp.strategies.checkpoint` for what a checkpoint holds and how a strategy
resumes from one; this module only reads and writes the files. A file is validated
(:func:`~fl_lbbsp.strategies.checkpoint_schema.validate_checkpoint`) as it is read.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import re
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, RecordDict
from flwr.common.serde import recorddict_from_proto, recorddict_to_proto
from flwr.proto.recorddict_pb2 import RecordDict as ProtoRecordDict

from ..security.identity import IdentityError, check_private_file, write_file
from .checkpoint_schema import CheckpointError, CheckpointInvalidError, validate_checkpoint

__all__ = [
    "MIN_KEY_BYTES",
    "Checkpoint",
    "CheckpointKeyError",
    "CheckpointStore",
    "load_checkpoint_key",
    "write_checkpoint_key",
]

log = logging.getLogger("fl_lbbsp")

MIN_KEY_BYTES = 32
"""Shortest checkpoint key file accepted (``fl-lbbsp keys checkpoint`` writes 64 hex
characters: 256 random bits)."""

_MAGIC = b"FL-LBBSP-CHECKPOINT\n"
_MAGIC_KEYED = b"FL-LBBSP-CHECKPOINT-HMAC-SHA256\n"
_DIGEST = hashlib.sha256().digest_size
_FILE = re.compile(r"^round-(\d+)\.ckpt$")
_ARRAYS = "arrays"
_META = "checkpoint"
_EXTRA = "state-arrays."


class CheckpointKeyError(CheckpointInvalidError):
    """A checkpoint file refused for its key: an HMAC that does not match the checkpoint
    key (edited, damaged or another key's), a keyed file read without the key, or a file
    without an HMAC read with one. Never skipped for an older checkpoint."""

    def __init__(self, message: str) -> None:
        super().__init__(message, field="hmac")


def load_checkpoint_key(path: str | Path) -> bytes:
    """The checkpoint key in ``path`` (its bytes, surrounding whitespace removed).

    Raises
    ------
    CheckpointError
        The file is accessible by group or others (``chmod 600`` it, as ssh asks of a
        private key), cannot be read, or holds fewer than :data:`MIN_KEY_BYTES` bytes.
    """
    try:
        check_private_file(path)
    except IdentityError as err:
        raise CheckpointError(f"checkpoint key {err}") from None
    try:
        key = Path(path).read_bytes().strip()
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
    OSError
        The file cannot be written.
    """
    target = Path(path)
    if target.exists() and not overwrite:
        raise FileExistsError(f"{target} exists; not replacing a checkpoint key without overwrite")
    write_file(target, (secrets.token_hex(32) + "\n").encode(), mode=0o600)
    return target


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
        self.directory = Path(directory)
        self.keep = keep
        self.key = key

    def _seal(self, payload: bytes) -> bytes:
        if self.key is None:
            return _MAGIC + hashlib.sha256(payload).digest() + payload
        return _MAGIC_KEYED + hmac.new(self.key, payload, hashlib.sha256).digest() + payload

    def _open(self, path: Path, data: bytes) -> bytes:
        """The payload of a checkpoint file, its digest or HMAC checked."""
        if data.startswith(_MAGIC_KEYED):
            tag = data[len(_MAGIC_KEYED) : len(_MAGIC_KEYED) + _DIGEST]
            payload = data[len(_MAGIC_KEYED) + _DIGEST :]
            if self.key is None:
                raise CheckpointKeyError(
                    f"{path} was written with a checkpoint key: give the same key "
                    "(--checkpoint-key) to resume it"
                )
            expected = hmac.new(self.key, payload, hashlib.sha256).digest()
            if not hmac.compare_digest(tag, expected):
                raise CheckpointKeyError(
                    f"{path}: its HMAC does not match the checkpoint key: the file was "
                    "edited, damaged or written under another key; refused (remove it to "
                    "resume from an older checkpoint)"
                )
            return payload
        head, digest = data[: len(_MAGIC)], data[len(_MAGIC) : len(_MAGIC) + _DIGEST]
        payload = data[len(_MAGIC) + _DIGEST :]
        if head != _MAGIC or hashlib.sha256(payload).digest() != digest:
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
                f.write(self._seal(payload))
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
        CheckpointKeyError
            With a key: the file has no HMAC, or one that does not match; without a key:
            the file has an HMAC.
        CheckpointInvalidError
            If its contents fail validation
            (:func:`~fl_lbbsp.strategies.checkpoint_schema.validate_checkpoint`).
        """
        path = Path(path)
        payload = self._open(path, path.read_bytes())
        try:
            content = recorddict_from_proto(ProtoRecordDict.FromString(payload))
            meta = content.config_records[_META]
            manifest = json.loads(str(meta["manifest"]))
            state = json.loads(str(meta["state"]))
            arrays = content.array_records[_ARRAYS]
        except Exception as err:  # noqa: BLE001 - any decoding failure means unreadable
            message = " ".join(str(err).split())[:200]
            raise CheckpointError(f"{path} is not a readable checkpoint: {message}") from None
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
                raise  # readable but edited (or keyed wrongly): refused, never skipped
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
