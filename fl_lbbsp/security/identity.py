"""Silo identity: Ed25519 signing keys, the registry of the federation's silos, and the
signature every reply carries (``cryptography`` only: no Flower, no TenSEAL).

Each silo holds a private signing key; the server holds a registry mapping each silo id to
its public key (and, optionally, the dataset size the silo declared when it was enrolled).
A silo signs :func:`signed_bytes` of each reply (run, round, the instruction it answers,
silo id, metrics, array digests); the server checks it with :meth:`SiloRegistry.verify`
before it trusts anything in the reply, so an impostor, an edited reply and a replayed one
are rejected. A signature proves who sent a reply, not that its contents are sound.

Silo ids follow one rule everywhere (:data:`~fl_lbbsp.contract.SILO_ID_PATTERN`,
:func:`check_silo_id`), so that an id is safe in a file name, a log line and a telemetry
record. Private key files must not be readable by group or others
(:func:`check_private_file`, as ssh does).

``fl-lbbsp keys silos`` writes the key files and the registry
(:func:`fl_lbbsp.security.silo_keys.write_silo_keys`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
import numbers
import os
import re
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from ..contract import SILO_ID_PATTERN, InvalidReplyError

__all__ = [
    "REGISTRY_FILE",
    "IdentityError",
    "SiloRegistry",
    "check_private_file",
    "check_silo_id",
    "instruction_of",
    "key_file_name",
    "load_registry",
    "load_signing_key",
    "sign_reply",
    "signed_arrays",
    "signed_bytes",
    "public_pem",
    "write_file",
]

REGISTRY_FILE = "registry.json"
"""Name of the registry ``fl-lbbsp keys silos`` writes beside the silos' key files."""

_TAG = b"fl-lbbsp reply signature v2\n"  # domain separation: these bytes sign nothing else

_SILO_ID = re.compile(SILO_ID_PATTERN)


class IdentityError(ValueError):
    """A key file or registry that cannot be used; the message names the file and why."""


def check_silo_id(silo: object, *, what: str = "silo id") -> str:
    """``silo`` (an integer as its decimal text) if it is a valid silo id
    (:data:`~fl_lbbsp.contract.SILO_ID_PATTERN`); ``what`` names it in the message
    (``--ids``, ``node config silo-id``, ...).

    Raises
    ------
    IdentityError
        One line quoting at most the id's first 40 characters.
    """
    if isinstance(silo, int) and not isinstance(silo, bool):
        silo = str(silo)
    if not isinstance(silo, str) or _SILO_ID.fullmatch(silo) is None:
        shown = repr(silo)[:40] + ("..." if len(repr(silo)) > 40 else "")
        length = f" of {len(silo)} characters" if isinstance(silo, str) else ""
        raise IdentityError(
            f"{what} {shown}{length} is not a valid silo id: use 1 to 128 characters "
            "of A-Z a-z 0-9 _ . -"
        )
    return silo


def key_file_name(silo: str) -> str:
    """The file name of silo ``silo``'s private key in a key folder: ``silo-<id>.key``.

    Raises
    ------
    IdentityError
        If ``silo`` is not a valid silo id (:func:`check_silo_id`).
    """
    return f"silo-{check_silo_id(silo)}.key"


def check_private_file(path: str | Path) -> None:
    """Refuse a private key file that group or others may access, as ssh does.

    Only checked on POSIX systems and for files owned by this user (a file owned by
    another user, e.g. root, is that user's to protect).

    Raises
    ------
    IdentityError
        One line with the file's permissions and the fix (``chmod 600 <path>``).
    """
    if os.name != "posix":  # pragma: no cover - permissions as ssh reads them are POSIX
        return
    try:
        info = os.stat(path)
    except OSError:
        return  # the reader reports a missing or unreadable file itself
    if info.st_uid == os.getuid() and info.st_mode & 0o077:
        mode = stat.S_IMODE(info.st_mode)
        raise IdentityError(
            f"{path}: permissions {mode:04o} are too open: this private key file must not "
            f"be accessible by group or others; run: chmod 600 {path}"
        )


