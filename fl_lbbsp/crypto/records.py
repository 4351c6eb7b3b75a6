"""Encrypted updates in Flower records: one ArrayRecord, plaintext header plus chunks.

The header (weight, length, key fingerprint, layout, digests: no value of the update) and
every ciphertext chunk travel as Flower ``Array`` objects with their own ``stype``, so
Flower carries them like any model and never mistakes them for numpy arrays.

The checks of a refused aggregate (:mod:`fl_lbbsp.crypto.blame`) travel the same way: the
server's requests as ArrayRecords ``he-check-<k>`` of the train message (a contribution
with a note saying whose, of which round), a silo's answers as the entry ``he-check`` of
its encrypted update, which its signature covers with the rest.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence

import numpy as np
from flwr.app import Array, ArrayRecord, RecordDict

from ..contract import ENCRYPTED_HEADER as HEADER_KEY
from ..contract import HE_CHECK, is_encrypted
from .blame import CheckRequest, contribution_norm
from .check_report import CheckReport
from .ckks import EncryptedUpdate, InvalidUpdateError, UpdateChecker
from .keys import CKKSKeys

__all__ = [
    "CHECK_STYPE",
    "CHUNK_STYPE",
    "HEADER_KEY",
    "HEADER_STYPE",
    "answer_check_requests",
    "check_report_of",
    "check_requests_of",
    "is_encrypted",
    "request_records",
    "update_from_record",
    "update_to_record",
    "with_check_report",
]

HEADER_STYPE = "fl_lbbsp.ckks-header"
CHUNK_STYPE = "seal.ckks-ciphertext"
CHECK_STYPE = "fl_lbbsp.ckks-check"
_CHUNK_PREFIX = "ckks-chunk-"
_REQUEST_PREFIX = f"{HE_CHECK}-"


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
        raise InvalidUpdateError(
            "no encrypted update in the record: plaintext arrays (a silo's first model is "
            "plaintext: tell the two apart with fl_lbbsp.contract.is_encrypted)"
        )
    header = record[HEADER_KEY]
    if header.stype != HEADER_STYPE:
        raise InvalidUpdateError(f"header has stype {header.stype!r}, expected {HEADER_STYPE!r}")
    names = [name for name in record if name not in (HEADER_KEY, HE_CHECK)]
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


def request_records(requests: Sequence[CheckRequest]) -> dict[str, ArrayRecord]:
    """The ArrayRecords of a train message that ask a silo to check ``requests``:
    ``he-check-<k>``, each a contribution with its note (whose, of which round)."""
    records = {}
    for k, request in enumerate(requests):
        record = update_to_record(request.update)
        record[HE_CHECK] = _bytes_array(request.note(), CHECK_STYPE)
        records[f"{_REQUEST_PREFIX}{k}"] = record
    return records


def check_requests_of(content: RecordDict) -> list[CheckRequest]:
    """The check requests of a train message (none in most rounds).

    Raises
    ------
    InvalidUpdateError
        If a request is malformed.
    """
    requests = []
    for name, record in content.array_records.items():
        if not name.startswith(_REQUEST_PREFIX):
            continue
        note = record.get(HE_CHECK)
        if note is None or note.stype != CHECK_STYPE:
            raise InvalidUpdateError(f"check request {name} has no note")
        silo, bad_round = CheckRequest.read_note(bytes(note.data))
        requests.append(
            CheckRequest(silo=silo, bad_round=bad_round, update=update_from_record(record))
        )
    return requests


def with_check_report(record: ArrayRecord, report: CheckReport) -> ArrayRecord:
    """``record`` (a silo's encrypted update) with ``report`` as its ``he-check`` entry."""
    out = ArrayRecord({name: array for name, array in record.items()})
    out[HE_CHECK] = _bytes_array(report.to_bytes(), CHECK_STYPE)
    return out


def check_report_of(record: ArrayRecord) -> CheckReport | None:
    """The check report in a silo's encrypted update; ``None``: it carries none.

    Raises
    ------
    InvalidUpdateError
        If the entry is not a check report.
    """
    entry = record.get(HE_CHECK)
    if entry is None:
        return None
    if entry.stype != CHECK_STYPE:
        raise InvalidUpdateError(f"{HE_CHECK} has stype {entry.stype!r}, expected {CHECK_STYPE!r}")
    return CheckReport.from_bytes(bytes(entry.data))


def answer_check_requests(
    requests: Sequence[CheckRequest],
    record: ArrayRecord,
    *,
    keys: CKKSKeys,
    checker: UpdateChecker,
    reference: Mapping[str, object],
) -> tuple[ArrayRecord, float]:
    """A silo's answer: decrypt each contribution it was sent, report its norm and the
    norm of ``reference`` (the model the silo trains from) inside ``record``, its
    encrypted update, so that its signature covers them.

    Parameters
    ----------
    requests : sequence of CheckRequest
        From :func:`check_requests_of`; all of one round (the first one's is answered).
    record : ArrayRecord
        The silo's encrypted update.
    keys, checker : CKKSKeys, UpdateChecker
        The silo's secret keys and its checker of encrypted updates.
    reference : Mapping[str, array-like]
        The model the silo trains from this round (tensors or arrays).

    Returns
    -------
    tuple of (ArrayRecord, float)
        The update with its report, and the seconds the checks took.
    """
    start = time.perf_counter()
    bad_round = requests[0].bad_round
    norms = {
        r.silo: contribution_norm(keys, checker, r.update)
        for r in requests
        if r.bad_round == bad_round
    }
    total = math.fsum(_squared_norm(value) for value in reference.values())
    report = CheckReport(bad_round=bad_round, reference=math.sqrt(total), norms=norms)
    return with_check_report(record, report), time.perf_counter() - start


def _squared_norm(value: object) -> float:
    flat = np.asarray(value, dtype=np.float64).ravel()
    return float(np.dot(flat, flat))


def _bytes_array(data: bytes, stype: str) -> Array:
    return Array(dtype="uint8", shape=(len(data),), stype=stype, data=data)
