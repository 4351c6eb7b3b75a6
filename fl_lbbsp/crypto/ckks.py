"""Encrypted model updates: weighted, chunked CKKS ciphertexts that the server only adds.

A party (silo in FL mode, worker in cluster mode) multiplies its flattened update ``u_i``
by its weight ``w_i = n_i / S`` in plaintext (``n_i``: local dataset size in FL, batch size
in cluster mode; ``S``: the total the server announces, so values stay well inside the
range the scale allows) and encrypts it in chunks of N/2 slots. The server checks every
update (key fingerprint, chunk count, byte sizes, digests, ciphertext structure) and adds
the ciphertexts chunk by chunk with the same weighted-sum code as plaintext aggregation,
each at weight 1, so nothing is ever multiplied under encryption. It returns
``sum_i Enc(w_i u_i)`` with the plaintext ``sum_i w_i`` of the parties that replied; they
decrypt and divide, which is exactly the weighted average of the updates actually summed
(a dropped party needs no re-normalisation).

References: Cheon et al., ASIACRYPT 2017 (CKKS); Chen et al., IEEE TCC 2021, Sec. 3.4-3.5
(weighted aggregation by dataset or batch size); Zhang et al., "BatchCrypt", USENIX ATC
2020 (HE for cross-silo FL).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import tenseal as ts

from ..core.aggregation import weighted_sum
from .check_report import CheckReport, InvalidUpdateError
from .keys import CKKSKeys

__all__ = [
    "FORMAT",
    "EncryptedUpdate",
    "InvalidUpdateError",
    "NonFiniteUpdateError",
    "ParsedUpdate",
    "TensorSpec",
    "UpdateChecker",
    "aggregate_updates",
    "decrypt_update",
    "encrypt_update",
    "flatten",
    "unflatten",
]

FORMAT = "fl_lbbsp.ckks-update/1"

FloatArray = npt.NDArray[np.float64]


class NonFiniteUpdateError(ValueError):
    """An update with NaN or infinite values, refused before encryption."""


# ------------------------------------------------------------------------------ layout
@dataclass(frozen=True)
class TensorSpec:
    """Name, dtype and shape of one tensor of a flattened model."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def size(self) -> int:
        """Number of values."""
        return int(math.prod(self.shape))

    def to_json(self) -> list[Any]:
        """``[name, dtype, shape]``."""
        return [self.name, self.dtype, list(self.shape)]

    @classmethod
    def from_json(cls, item: Any) -> TensorSpec:
        """Inverse of :meth:`to_json`."""
        name, dtype, shape = item
        return cls(name=str(name), dtype=str(np.dtype(dtype)), shape=tuple(int(s) for s in shape))


Layout = tuple[TensorSpec, ...]


def flatten(arrays: Mapping[str, npt.ArrayLike]) -> tuple[FloatArray, Layout]:
    """Concatenate named arrays (in mapping order) into one float64 vector.

    Returns
    -------
    tuple of (numpy.ndarray, tuple of TensorSpec)
        The flat vector and the layout :func:`unflatten` needs to undo it.
    """
    parts: list[FloatArray] = []
    layout: list[TensorSpec] = []
    for name, value in arrays.items():
        arr = np.asarray(value)
        layout.append(TensorSpec(name=name, dtype=str(arr.dtype), shape=tuple(arr.shape)))
        parts.append(arr.astype(np.float64).ravel())
    flat = np.concatenate(parts) if parts else np.zeros(0)
    return flat, tuple(layout)


def unflatten(flat: npt.ArrayLike, layout: Layout) -> dict[str, npt.NDArray[Any]]:
    """Split a flat vector back into named arrays of the layout's shapes and dtypes.

    Integer tensors are rounded to the nearest integer.
    """
    values = np.asarray(flat, dtype=np.float64)
    total = sum(spec.size for spec in layout)
    if values.shape != (total,):
        raise ValueError(f"flat vector has {values.size} values, the layout needs {total}")
    out: dict[str, npt.NDArray[Any]] = {}
    offset = 0
    for spec in layout:
        part = values[offset : offset + spec.size].reshape(spec.shape)
        dtype = np.dtype(spec.dtype)
        if np.issubdtype(dtype, np.integer) or dtype == np.bool_:
            part = np.rint(part)
        out[spec.name] = part.astype(dtype)
        offset += spec.size
    return out