def write_file(path: Path, data: bytes, *, mode: int) -> None:
    """Write ``data`` to ``path`` created with permissions ``mode`` (no window in which a
    private key is readable by others)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.chmod(path, mode)


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def signed_bytes(
    *,
    run_id: int,
    server_round: int,
    instruction: str | None,
    silo: str,
    metrics: Mapping[str, Any],
    arrays: Iterable[tuple[str, bytes]],
) -> bytes:
    """The bytes a silo signs for one reply (and the server verifies).

    Parameters
    ----------
    run_id : int
        The Flower run the reply belongs to.
    server_round : int
        The round it answers.
    instruction : str | None
        The message id of the instruction it answers (the server verifies with the id of
        the message it sent to the replying node, so another node cannot pass the reply
        off as its own); ``None``: the grid assigns none.
    silo : str
        The silo id it claims.
    metrics : Mapping[str, Any]
        Its MetricRecord (numbers or lists of numbers), as canonical JSON: keys sorted,
        no whitespace, floats as Python writes them.
    arrays : iterable of (str, bytes)
        Its update's arrays in record order, each as its name and its bytes (the npy
        buffer, or a ciphertext chunk or header); only their sha256 digests enter.

    Returns
    -------
    bytes
        A domain tag followed by the canonical JSON of all of the above.
    """
    body = {
        "run": int(run_id),
        "round": int(server_round),
        "instruction": None if instruction is None else str(instruction),
        "silo": str(silo),
        "metrics": {str(k): _plain(v) for k, v in metrics.items()},
        "arrays": [[str(name), _digest(data)] for name, data in arrays],
    }
    return _TAG + json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def _plain(value: Any) -> Any:
    """A metric value as JSON holds it, the same on both sides (numpy scalars, NaN)."""
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, bool | str) or value is None:
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        number = float(value)
        return number if math.isfinite(number) else repr(number)
    return repr(value)


def signed_arrays(record: Mapping[str, Any]) -> list[tuple[str, bytes]]:
    """What a signature covers of an update: each array's name and bytes (its ``data``),
    in record order; an ArrayRecord of npy buffers, or of an encrypted update's header and
    ciphertext chunks alike."""
    return [(str(name), array.data) for name, array in record.items()]


def sign_reply(key: Ed25519PrivateKey, **fields: Any) -> str:
    """The base64 Ed25519 signature of :func:`signed_bytes` of ``fields`` (``run_id``,
    ``server_round``, ``instruction``, ``silo``, ``metrics``, ``arrays``)."""
    return base64.b64encode(key.sign(signed_bytes(**fields))).decode()


def instruction_of(sent: Iterable[Any], node: object) -> str | None:
    """The message id of the instruction among ``sent`` (Flower messages) addressed to
    ``node``, what a reply from ``node`` must have signed; ``None`` if none was sent to
    it or its message has no id yet."""
    for msg in sent:
        if msg.metadata.dst_node_id == node:
            return str(msg.metadata.message_id) or None
    return None


@dataclass(frozen=True)
class SiloRegistry:
    """The federation's silos: each silo id's public key and declared dataset size.

    Parameters
    ----------
    keys : Mapping[str, Ed25519PublicKey]
        Silo id -> its public signing key.
    dataset_sizes : Mapping[str, int] (default: {})
        Silo id -> the dataset size it declared when enrolled (optional per silo).
    """

    keys: Mapping[str, Ed25519PublicKey]
    dataset_sizes: Mapping[str, int] = field(default_factory=dict)

    def __contains__(self, silo: object) -> bool:
        return silo in self.keys

    def __len__(self) -> int:
        return len(self.keys)

    def verify(self, signature: object, **fields: Any) -> None:
        """Check a reply's signature over :func:`signed_bytes` of ``fields``.

        ``signature`` is the reply's (base64 text; ``None``: unsigned), ``fields`` as the
        server knows them (its own run and round, the id of the message it sent to the
        replying node, the claimed silo, what it received).

        Raises
        ------
        InvalidReplyError
            The silo is not registered, the reply is unsigned, or the signature is not
            that of the silo's key over these fields (forged, edited or replayed).
        """
        try:
            silo = check_silo_id(fields["silo"])
        except IdentityError as err:
            raise InvalidReplyError(str(err)) from None
        public = self.keys.get(silo)
        if public is None:
            raise InvalidReplyError(f"silo {silo} is not in the silo registry")
        if signature is None:
            raise InvalidReplyError("unsigned reply (the silo registry requires signatures)")
        if not isinstance(signature, str):
            raise InvalidReplyError(
                f"signature must be base64 text, got {type(signature).__name__}"
            )
        try:
            raw = base64.b64decode(signature, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidReplyError("signature is not base64") from None
        try:
            public.verify(raw, signed_bytes(**fields))
        except InvalidSignature:
            raise InvalidReplyError(
                f"bad signature: not silo {silo}'s over this reply, run "
                f"{fields['run_id']}, round {fields['server_round']} and the instruction "
                "sent to this node (forged, edited or replayed)"
            ) from None

    def to_json(self) -> dict[str, Any]:
        """The registry file's content: ``{"silos": {id: {"public-key": PEM, ...}}}``."""
        silos: dict[str, dict[str, Any]] = {}
        for silo, public in self.keys.items():
            entry: dict[str, Any] = {"public-key": public_pem(public)}
            if silo in self.dataset_sizes:
                entry["dataset-size"] = self.dataset_sizes[silo]
            silos[silo] = entry
        return {"silos": silos}


