"""The model and array state of a checkpoint, checked against the strategy's model before
a resumed run starts from them.

A plaintext model must have the initial model's layout (names in order, shapes, dtypes),
hold only finite values and have an L2 norm at most :data:`MAX_MODEL_GROWTH` times the
initial model's: training moves a model far less than that, while a model of NaN, or of
values like 1e30, would make every silo refuse it and every later round be skipped. An
encrypted model (CKKS, whose values the server cannot read) must be a readable encrypted
record of the initial model's layout; a plaintext strategy refuses one. The array state
beside the model (the parameter server's momentum buffers, an encrypted parameter
server's initial model and kept aggregates) is checked the same way.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from flwr.app import ArrayRecord

from ..contract import is_encrypted
from .checkpoint_file import Checkpoint
from .checkpoint_schema import CheckpointInvalidError

__all__ = ["MAX_MODEL_GROWTH", "check_arrays"]

MAX_MODEL_GROWTH = 1000.0
"""Largest ratio of a checkpoint model's L2 norm to the initial model's (or to 1, when the
initial model's is smaller)."""

_OPTIMIZER = "optimizer"


def _refuse(where: str, field: str, reason: str) -> CheckpointInvalidError:
    return CheckpointInvalidError(f"{where}: invalid field {field}: {reason}", field=field)


def _layout(record: ArrayRecord) -> list[tuple[str, tuple[int, ...], str]]:
    return [(name, tuple(a.shape), str(a.dtype)) for name, a in record.items()]


def _values(record: ArrayRecord, where: str, field: str) -> list[np.ndarray]:
    """Every array of a plaintext record as numpy, each checked finite."""
    out = []
    for name, array in record.items():
        try:
            values = np.asarray(array.numpy())
        except Exception as err:  # noqa: BLE001 - bytes that are not an array
            raise _refuse(where, f"{field}.{name}", f"unreadable ({type(err).__name__})") from None
        if values.dtype.kind in "fc" and not np.isfinite(values).all():
            raise _refuse(where, f"{field}.{name}", "holds NaN or infinite values")
        out.append(values)
    return out


def _norm(values: Sequence[np.ndarray]) -> float:
    return math.sqrt(math.fsum(float(np.sum(np.square(v, dtype=np.float64))) for v in values))


def _check_encrypted(record: ArrayRecord, initial: ArrayRecord, where: str, field: str) -> None:
    from ..crypto.records import update_from_record  # tenseal: encrypted strategies only

    expected = _layout(initial)
    try:
        update = update_from_record(record)
    except Exception as err:  # noqa: BLE001 - any unreadable ciphertext record
        raise _refuse(where, field, f"not a readable encrypted model ({err})"[:300]) from None
    found = [(s.name, tuple(s.shape), str(np.dtype(s.dtype))) for s in update.layout]
    if found != expected:
        raise _refuse(where, field, "its encrypted layout is not the model's")


def check_arrays(
    checkpoint: Checkpoint,
    initial_arrays: ArrayRecord,
    *,
    encrypted: bool = False,
    max_growth: float = MAX_MODEL_GROWTH,
) -> None:
    """Refuse a checkpoint whose model (and array state) the strategy cannot take.

    The model (``arrays``): plaintext, the initial model's names in order, shapes and
    dtypes, every value finite, an L2 norm at most ``max_growth`` times the initial
    model's (or 1, if larger); encrypted (only for an ``encrypted`` strategy), a readable
    encrypted record of the initial model's layout. The array state, record by record:
    ``optimizer`` (momentum buffers) must have the model's shapes in order and finite,
    bounded values; a record of the model's names, or an encrypted one, is checked as a
    model; any other plaintext record must be finite. The plaintext records are checked
    first, the encrypted ones (decoded) last.

    Raises
    ------
    CheckpointInvalidError
        Naming the first array that fails, e.g. ``arrays.w: shape [3, 4], the model's is
        [30, 4]``.
    """
    where, names = str(checkpoint.path), list(initial_arrays)
    records = [("arrays", checkpoint.arrays)]
    records += [(f"records.{name[:40]}", record) for name, record in checkpoint.records.items()]
    sealed = []
    for field, record in records:
        if is_encrypted(record):
            if not encrypted:
                raise _refuse(where, field, "an encrypted model, but this strategy's is plaintext")
            sealed.append((field, record))
        elif field == "arrays" or list(record) == names:
            _check_plain(record, initial_arrays, where=where, field=field, max_growth=max_growth)
        elif field == f"records.{_OPTIMIZER}":
            shapes = [tuple(record[k].shape) for k in sorted(record)]
            if shapes != [tuple(initial_arrays[k].shape) for k in names]:
                raise _refuse(where, field, "momentum buffers not of the model's shapes")
            reference = _values(initial_arrays, where, "initial")
            _check_norm(_values(record, where, field), reference, where, field, max_growth)
        else:
            _values(record, where, field)
    for field, record in sealed:
        _check_encrypted(record, initial_arrays, where, field)


def _check_plain(
    arrays: ArrayRecord, initial: ArrayRecord, *, where: str, field: str, max_growth: float
) -> None:
    found, expected = _layout(arrays), _layout(initial)
    if [n for n, _, _ in found] != [n for n, _, _ in expected]:
        names = [n[:40] for n, _, _ in found][:8]
        raise _refuse(
            where, field, f"arrays {names} are not the model's {[n for n, _, _ in expected][:8]}"
        )
    for (name, shape, dtype), (_, want_shape, want_dtype) in zip(found, expected, strict=True):
        if shape != want_shape:
            raise _refuse(
                where, f"{field}.{name}", f"shape {list(shape)}, the model's is {list(want_shape)}"
            )
        if dtype != want_dtype:
            raise _refuse(where, f"{field}.{name}", f"dtype {dtype}, the model's is {want_dtype}")
    _check_norm(
        _values(arrays, where, field), _values(initial, where, "initial"), where, field, max_growth
    )


def _check_norm(
    values: Sequence[np.ndarray],
    initial: Sequence[np.ndarray],
    where: str,
    field: str,
    max_growth: float,
) -> None:
    norm, bound = _norm(values), max_growth * max(1.0, _norm(initial))
    if not norm <= bound:
        raise _refuse(
            where,
            field,
            f"L2 norm {norm:.4g} is over {bound:.4g} ({max_growth:g} times the initial "
            "model's, or 1)",
        )