# ------------------------------------------------------------------------------ update
@dataclass(frozen=True)
class EncryptedUpdate:
    """Serialized CKKS ciphertexts of a weighted update, with its plaintext metadata.

    From a party it holds ``Enc(w_i u_i)`` and ``weight = w_i``; from the server
    ``sum_i Enc(w_i u_i)`` and ``weight = sum_i w_i``. Nothing in the metadata reveals a
    value of the update.

    Parameters
    ----------
    chunks : tuple of bytes
        One serialized CKKS vector per chunk of ``slots`` values (the last may be shorter).
    weight : float
        The plaintext weight (sum) the values were multiplied by.
    num_values : int
        Length of the flat update.
    fingerprint : str
        Fingerprint of the key the chunks are encrypted under.
    slots : int
        Values per chunk: N / 2.
    contributors : int (default: 1)
        Number of parties summed into it.
    layout : tuple of TensorSpec (default: ())
        Names, dtypes and shapes of the flattened tensors; empty for a bare vector.
    digests : tuple of str (default: computed)
        sha256 of each chunk, so corruption in transit is caught before decryption.
    """

    chunks: tuple[bytes, ...]
    weight: float
    num_values: int
    fingerprint: str
    slots: int
    contributors: int = 1
    layout: Layout = ()
    digests: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if not self.digests:
            object.__setattr__(self, "digests", tuple(_digest(c) for c in self.chunks))

    @property
    def nbytes(self) -> int:
        """Bytes of ciphertext (header excluded)."""
        return sum(len(c) for c in self.chunks)

    def header(self) -> bytes:
        """The plaintext metadata as JSON bytes."""
        return json.dumps(
            {
                "format": FORMAT,
                "weight": self.weight,
                "num_values": self.num_values,
                "fingerprint": self.fingerprint,
                "slots": self.slots,
                "contributors": self.contributors,
                "layout": [spec.to_json() for spec in self.layout],
                "digests": list(self.digests),
            },
            sort_keys=True,
        ).encode()

    @classmethod
    def from_parts(cls, header: bytes, chunks: Sequence[bytes]) -> EncryptedUpdate:
        """Rebuild an update from :meth:`header` and its chunks.

        Raises
        ------
        InvalidUpdateError
            If the header is not valid JSON of this format.
        """
        try:
            meta = json.loads(header)
            if meta.get("format") != FORMAT:
                raise ValueError(f"format {meta.get('format')!r}, expected {FORMAT!r}")
            return cls(
                chunks=tuple(bytes(c) for c in chunks),
                weight=float(meta["weight"]),
                num_values=int(meta["num_values"]),
                fingerprint=str(meta["fingerprint"]),
                slots=int(meta["slots"]),
                contributors=int(meta["contributors"]),
                layout=tuple(TensorSpec.from_json(item) for item in meta["layout"]),
                digests=tuple(str(d) for d in meta["digests"]),
            )
        except (ValueError, KeyError, TypeError, OverflowError) as err:
            raise InvalidUpdateError(f"unreadable header: {err}") from err


@dataclass(frozen=True)
class ParsedUpdate:
    """An update that passed :class:`UpdateChecker`, its chunks deserialized, with the
    silo's answers to the server's check requests (``None``: none)."""

    update: EncryptedUpdate
    vectors: tuple[ts.CKKSVector, ...]
    check: CheckReport | None = None


def encrypt_update(
    keys: CKKSKeys,
    values: npt.ArrayLike,
    *,
    weight: float,
    total: float = 1.0,
    max_contributors: int = 1,
    layout: Layout = (),
) -> EncryptedUpdate:
    """Weight a flat update in plaintext and encrypt it in chunks of N/2 slots.

    Parameters
    ----------
    keys : CKKSKeys
        The federation's keys: the secret context with symmetric encryption (the
        default), the public one suffices with asymmetric encryption.
    values : array-like
        The flat update ``u_i`` (parameters after local training in FL, the gradient in
        cluster mode).
    weight : float
        ``n_i``: local dataset size (FL) or batch size (cluster); finite and positive.
    total : float (default: 1.0)
        ``S``, the total announced by the server; the values encrypted are
        ``(n_i / S) * u_i``.
    max_contributors : int (default: 1)
        Number of parties whose updates will be summed: the encrypted values must leave
        room for that many in the range the scale allows.
    layout : tuple of TensorSpec (default: ())
        Tensor layout carried along in plaintext for the receivers.

    Raises
    ------
    NonFiniteUpdateError
        If ``values`` holds NaN or infinity (refused before anything is encrypted).
    ValueError
        On a weight or total that is not finite and positive, or values too large for the
        scale once summed over ``max_contributors`` parties.
    """
    flat = np.asarray(values, dtype=np.float64).ravel()
    if flat.size == 0:
        raise ValueError("cannot encrypt an empty update")
    bad = ~np.isfinite(flat)
    if bad.any():
        first = int(np.argmax(bad))
        raise NonFiniteUpdateError(
            f"update has {int(bad.sum())} NaN/inf values (first at index {first}"
            f"{_tensor_of(first, layout)}); refusing to encrypt it"
        )
    for name, number in (("weight", weight), ("total", total)):
        if isinstance(number, bool) or not math.isfinite(number) or number <= 0:
            raise ValueError(f"{name} must be finite and positive, got {number!r}")
    if layout and sum(spec.size for spec in layout) != flat.size:
        raise ValueError(f"layout describes {sum(s.size for s in layout)} values, got {flat.size}")
    w = float(weight) / float(total)
    scaled = flat * w
    limit = keys.config.max_abs_value / 2 / max(1, int(max_contributors))
    peak = float(np.max(np.abs(scaled))) if scaled.size else 0.0
    if peak > limit:
        raise ValueError(
            f"weighted update reaches |{peak:.4g}|, above {limit:.4g} = half the CKKS range "
            f"2^{keys.config.data_bits - keys.config.scale_bits - 1} shared by "
            f"{max_contributors} parties; announce a larger total S or use more data bits"
        )
    slots = keys.config.slots
    # TenSEAL encodes a Python list about twice as fast as a numpy array.
    chunks = tuple(
        ts.ckks_vector(keys.context, scaled[start : start + slots].tolist()).serialize()
        for start in range(0, scaled.size, slots)
    )
    return EncryptedUpdate(
        chunks=chunks,
        weight=w,
        num_values=int(flat.size),
        fingerprint=keys.fingerprint,
        slots=slots,
        layout=tuple(layout),
    )


