"""Array screening in pure numpy: a reply's update (and a global model a silo receives)
checked without Flower, each check raising :class:`~fl_lbbsp.contract.InvalidReplyError`
with a reason a person can act on. An npy header (shape, dtype, data length) is compared
with the global model's layout before any value is touched, then the values are checked
for NaN and inf on zero-copy views of the received bytes.
"""

from __future__ import annotations

import functools
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.lib import format as npy

from ..contract import InvalidReplyError, RecordKeys

__all__ = [
    "ArraySpec",
    "Layout",
    "check_finite",
    "check_npy",
    "check_npy_list",
    "contract_metric_keys",
    "layout_of_npy",
    "model_norm",
    "model_problem",
]

_NPY_HEADER_MAX = 10_000  # numpy's own default limit on an npy header
_FINITE_CHUNK = 1 << 20  # values per isfinite() pass: bounds the temporary bool array


@dataclass(frozen=True)
class ArraySpec:
    """Name, dtype and shape of one array of the global model (no values).

    Parameters
    ----------
    name : str
        Key in the ArrayRecord.
    dtype : numpy.dtype
        Element type.
    shape : tuple of int
        Array shape.
    """

    name: str
    dtype: np.dtype[Any]
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        """Bytes of the array's values."""
        return math.prod(self.shape) * self.dtype.itemsize

    @functools.cached_property
    def npy_header(self) -> bytes:
        """The npy header numpy writes for an array of this shape and dtype (C order)."""
        buffer = io.BytesIO()
        header = {"descr": npy.dtype_to_descr(self.dtype), "fortran_order": False}
        npy.write_array_header_1_0(buffer, {**header, "shape": self.shape})
        return buffer.getvalue()


Layout = tuple[ArraySpec, ...]


def _read_header(data: bytes, name: str) -> tuple[tuple[int, ...], np.dtype[Any], int]:
    """Shape, dtype and data offset from an npy buffer's header (nothing else is read)."""
    fp = io.BytesIO(data)
    try:
        version = npy.read_magic(fp)
        if version == (1, 0):
            shape, _, dtype = npy.read_array_header_1_0(fp, max_header_size=_NPY_HEADER_MAX)
        elif version == (2, 0):
            shape, _, dtype = npy.read_array_header_2_0(fp, max_header_size=_NPY_HEADER_MAX)
        else:
            raise ValueError(f"npy format version {version}")
    except (ValueError, TypeError, SyntaxError) as err:
        raise InvalidReplyError(f"array {name!r} is not a numpy array ({err})") from err
    return tuple(shape), dtype, fp.tell()


def check_npy(data: bytes, spec: ArraySpec) -> np.ndarray:
    """Check that ``data`` is an npy buffer of exactly ``spec``'s shape and dtype.

    The header is read and the data length compared before anything is allocated, so a
    reply that claims a huge shape costs nothing.

    Returns
    -------
    numpy.ndarray
        A read-only, zero-copy view of the values (flat, in file order).

    Raises
    ------
    InvalidReplyError
        If the buffer is not an npy array of this shape and dtype, or has more or fewer
        bytes than its header says.
    """
    header = spec.npy_header
    if len(data) == len(header) + spec.nbytes and data.startswith(header):
        # the header numpy writes for this layout, to the byte: nothing to parse
        return np.frombuffer(
            data, dtype=spec.dtype, count=math.prod(spec.shape), offset=len(header)
        )
    shape, dtype, offset = _read_header(data, spec.name)
    if dtype != spec.dtype:
        raise InvalidReplyError(
            f"array {spec.name!r} has dtype {dtype}, the global model has {spec.dtype}"
        )
    if shape != spec.shape:
        raise InvalidReplyError(
            f"array {spec.name!r} has shape {shape}, the global model has {spec.shape}"
        )
    if len(data) - offset != spec.nbytes:
        raise InvalidReplyError(
            f"array {spec.name!r} carries {len(data) - offset} bytes of values, its shape "
            f"and dtype need {spec.nbytes}"
        )
    return np.frombuffer(data, dtype=dtype, count=math.prod(spec.shape), offset=offset)


