"""Encrypted model updates: unweighted seeded CKKS ciphertexts that the server weighs and adds.

A party (silo in FL mode, worker in cluster mode) encrypts its flattened update ``u_i``
as it is (:func:`encrypt_update`); the server checks every update
(:class:`UpdateChecker`), multiplies each by its party's integer weight ``w_i`` (the
capped dataset size in FL, the batch size in cluster mode: the weight it logs is the
weight it applies) and adds them with the weighted-sum code of plaintext aggregation
(:func:`aggregate_updates`); the parties decrypt ``sum_i w_i Enc(u_i)`` and divide by
the plaintext ``W = sum_i w_i`` (:func:`decrypt_update`), so a dropped party needs no
re-normalisation. An integer plaintext at scale 1 keeps the scale and the level: nothing
is rescaled and one data prime suffices (:mod:`fl_lbbsp.crypto.config`).

References: Cheon et al., ASIACRYPT 2017 (CKKS); Chen et al., IEEE TCC 2021, Sec. 3.4-3.5
(weighted aggregation by dataset or batch size); Zhang et al., "BatchCrypt", USENIX ATC
2020 (HE for cross-silo FL); Microsoft SEAL (seeded symmetric ciphertexts).
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
import tenseal.sealapi as sealapi

from ..core.aggregation import weighted_sum
from .check_report import CheckReport, InvalidUpdateError
from .keys import CKKSKeys
from .seal import Seal, load_ciphertext, save_object

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
    "integer_weights",
    "unflatten",
]

FORMAT = "fl_lbbsp.ckks-update/2"

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
    """Serialized CKKS ciphertexts of an update, with its plaintext metadata (which reveals
    no value of the update): a party's ``Enc(u_i)`` (seeded) at ``weight = 1``, or the
    server's ``sum_i w_i Enc(u_i)`` (full ciphertexts) at ``weight = W``.

    Parameters
    ----------
    chunks : tuple of bytes
        One serialized SEAL ciphertext per chunk of ``slots`` values (the last may hold
        fewer).
    weight : int
        The sum of the integer weights applied (1 for a party's own update).
    num_values : int
        Length of the flat update.
    fingerprint : str
        Fingerprint of the key the chunks are encrypted under.
    slots : int
        Real values per chunk: N (two per complex slot).
    contributors : int (default: 1)
        Number of parties summed into it.
    layout : tuple of TensorSpec (default: ())
        Names, dtypes and shapes of the flattened tensors; empty for a bare vector.
    digests : tuple of str (default: computed)
        sha256 of each chunk, so corruption in transit is caught before decryption.
    aggregate : bool (default: False)
        Whether the server made it (its chunks are full ciphertexts).
    """

    chunks: tuple[bytes, ...]
    weight: int
    num_values: int
    fingerprint: str
    slots: int
    contributors: int = 1
    layout: Layout = ()
    digests: tuple[str, ...] = field(default=())
    aggregate: bool = False

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
                "aggregate": self.aggregate,
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
            weight, aggregate = meta["weight"], meta["aggregate"]
            if not isinstance(weight, int) or isinstance(weight, bool):
                raise ValueError(f"weight {weight!r} is not an integer")
            if not isinstance(aggregate, bool):
                raise ValueError(f"aggregate {aggregate!r} is not a boolean")
            return cls(
                chunks=tuple(bytes(c) for c in chunks),
                weight=weight,
                num_values=int(meta["num_values"]),
                fingerprint=str(meta["fingerprint"]),
                slots=int(meta["slots"]),
                contributors=int(meta["contributors"]),
                layout=tuple(TensorSpec.from_json(item) for item in meta["layout"]),
                digests=tuple(str(d) for d in meta["digests"]),
                aggregate=aggregate,
            )
        except (ValueError, KeyError, TypeError, OverflowError) as err:
            raise InvalidUpdateError(f"unreadable header: {err}") from err


@dataclass(frozen=True)
class ParsedUpdate:
    """An update that passed :class:`UpdateChecker`, its chunks loaded as SEAL
    ciphertexts, with the silo's answers to the server's check requests (``None``: none)."""

    update: EncryptedUpdate
    vectors: tuple[Any, ...]
    check: CheckReport | None = None


def encrypt_update(
    keys: CKKSKeys, values: npt.ArrayLike, *, layout: Layout = ()
) -> EncryptedUpdate:
    """Encrypt a flat update as it is, in seeded symmetric ciphertexts of N values each.

    Values ``2j`` and ``2j + 1`` of a chunk are the real and imaginary part of slot ``j``;
    every ciphertext is at the data level (the one prime the sum needs).

    Parameters
    ----------
    keys : CKKSKeys
        The federation's secret keys.
    values : array-like
        The flat update ``u_i`` (parameters after local training in FL, the gradient in
        cluster mode), unweighted: the server applies the weight.
    layout : tuple of TensorSpec (default: ())
        Tensor layout carried along in plaintext for the receivers.

    Raises
    ------
    NonFiniteUpdateError
        If ``values`` holds NaN or infinity (refused before anything is encrypted).
    ValueError
        On keys without the secret key, or a value above ``2**value_bits`` in magnitude
        (the room for the weighted sum is sized by it).
    """
    if not keys.is_private:
        raise ValueError("encryption needs the secret context; these keys are public only")
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
    if layout and sum(spec.size for spec in layout) != flat.size:
        raise ValueError(f"layout describes {sum(s.size for s in layout)} values, got {flat.size}")
    config = keys.config
    peak = float(np.max(np.abs(flat)))
    if peak > config.max_abs_value:
        first = int(np.argmax(np.abs(flat) > config.max_abs_value))
        raise ValueError(
            f"update reaches |{peak:.4g}| (index {first}{_tensor_of(first, layout)}), above "
            f"2^{config.value_bits} = {config.max_abs_value:g}, the bound the CKKS keys are "
            "sized for; generate keys with a larger value_bits"
        )
    seal = keys.seal
    per = config.values_per_ciphertext
    chunks = tuple(
        _encrypt_chunk(seal, flat[start : start + per], config.scale)
        for start in range(0, flat.size, per)
    )
    return EncryptedUpdate(
        chunks=chunks,
        weight=1,
        num_values=int(flat.size),
        fingerprint=keys.fingerprint,
        slots=per,
        layout=tuple(layout),
    )


def _encrypt_chunk(seal: Seal, values: FloatArray, scale: float) -> bytes:
    if values.size % 2:
        values = np.append(values, 0.0)
    slots = (values[0::2] + 1j * values[1::2]).tolist()  # a list encodes faster than numpy
    plain = sealapi.Plaintext()
    seal.encoder.encode(slots, seal.parms_id, scale, plain)
    return save_object(seal.encryptor.encrypt_symmetric(plain))


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
    A ciphertext at the data level is ``k`` polynomials of N coefficients mod the data
    prime, stored in 8-byte words that SEAL compresses (zstd) to no less than the
    ``N * data_bits / 8`` bytes of information each carries: ``k = 1`` for a fresh seeded
    ciphertext (``c1`` is a seed), ``k = 2`` for an aggregate. Chunks outside ``[0.99 * k *
    N * data_bits / 8, k * 8 * N + 1024]`` bytes are rejected before parsing: an unseeded
    upload is twice that size and refused.
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
        self.chunk_bytes = {
            polys: (int(0.99 * polys * degree * config.data_bits / 8), polys * 8 * degree + 1024)
            for polys in (1, 2)
        }
        self._scale = config.scale

    def check(self, update: EncryptedUpdate) -> ParsedUpdate:
        """Validate ``update`` and load its chunks.

        Checks, in order: key fingerprint, values per chunk, length and layout, plaintext
        weight and contributor count, chunk count, then per chunk its byte size, sha256
        digest, deserialization (SEAL's own checks against the parameters), level, scale
        and size.
        """
        keys = self.keys
        config = keys.config
        if update.fingerprint != keys.fingerprint:
            raise InvalidUpdateError(
                f"encrypted under another key (fingerprint {update.fingerprint[:16]}..., "
                f"federation key {keys.fingerprint[:16]}...)"
            )
        if update.slots != config.values_per_ciphertext:
            raise InvalidUpdateError(
                f"{update.slots} values per chunk, expected {config.values_per_ciphertext}"
            )
        if self.num_values is not None and update.num_values != self.num_values:
            raise InvalidUpdateError(f"{update.num_values} values, the model has {self.num_values}")
        if self.layout is not None and update.layout != self.layout:
            raise InvalidUpdateError("tensor layout differs from the model's")
        if update.num_values < 1:
            raise InvalidUpdateError(f"{update.num_values} values, expected at least 1")
        if update.contributors < 1:
            raise InvalidUpdateError(f"contributor count {update.contributors} is below 1")
        if not update.aggregate and (update.weight, update.contributors) != (1, 1):
            raise InvalidUpdateError(
                f"a party's own update at weight {update.weight} of {update.contributors} "
                "contributors: it is sent unweighted (weight 1), the server weighs it"
            )
        if not update.contributors <= update.weight <= config.max_weight_total:
            raise InvalidUpdateError(
                f"weight {update.weight} is not an integer from {update.contributors} (the "
                f"contributors) to 2^{config.weight_bits}"
            )
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

    def _chunk(self, k: int, chunk: bytes, digest: str, update: EncryptedUpdate) -> Any:
        kind = "an aggregate" if update.aggregate else "a fresh seeded ciphertext"
        low, high = self.chunk_bytes[2 if update.aggregate else 1]
        if not low <= len(chunk) <= high:
            raise InvalidUpdateError(
                f"chunk {k} has {len(chunk)} bytes; {kind} at the data level of these "
                f"parameters has {low} to {high}"
            )
        if _digest(chunk) != digest:
            raise InvalidUpdateError(f"chunk {k} is corrupted (sha256 does not match the header)")
        seal = self.keys.seal
        try:
            ciphertext = load_ciphertext(seal.context, chunk)
        except Exception as err:  # noqa: BLE001 - SEAL raises plain ValueError/RuntimeError
            raise InvalidUpdateError(f"chunk {k} is not a CKKS ciphertext: {err}") from err
        if list(ciphertext.parms_id()) != seal.parms_id:
            raise InvalidUpdateError(
                f"chunk {k} is at another modulus level than the data level (or of other "
                "parameters)"
            )
        if (
            ciphertext.size() != 2
            or not ciphertext.is_ntt_form()
            or float(ciphertext.scale) != self._scale
        ):
            raise InvalidUpdateError(
                f"chunk {k} has size {ciphertext.size()} and scale {ciphertext.scale:.6g}, "
                f"expected 2 and {self._scale:.6g} in NTT form"
            )
        return ciphertext


class _Summand:
    """A SEAL ciphertext that :func:`~fl_lbbsp.core.aggregation.weighted_sum` can weigh by
    an integer and add."""

    def __init__(self, seal: Seal, ciphertext: Any) -> None:
        self.seal = seal
        self.ciphertext = ciphertext

    def __mul__(self, weight: float) -> _Summand:
        out = sealapi.Ciphertext()
        self.seal.evaluator.multiply_plain(self.ciphertext, self.seal.weight(int(weight)), out)
        return _Summand(self.seal, out)

    def __add__(self, other: _Summand) -> _Summand:
        out = sealapi.Ciphertext()
        self.seal.evaluator.add(self.ciphertext, other.ciphertext, out)
        return _Summand(self.seal, out)


def integer_weights(weights: Sequence[float], *, limit: int) -> tuple[list[int], int]:
    """The integer weights the server applies: each weight rounded (at least 1) and, if
    they sum above ``limit`` (the room the CKKS parameters leave), all divided by the
    smallest common divisor ``g`` that makes them fit.

    Parameters
    ----------
    weights : sequence of float
        The silos' weights after the server's cap (dataset sizes) or batch sizes;
        finite and positive.
    limit : int
        Largest sum allowed (``CKKSConfig.max_weight_total``).

    Returns
    -------
    tuple of (list of int, int)
        The integer weights and ``g`` (1: the weights as given, rounded).

    Raises
    ------
    ValueError
        On a weight that is not finite and positive, or more weights than ``limit``.
    """
    values = [float(w) for w in weights]
    if not values:
        raise ValueError("cannot weigh zero updates")
    for w in values:
        if not math.isfinite(w) or w <= 0:
            raise ValueError(f"aggregation weights must be finite and positive, got {w!r}")
    if len(values) > limit:
        raise ValueError(f"{len(values)} updates do not fit a weight total of {limit}")
    divisor = 1
    while True:
        rounded = [max(1, round(w / divisor)) for w in values]
        if sum(rounded) <= limit:
            return rounded, divisor
        divisor = max(divisor + 1, math.ceil(divisor * sum(rounded) / limit))


def aggregate_updates(
    keys: CKKSKeys, parsed: Sequence[ParsedUpdate], weights: Sequence[int]
) -> EncryptedUpdate:
    """``sum_i w_i Enc(u_i)`` chunk by chunk (:func:`fl_lbbsp.core.aggregation.weighted_sum`
    over the ciphertexts, at the one data level), with ``W = sum_i w_i`` in the clear.

    Parameters
    ----------
    keys : CKKSKeys
        The federation's keys (public context).
    parsed : sequence of ParsedUpdate
        Updates that passed the same :class:`UpdateChecker`.
    weights : sequence of int
        One positive integer weight per update (:func:`integer_weights`), summing to at
        most ``max_weight_total``.

    Raises
    ------
    ValueError
        On no update, updates of different shapes, or weights that are not positive
        integers within the room of the parameters.
    """
    if not parsed:
        raise ValueError("cannot aggregate zero updates")
    if len(weights) != len(parsed):
        raise ValueError(f"{len(parsed)} updates but {len(weights)} weights")
    integers = [int(w) for w in weights]
    if any(w != v or w < 1 for w, v in zip(integers, weights, strict=True)):
        raise ValueError(f"weights must be positive integers, got {list(weights)!r}")
    base = [p.update for p in parsed]
    total = sum(w * u.weight for w, u in zip(integers, base, strict=True))
    if total > keys.config.max_weight_total:
        raise ValueError(
            f"weights sum to {total}, above the 2^{keys.config.weight_bits} these CKKS "
            "parameters leave room for"
        )
    first = base[0]
    for u in base[1:]:
        if (u.num_values, u.layout) != (first.num_values, first.layout):
            raise ValueError("updates of different shapes cannot be summed")
    seal = keys.seal
    chunks = tuple(
        save_object(
            weighted_sum([_Summand(seal, p.vectors[k]) for p in parsed], integers).ciphertext
        )
        for k in range(len(first.chunks))
    )
    return EncryptedUpdate(
        chunks=chunks,
        weight=total,
        num_values=first.num_values,
        fingerprint=keys.fingerprint,
        slots=first.slots,
        contributors=sum(u.contributors for u in base),
        layout=first.layout,
        aggregate=True,
    )


def decrypt_update(
    keys: CKKSKeys, update: EncryptedUpdate, *, checker: UpdateChecker | None = None
) -> FloatArray:
    """Decrypt an (aggregated) update and divide by its plaintext weight: ``sum_i w_i u_i
    / sum_i w_i``, the weighted average of the updates summed.

    Parameters
    ----------
    keys : CKKSKeys
        Keys holding the secret key.
    update : EncryptedUpdate
        The update; it is checked first (fingerprint, chunks, digests, level).
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
    seal = keys.seal
    parts = []
    for ciphertext in parsed.vectors:
        plain = sealapi.Plaintext()
        seal.decryptor.decrypt(ciphertext, plain)
        slots = np.asarray(seal.encoder.decode_complex(plain), dtype=np.complex128)
        parts.append(np.stack([slots.real, slots.imag], axis=1).ravel())
    flat = np.concatenate(parts)
    return flat[: update.num_values] / float(update.weight)


def _digest(chunk: bytes) -> str:
    return hashlib.sha256(chunk).hexdigest()


def _tensor_of(index: int, layout: Layout) -> str:
    offset = 0
    for spec in layout:
        if index < offset + spec.size:
            return f", tensor {spec.name!r}"
        offset += spec.size
    return ""