class UpdateChecker:
    """Checks encrypted updates against the federation's key before they are summed.

    Used by the server on every reply and by the parties on the aggregate they receive.
    Each check that fails raises :class:`InvalidUpdateError` with the reason.

    Parameters
    ----------
    keys : CKKSKeys
        The federation's keys; the public context is enough.
    num_values : int | None (default: None)
        Expected length of the flat update; ``None`` accepts any.
    layout : tuple of TensorSpec | None (default: None)
        Expected tensor layout; ``None`` accepts any.

    Notes
    -----
    A fresh ciphertext is 2 polynomials of N coefficients per data prime, stored in 8-byte
    words (``raw = 16 * N * data_primes`` bytes) plus a small header; SEAL may compress the
    unused high bits of each word, never below the ``2 * N * data_bits / 8`` bytes of
    information the coefficients carry. Chunks outside ``[0.99 * that, raw + 1024]`` are
    rejected before parsing.
    """

    def __init__(
        self,
        keys: CKKSKeys,
        *,
        num_values: int | None = None,
        layout: Layout | None = None,
    ) -> None:
        self.keys = keys
        self.num_values = num_values
        self.layout = layout
        config = keys.config
        degree = config.poly_modulus_degree
        raw = 16 * degree * (len(config.coeff_mod_bit_sizes) - 1)
        self.chunk_bytes = (int(0.99 * 2 * degree * config.data_bits / 8), raw + 1024)
        self._parms_id = list(keys.context.seal_context().data.first_parms_id())
        self._scale = config.scale

    def check(self, update: EncryptedUpdate) -> ParsedUpdate:
        """Validate ``update`` and deserialize its chunks.

        Checks, in order: key fingerprint, slots, length and layout, plaintext weight and
        contributor count, chunk count, then per chunk its byte size, sha256 digest,
        deserialization, ciphertext parameters (level, scale, size) and value count.
        """
        keys = self.keys
        if update.fingerprint != keys.fingerprint:
            raise InvalidUpdateError(
                f"encrypted under another key (fingerprint {update.fingerprint[:16]}..., "
                f"federation key {keys.fingerprint[:16]}...)"
            )
        if update.slots != keys.config.slots:
            raise InvalidUpdateError(
                f"{update.slots} slots per chunk, expected {keys.config.slots}"
            )
        if self.num_values is not None and update.num_values != self.num_values:
            raise InvalidUpdateError(f"{update.num_values} values, the model has {self.num_values}")
        if self.layout is not None and update.layout != self.layout:
            raise InvalidUpdateError("tensor layout differs from the model's")
        if not math.isfinite(update.weight) or update.weight <= 0:
            raise InvalidUpdateError(f"weight must be finite and positive, got {update.weight!r}")
        if update.num_values < 1:
            raise InvalidUpdateError(f"{update.num_values} values, expected at least 1")
        if update.contributors < 1:
            raise InvalidUpdateError(f"contributor count {update.contributors} is below 1")
        expected = -(-update.num_values // update.slots)
        if len(update.chunks) != expected or len(update.digests) != expected:
            raise InvalidUpdateError(
                f"{len(update.chunks)} chunks ({len(update.digests)} digests), expected "
                f"{expected} for {update.num_values} values"
            )
        vectors = []
        for k, (chunk, digest) in enumerate(zip(update.chunks, update.digests, strict=True)):
            vectors.append(self._chunk(k, chunk, digest, update))
        return ParsedUpdate(update=update, vectors=tuple(vectors))

    def _chunk(self, k: int, chunk: bytes, digest: str, update: EncryptedUpdate) -> ts.CKKSVector:
        low, high = self.chunk_bytes
        if not low <= len(chunk) <= high:
            raise InvalidUpdateError(
                f"chunk {k} has {len(chunk)} bytes; a ciphertext with these parameters has "
                f"{low} to {high}"
            )
        if _digest(chunk) != digest:
            raise InvalidUpdateError(f"chunk {k} is corrupted (sha256 does not match the header)")
        try:
            vector = ts.ckks_vector_from(self.keys.context, chunk)
            ciphertexts = vector.ciphertext()
        except Exception as err:  # noqa: BLE001 - TenSEAL raises plain ValueError/RuntimeError
            raise InvalidUpdateError(f"chunk {k} is not a CKKS ciphertext: {err}") from err
        if len(ciphertexts) != 1:
            raise InvalidUpdateError(f"chunk {k} holds {len(ciphertexts)} ciphertexts, expected 1")
        ciphertext = ciphertexts[0]
        if list(ciphertext.parms_id()) != self._parms_id:
            raise InvalidUpdateError(
                f"chunk {k} is at another modulus level than fresh ciphertexts"
            )
        if ciphertext.size() != 2 or float(ciphertext.scale) != self._scale:
            raise InvalidUpdateError(
                f"chunk {k} has size {ciphertext.size()} and scale {ciphertext.scale:.6g}, "
                f"expected 2 and {self._scale:.6g}"
            )
        length = min(update.slots, update.num_values - k * update.slots)
        if vector.size() != length:
            raise InvalidUpdateError(f"chunk {k} holds {vector.size()} values, expected {length}")
        return vector


def aggregate_updates(keys: CKKSKeys, parsed: Sequence[ParsedUpdate]) -> EncryptedUpdate:
    """Add checked updates chunk by chunk: ``sum_i Enc(w_i u_i)`` and ``sum_i w_i``.

    The ciphertexts go through :func:`fl_lbbsp.core.aggregation.weighted_sum` at weight 1
    each: additions only, no multiplication under encryption.

    Parameters
    ----------
    keys : CKKSKeys
        The federation's keys (public context).
    parsed : sequence of ParsedUpdate
        Updates that passed the same :class:`UpdateChecker`.
    """
    if not parsed:
        raise ValueError("cannot aggregate zero updates")
    first = parsed[0].update
    for p in parsed[1:]:
        if (p.update.num_values, p.update.layout) != (first.num_values, first.layout):
            raise ValueError("updates of different shapes cannot be summed")
    ones = [1.0] * len(parsed)
    chunks = tuple(
        weighted_sum([p.vectors[k] for p in parsed], ones).serialize()
        for k in range(len(first.chunks))
    )
    return EncryptedUpdate(
        chunks=chunks,
        weight=math.fsum(p.update.weight for p in parsed),
        num_values=first.num_values,
        fingerprint=keys.fingerprint,
        slots=first.slots,
        contributors=sum(p.update.contributors for p in parsed),
        layout=first.layout,
    )


def decrypt_update(
    keys: CKKSKeys, update: EncryptedUpdate, *, checker: UpdateChecker | None = None
) -> FloatArray:
    """Decrypt an (aggregated) update and divide by its plaintext weight.

    Returns ``sum_i w_i u_i / sum_i w_i``: the weighted average of the updates summed.

    Parameters
    ----------
    keys : CKKSKeys
        Keys holding the secret key.
    update : EncryptedUpdate
        The update; it is checked first (fingerprint, chunks, digests).
    checker : UpdateChecker | None (default: None)
        Checker to reuse; ``None`` makes one for ``keys``.

    Raises
    ------
    InvalidUpdateError
        If the update fails the checks.
    ValueError
        If ``keys`` holds no secret key.
    """
    if not keys.is_private:
        raise ValueError("decryption needs the secret context; these keys are public only")
    parsed = (checker or UpdateChecker(keys)).check(update)
    parts = [np.asarray(vector.decrypt(), dtype=np.float64) for vector in parsed.vectors]
    flat = np.concatenate(parts) if parts else np.zeros(0)
    return flat[: update.num_values] / update.weight


def _digest(chunk: bytes) -> str:
    return hashlib.sha256(chunk).hexdigest()


def _tensor_of(index: int, layout: Layout) -> str:
    offset = 0
    for spec in layout:
        if index < offset + spec.size:
            return f", tensor {spec.name!r}"
        offset += spec.size
    return ""