def layout_of_npy(tensors: Sequence[bytes]) -> Layout | None:
    """The layout of a list of npy buffers (legacy ``Parameters``), arrays named by their
    position; ``None`` if one is not an npy buffer. Reads the headers only."""
    try:
        headers = [_read_header(tensor, str(k)) for k, tensor in enumerate(tensors)]
    except InvalidReplyError:
        return None
    return tuple(ArraySpec(str(k), dtype, shape) for k, (shape, dtype, _) in enumerate(headers))


def check_npy_list(tensors: Sequence[bytes], layout: Layout) -> None:
    """Check legacy ``Parameters.tensors`` against the global model's layout, then for NaN
    and inf (see :func:`check_array_record`)."""
    if len(tensors) != len(layout):
        raise InvalidReplyError(f"{len(tensors)} arrays, the global model has {len(layout)}")
    check_finite([(spec.name, check_npy(t, spec)) for t, spec in zip(tensors, layout, strict=True)])


def _finite(values: np.ndarray) -> bool:
    if values.dtype.kind not in "fc":
        return True
    if values.dtype.itemsize <= 4 and values.dtype.kind == "f":
        # A float64 sum of float16/32 values cannot overflow (3.4e38 times any array size
        # stays far below 1.8e308):
        # it is finite exactly when every value is, and it allocates nothing.
        return math.isfinite(float(np.add.reduce(values, dtype=np.float64)))
    return all(
        bool(np.isfinite(values[k : k + _FINITE_CHUNK]).all())
        for k in range(0, values.size, _FINITE_CHUNK)
    )


def check_finite(views: list[tuple[str, np.ndarray]]) -> None:
    for name, values in views:
        if not _finite(values):
            raise InvalidReplyError(f"array {name!r} contains NaN or inf")


def model_problem(
    arrays: Sequence[np.ndarray],
    last: Sequence[np.ndarray] | None,
    *,
    max_ratio: float,
    accepted: Sequence[float] = (),
) -> str | None:
    """Why a silo must refuse a global model (a decrypted aggregate): NaN or inf, or a norm
    out of range; ``None`` for a usable model.

    Parameters
    ----------
    arrays : sequence of numpy.ndarray
        The model received.
    last : sequence of numpy.ndarray | None
        The silo's last model (``None``: it has none yet, only finiteness is checked).
    max_ratio : float
        The model's L2 norm must lie within ``[last / max_ratio, last * max_ratio]`` of
        the last model's (not checked when the last norm is 0), or within that range of
        one of the ``accepted`` norms.
    accepted : sequence of float (default: ())
        The norms of the global models the silo accepted in its last rounds: a server
        that rolls a diverged model back sends one of them again, far from the silo's
        last model (trained from the diverged one), and the silo must take it.
    """
    for k, values in enumerate(arrays):
        if not _finite(np.ravel(values)):
            return f"array {k} contains NaN or inf"
    if last is None:
        return None
    norm, before = model_norm(arrays), model_norm(last)
    near = [n for n in accepted if n > 0 and n / max_ratio <= norm <= n * max_ratio]
    if before > 0 and not before / max_ratio <= norm <= before * max_ratio and not near:
        return f"its norm {norm:.4g} is not within {max_ratio:g}x of the last model's {before:.4g}"
    return None


def model_norm(arrays: Sequence[np.ndarray]) -> float:
    """The L2 norm of a model over all its arrays (float64)."""
    total = sum(float(np.vdot(a, a).real) for a in (np.asarray(x, np.float64) for x in arrays))
    return math.sqrt(total) if math.isfinite(total) else math.inf


def contract_metric_keys(keys: RecordKeys) -> frozenset[str]:
    """Every metric the server-silo contract defines (shared/DESIGN.md)."""
    return frozenset(
        {
            keys.num_examples,
            keys.train_time,
            keys.batch_size,
            keys.samples_processed,
            keys.samples_drawn,
            keys.cpu_percent,
            keys.memory_percent,
            keys.max_batch_size,
            keys.he_time,
            keys.model_version,
        }
    )