def public_pem(key: Ed25519PublicKey) -> str:
    """A public key as PEM text (SubjectPublicKeyInfo), as the registry holds it."""
    return key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode()


def load_registry(source: str | Path | Mapping[str, Any] | SiloRegistry) -> SiloRegistry:
    """A registry from its JSON file, its loaded content, or a registry (returned as is).

    Parameters
    ----------
    source : str | Path | Mapping | SiloRegistry
        ``registry.json`` (or the key folder holding it) as written by
        ``fl-lbbsp keys silos``, or its content; a mapping may also give public keys
        directly as ``{silo: Ed25519PublicKey}``.

    Raises
    ------
    IdentityError
        The file is missing or unreadable, or an entry has an invalid silo id
        (:func:`check_silo_id`), is not a PEM Ed25519 public key or has a dataset size
        that is not a positive integer.
    """
    if isinstance(source, SiloRegistry):
        return source
    name = "silo registry"
    if isinstance(source, str | Path):
        path = Path(source)
        path = path / REGISTRY_FILE if path.is_dir() else path
        name = str(path)
        try:
            content: Any = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise IdentityError(f"{name}: not a readable silo registry ({err})") from None
    else:
        content = source
    silos = content.get("silos", content) if isinstance(content, Mapping) else None
    if not isinstance(silos, Mapping) or not silos:
        raise IdentityError(f"{name}: expected {{'silos': {{silo-id: entry}}}} with a silo")
    keys: dict[str, Ed25519PublicKey] = {}
    sizes: dict[str, int] = {}
    for silo, entry in silos.items():
        try:
            check_silo_id(silo, what="silo")
        except IdentityError as err:
            raise IdentityError(f"{name}: {err}") from None
        if isinstance(entry, Ed25519PublicKey):
            keys[str(silo)] = entry
            continue
        if not isinstance(entry, Mapping) or not isinstance(entry.get("public-key"), str):
            raise IdentityError(f"{name}: silo {silo} has no 'public-key' PEM")
        try:
            public = serialization.load_pem_public_key(entry["public-key"].encode())
        except ValueError as err:
            raise IdentityError(f"{name}: silo {silo}'s public key is unreadable ({err})") from None
        if not isinstance(public, Ed25519PublicKey):
            raise IdentityError(f"{name}: silo {silo}'s public key is not an Ed25519 key")
        keys[str(silo)] = public
        size = entry.get("dataset-size")
        if size is not None:
            if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
                raise IdentityError(
                    f"{name}: silo {silo}'s dataset-size must be a positive integer, got {size!r}"
                )
            sizes[str(silo)] = size
    return SiloRegistry(keys=keys, dataset_sizes=sizes)


def load_signing_key(path: str | Path) -> Ed25519PrivateKey:
    """A silo's private signing key from its PEM file (``silo-<id>.key``).

    Raises
    ------
    IdentityError
        The file is missing, unreadable, accessible by group or others
        (:func:`check_private_file`) or not an unencrypted Ed25519 private key.
    """
    check_private_file(path)
    try:
        key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as err:
        raise IdentityError(f"{path}: not a readable signing key ({err})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise IdentityError(f"{path}: not an Ed25519 private key")
    return key
