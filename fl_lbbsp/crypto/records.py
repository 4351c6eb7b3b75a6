"""Encrypted updates in Flower records: one ArrayRecord, plaintext header plus chunks.

The header (weight, length, key fingerprint, layout, digests: no value of the update) and
every ciphertext chunk travel as Flower ``Array`` objects with their own ``stype``, so
Flower carries them like any model and never mistakes them for numpy arrays.
"""

from __future__ import annotations

from flwr.app import Array, ArrayRecord

from ..contract import ENCRYPTED_HEADER as HEADER_KEY
from ..contract import is_encrypted
from .ckks import EncryptedUpdate, InvalidUpdateError

__all__ = [
    "CHUNK_STYPE",
    "HEADER_KEY",
    "HEADER_STYPE",
    "is_encrypted",
    "update_from_record",
    "update_to_record",
]

HEADER_STYPE = "fl_lbbsp.ckks-header"
CHUNK_STYPE = "tenseal.ckks-vector"
_CHUNK_PREFIX = "ckks-chunk-"


def update_to_record(update: EncryptedUpdate) -> ArrayRecord:
    """Pack an encrypted update into an ArrayRecord (header first, then the chunks)."""
    arrays = {HEADER_KEY: _bytes_array(update.header(), HEADER_STYPE)}
    for k, chunk in enumerate(update.chunks):
        arrays[f"{_CHUNK_PREFIX}{k:05d}"] = _bytes_array(chunk, CHUNK_STYPE)
    return ArrayRecord(arrays)


def update_from_record(record: ArrayRecord) -> EncryptedUpdate:
    """Unpack :func:`update_to_record`.

    Raises
    ------
    InvalidUpdateError
        If the header is missing or unreadable, an entry is not of the expected kind, or
        the chunk names are not ``0..k-1``.
    """
    if HEADER_KEY not in record:
        raise InvalidUpdateError("no encrypted update in the reply (plaintext arrays?)")
    header = record[HEADER_KEY]
    if header.stype != HEADER_STYPE:
        raise InvalidUpdateError(f"header has stype {header.stype!r}, expected {HEADER_STYPE!r}")
    names = [name for name in record if name != HEADER_KEY]
    expected = [f"{_CHUNK_PREFIX}{k:05d}" for k in range(len(names))]
    if sorted(names) != expected:
        raise InvalidUpdateError(f"unexpected entries {sorted(set(names) - set(expected))[:3]}")
    chunks = []
    for name in expected:
        array = record[name]
        if array.stype != CHUNK_STYPE:
            raise InvalidUpdateError(f"{name} has stype {array.stype!r}, expected {CHUNK_STYPE!r}")
        chunks.append(bytes(array.data))
    return EncryptedUpdate.from_parts(bytes(header.data), chunks)


def _bytes_array(data: bytes, stype: str) -> Array:
    return Array(dtype="uint8", shape=(len(data),), stype=stype, data=data)
