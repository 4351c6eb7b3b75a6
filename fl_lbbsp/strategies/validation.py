"""Reply checks on Flower's record types; the rest of screening is in the core.

The round engine (:mod:`fl_lbbsp.core.round.engine`) screens every train reply with the pure
checks of :mod:`fl_lbbsp.security.screening`; this module adds what needs Flower's types (the
layout of an ArrayRecord, a reply's size from its buffers, its arrays against the global
model's layout) and the one-line log of a rejected reply or a skipped round.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from functools import partial
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from ..contract import (
    DECORATOR_USAGE,
    MAX_SUMMARY,
    InvalidReplyError,
    RecordKeys,
    error_summary,
    few,
)
from ..core.round.state import Reply
from ..security.identity import IdentityError, check_silo_id, signed_arrays
from ..security.reply_screen import ReplyScreen
from ..security.screening import ArraySpec, Layout, check_finite, check_npy
from ..telemetry import TelemetryWriter

__all__ = [
    "check_array_record",
    "config_record",
    "layout_of",
    "log_rejected",
    "log_skipped",
    "reply_nbytes",
    "reply_of",
    "split_records",
    "screen_evaluations",
]

log = logging.getLogger("fl_lbbsp")

NUMPY_STYPE = Array(np.zeros(0)).stype
"""How Flower marks an array serialised from numpy (its own constant is not public API)."""


def layout_of(record: ArrayRecord) -> Layout | None:
    """The layout of ``record``'s numpy arrays; ``None`` if one is not a numpy array
    (an encrypted update, a custom serialisation). Reads metadata only."""
    specs = []
    for name, array in record.items():
        if array.stype != NUMPY_STYPE:
            return None
        specs.append(ArraySpec(name, np.dtype(array.dtype), tuple(int(n) for n in array.shape)))
    return tuple(specs)


def config_record(content: RecordDict, name: str) -> ConfigRecord | None:
    """The reply's ConfigRecord ``name`` (``None``: absent, or not a ConfigRecord), read
    directly (``content.config_records`` builds a view of every ConfigRecord per access)."""
    record = content.get(name)
    return record if isinstance(record, ConfigRecord) else None


def split_records(
    content: RecordDict,
) -> tuple[dict[str, ArrayRecord], dict[str, MetricRecord], dict[str, ConfigRecord]]:
    """A reply's ArrayRecords, MetricRecords and ConfigRecords by name, in one pass
    (Flower builds a new view at every access of ``content.metric_records``)."""
    arrays: dict[str, ArrayRecord] = {}
    metrics: dict[str, MetricRecord] = {}
    configs: dict[str, ConfigRecord] = {}
    for name, record in content.items():
        if isinstance(record, ArrayRecord):
            arrays[name] = record
        elif isinstance(record, MetricRecord):
            metrics[name] = record
        elif isinstance(record, ConfigRecord):
            configs[name] = record
    return arrays, metrics, configs


def reply_nbytes(content: RecordDict) -> int:
    """Approximate serialised size of a reply, from its buffers' lengths (no copy).

    Array data, metadata strings, record keys, strings and bytes count with their length,
    numbers with 8 bytes each.
    """
    return _nbytes(*split_records(content))


def _nbytes(
    arrays: Mapping[str, ArrayRecord],
    metrics: Mapping[str, MetricRecord],
    configs: Mapping[str, ConfigRecord],
) -> int:
    total = 0
    for name, record in arrays.items():
        total += len(name)
        for key, array in record.items():
            total += len(key) + len(array.data) + len(array.dtype) + len(array.stype)
            total += 8 * len(array.shape)
    records: list[tuple[str, Mapping[str, Any]]] = [*metrics.items(), *configs.items()]
    for name, values in records:
        total += len(name) + sum(len(key) + _value_nbytes(v) for key, v in values.items())
    return total


def _value_nbytes(value: object) -> int:
    if isinstance(value, str | bytes):
        return len(value)
    if isinstance(value, list):
        return sum(_value_nbytes(v) for v in value)
    return 8


def check_array_record(record: ArrayRecord, layout: Layout) -> list[np.ndarray]:
    """Check a reply's arrays against the global model's layout, then for NaN and inf.

    Returns
    -------
    list of numpy.ndarray
        Read-only, zero-copy views of the values, in the layout's order and shapes.

    Raises
    ------
    InvalidReplyError
        On a missing or extra array, a non-numpy array, metadata or an npy header that
        differs from the layout in shape or dtype, a data length that does not match, or a
        NaN or inf value.
    """
    expected = [spec.name for spec in layout]
    names = list(record.keys())
    if set(names) != set(expected):
        missing = [n for n in expected if n not in record]
        extra = [n for n in names if n not in set(expected)]
        parts = []
        if missing:
            parts.append(f"missing arrays {few(missing)}")
        if extra:
            parts.append(f"unexpected arrays {few(extra)}")
        raise InvalidReplyError("; ".join(parts))
    views = []
    for spec in layout:
        array = record[spec.name]
        _check_metadata(array, spec)
        views.append((spec.name, check_npy(array.data, spec)))
    check_finite(views)
    return [values.reshape(spec.shape) for (_, values), spec in zip(views, layout, strict=True)]


def _check_metadata(array: Array, spec: ArraySpec) -> None:
    if array.stype != NUMPY_STYPE:
        raise InvalidReplyError(
            f"array {spec.name!r} has serialisation {array.stype!r}, expected {NUMPY_STYPE!r}"
        )
    try:
        dtype = np.dtype(array.dtype)
        shape = tuple(int(n) for n in array.shape)
    except (TypeError, ValueError) as err:
        raise InvalidReplyError(f"array {spec.name!r} has unreadable metadata ({err})") from err
    if dtype != spec.dtype or shape != spec.shape:
        raise InvalidReplyError(
            f"array {spec.name!r} is declared {dtype}{list(shape)}, the global model has "
            f"{spec.dtype}{list(spec.shape)}"
        )


def log_rejected(
    telemetry: TelemetryWriter,
    *,
    scheme: str,
    server_round: int,
    silo: str,
    node: int | str,
    reason: str,
    first: bool = True,
) -> dict[str, Any]:
    """One warning line (DEBUG when not ``first`` for this silo and cause) and one
    ``rejected`` telemetry event for a reply left out of a round; returns the event's
    ``silo``, ``node`` and ``reason``. A reason of several lines (a traceback) is logged in
    full at DEBUG only; the warning and the event carry its :func:`error_summary`.
    """
    summary = reason if "\n" not in reason.strip() else error_summary(reason)
    summary = summary if len(summary) <= MAX_SUMMARY else summary[:MAX_SUMMARY] + "..."
    if summary != reason:
        log.debug(
            "round %d: reply of silo %s (node %s), in full: %s", server_round, silo, node, reason
        )
    log.log(
        logging.WARNING if first else logging.DEBUG,
        "round %d: reply of silo %s (node %s) rejected: %s; the round goes on without it"
        + ("" if not first else " (logged once per silo and cause)"),
        server_round,
        silo,
        node,
        summary,
    )
    entry = {"silo": silo, "node": node, "reason": summary}
    telemetry.write({"event": "rejected", "scheme": scheme, "round": server_round, **entry})
    return entry


def log_skipped(telemetry: TelemetryWriter, *, scheme: str, server_round: int, reason: str) -> None:
    """One warning and one ``skipped`` telemetry event for a round left without a new model."""
    log.warning("round %d skipped: %s; the global model stays as it was", server_round, reason)
    telemetry.write({"event": "skipped", "scheme": scheme, "round": server_round, "reason": reason})


_NO_PLAN = "missing 1 required positional argument: 'plan'"


def undecorated(reason: str | None) -> str | None:
    """An error reply's ``reason``, or, when the silo's train function takes ``plan`` but
    was not decorated (Flower called it without one), the decorator's own TypeError in one
    line (the traceback of Flower's call says nothing of the decorator)."""
    if reason is None or _NO_PLAN not in reason:
        return reason
    return (
        "TypeError: the train function takes 'plan' but is not decorated with "
        f"@lbbsp_train() (from fl_lbbsp.clients): {DECORATOR_USAGE}"
    )


def reply_of(
    msg: Message, *, keys: RecordKeys, sent_ids: set[str], seconds_late: float | None
) -> Reply:
    """What the round engine needs to know of a train reply (no values are read):
    ``sent_ids`` are the ids of the round's train messages (empty: nothing is stale),
    ``seconds_late`` how long after the deadline it came in (``None``: in time)."""
    meta = msg.metadata
    node = meta.src_node_id
    stale = bool(sent_ids) and meta.reply_to_message_id not in sent_ids
    if msg.has_error():
        reason = undecorated(msg.error.reason) or f"error code {msg.error.code}"
        return Reply(node=node, stale=stale, seconds_late=seconds_late, error=reason)
    arrays, metrics, configs = split_records(msg.content)
    record = configs.get(keys.silo_record)
    problem = None
    for kind, records in (("ArrayRecords", arrays), ("MetricRecords", metrics)):
        if len(records) != 1 and problem is None:
            problem = f"{len(records)} {kind} in the reply, expected 1"
    payload = None if problem else next(iter(arrays.values()))
    silo = None if record is None else record.get(keys.silo_id)
    if silo is not None:
        try:
            check_silo_id(silo, what=keys.silo_id)
        except IdentityError as err:  # never logged or kept: the node's own id names it
            silo, problem = None, problem or str(err)
    return Reply(
        node=node,
        stale=stale,
        seconds_late=seconds_late,
        silo=silo,
        metrics=None if problem else dict(next(iter(metrics.values()))),
        nbytes=_nbytes(arrays, metrics, configs),
        problem=problem,
        payload=payload,
        signature=None if record is None else record.get(keys.signature),
        signed_arrays=None if payload is None else partial(signed_arrays, payload),
    )


def screen_evaluations(
    replies: Iterable[Message], screen: ReplyScreen
) -> tuple[list[Message], list[tuple[Message, str]]]:
    """The evaluation replies Flower's aggregation can take, and the others with the
    reason: not one MetricRecord, a weight that is not a positive count, a value that is
    not a finite number, or keys other than the first valid reply's."""
    keys: set[str] | None = None
    usable: list[Message] = []
    rejected: list[tuple[Message, str]] = []
    for msg in replies:
        try:
            if msg.has_content():
                records = msg.content.metric_records
                if len(records) != 1:
                    raise InvalidReplyError(f"{len(records)} MetricRecords, expected 1")
                metrics = next(iter(records.values()))
                screen.check_evaluation(metrics)
                keys = set(metrics) if keys is None else keys
                if set(metrics) != keys:
                    raise InvalidReplyError(
                        f"metrics {sorted(metrics)} differ from the others' {sorted(keys)}"
                    )
        except InvalidReplyError as err:
            rejected.append((msg, f"evaluation: {err}"))
            continue
        usable.append(msg)
    return usable, rejected
