"""Validated CKKS parameters: ring degree, modulus chain, scale and the room for the sum.

The server multiplies each fresh ciphertext by a plaintext integer (its silo's weight) and
adds: an integer at scale 1 leaves the scale as it is, so no operation rescales and one
data prime suffices. Fresh ciphertexts are encrypted at that level (the special prime is
only SEAL's key level) and are seeded: only ``c0`` travels, ``c1`` is regenerated from a
seed (SEAL's symmetric ``Serializable``). Each complex slot carries two real values.

How the defaults follow from the error bound (numbers for N = 4096):

- Decrypting a fresh symmetric ciphertext gives ``m + e``, ``e`` with independent
  coefficients of standard deviation ``sigma = 3.2`` (SEAL's), plus the encoder's rounding
  (variance 1/12). In a slot the real and the imaginary part of ``e`` are each normal with
  standard deviation ``sigma_slot = sqrt(N/2 * (sigma^2 + 1/12))`` (the canonical
  embedding sums N coefficients times unit roots): 145 at N = 4096.
- The server's weighted sum ``sum_i w_i (u_i + e_i / Delta) / W`` carries the error
  ``sum_i w_i e_i / (Delta W)``, of standard deviation ``sigma_slot * sqrt(sum w_i^2) / W /
  Delta <= sigma_slot / Delta`` whatever the number of silos (equality when one silo
  holds all the weight): 100 silos cost no precision.
- A value lies more than ``t = 8`` standard deviations out with probability 1.2e-15, so
  over 1e8 parameters the aggregate's max error is below ``E = 8 sigma_slot / Delta`` except
  with probability 1e-7.
- The target is ``E <= 1e-6 * R / 2`` (a margin of 2) for every update whose range
  ``R = max - min`` is at least 1/8 (LeNet-5's initial range is 0.4): ``Delta >= 2^34.1``,
  so ``scale_bits = 35`` (E = 3.4e-8).
- The aggregate ``sum_i w_i u_i`` must stay below ``q0 / 4 >= 2^(data_bits - 2)`` in
  magnitude after scaling: with ``|u| <= 2^value_bits = 4`` and a 60-bit prime, the
  weights may sum to ``2^(60 - 2 - 35 - 2) = 2^21`` (2.1 million examples); the server
  coarsens larger weights by a common divisor (:func:`fl_lbbsp.crypto.ckks.integer_weights`).
- A 60-bit data prime and a 40-bit special prime total 100 bits, below the 109 that
  N = 4096 allows at 128-bit security, and a fresh seeded ciphertext carries
  ``N * 60 / 8`` bytes of ``c0`` for N values: 7.5 B/param before SEAL's compression.

References: Cheon et al., "Homomorphic Encryption for Arithmetic of Approximate Numbers",
ASIACRYPT 2017 (CKKS, its error in the canonical embedding); Microsoft SEAL 3.6+ (seeded
symmetric ciphertexts; the HomomorphicEncryption.org 128-bit table of total modulus bits).
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = ["ERROR_SIGMAS", "MAX_COEFF_MODULUS_BITS", "NOISE_SIGMA", "CKKSConfig"]

# Largest total coefficient modulus (bits) per ring degree for 128-bit classical security
# (HomomorphicEncryption.org standard, as enforced by Microsoft SEAL).
MAX_COEFF_MODULUS_BITS: dict[int, int] = {
    2048: 54,
    4096: 109,
    8192: 218,
    16384: 438,
    32768: 881,
}

NOISE_SIGMA = 3.2
"""Standard deviation of SEAL's encryption noise per coefficient."""

ERROR_SIGMAS = 8.0
"""Standard deviations of a slot's error taken as the bound of the aggregate's max error."""


class CKKSConfig(BaseModel):
    """CKKS encryption parameters for the server's weighted sums of model updates.

    Parameters
    ----------
    poly_modulus_degree : int (default: 4096)
        Ring degree N, a power of two from 2048 to 32768; a ciphertext holds N/2 complex
        slots, N real values.
    coeff_mod_bit_sizes : tuple of int (default: (60, 40))
        Bit sizes of the two coefficient-modulus primes, each from 20 to 60: the data prime
        (every ciphertext lives at its level) and SEAL's special prime (key level only).
    scale_bits : int (default: 35)
        log2 of the CKKS scale: values are encoded as ``round(v * 2**scale_bits)``.
    value_bits : int (default: 2)
        A silo refuses to encrypt a value above ``2**value_bits`` in magnitude (4): the
        bound the room for the weighted sum is sized by.
    min_weight_bits : int (default: 12)
        The data prime must leave room for weights summing to at least
        ``2**min_weight_bits``.

    Raises
    ------
    pydantic.ValidationError
        On a ring degree that is not a supported power of two, a chain that is not two
        primes of 20..60 bits, a chain longer than the ring degree allows at 128-bit
        security, or a data prime too short for the scale, the values and the weights; the
        message names the field and the value.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    poly_modulus_degree: int = Field(default=4096, strict=True)
    coeff_mod_bit_sizes: tuple[int, ...] = (60, 40)
    scale_bits: int = Field(default=35, ge=1, le=58, strict=True)
    value_bits: int = Field(default=2, ge=-20, le=40, strict=True)
    min_weight_bits: int = Field(default=12, ge=0, le=50, strict=True)

    @field_validator("poly_modulus_degree")
    @classmethod
    def _degree(cls, value: int) -> int:
        if value not in MAX_COEFF_MODULUS_BITS:
            raise ValueError(
                f"poly_modulus_degree must be one of {sorted(MAX_COEFF_MODULUS_BITS)}, "
                f"got {value!r}"
            )
        return value

    @field_validator("coeff_mod_bit_sizes")
    @classmethod
    def _chain(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if len(value) != 2:
            raise ValueError(
                "coeff_mod_bit_sizes needs exactly two primes, data and special (the server "
                "only adds and multiplies by integers: no level is ever spent), got "
                f"{list(value)!r}"
            )
        bad = [b for b in value if not 20 <= b <= 60]
        if bad:
            raise ValueError(
                f"coeff_mod_bit_sizes entries must be 20..60 bits, got {list(value)!r}"
            )
        return value

    @model_validator(mode="after")
    def _fits(self) -> CKKSConfig:
        limit = MAX_COEFF_MODULUS_BITS[self.poly_modulus_degree]
        total = sum(self.coeff_mod_bit_sizes)
        if total > limit:
            raise ValueError(
                f"coeff_mod_bit_sizes {list(self.coeff_mod_bit_sizes)} total {total} bits, "
                f"above the {limit} bits poly_modulus_degree={self.poly_modulus_degree} "
                "allows at 128-bit security"
            )
        if self.weight_bits < self.min_weight_bits:
            raise ValueError(
                f"coeff_mod_bit_sizes {list(self.coeff_mod_bit_sizes)} is too short for "
                f"scale_bits={self.scale_bits} and value_bits={self.value_bits}: the "
                f"{self.data_bits}-bit data prime leaves room for weights summing to "
                f"2^{self.weight_bits}, below min_weight_bits={self.min_weight_bits}"
            )
        return self

    @property
    def slots(self) -> int:
        """Complex slots per ciphertext: N / 2."""
        return self.poly_modulus_degree // 2

    @property
    def values_per_ciphertext(self) -> int:
        """Real values per ciphertext: two per slot, N."""
        return self.poly_modulus_degree

    @property
    def data_bits(self) -> int:
        """Bits of the data prime (the level every ciphertext is at)."""
        return self.coeff_mod_bit_sizes[0]

    @property
    def scale(self) -> float:
        """The CKKS scale ``2**scale_bits``."""
        return float(2**self.scale_bits)

    @property
    def max_abs_value(self) -> float:
        """Largest magnitude a silo may encrypt: ``2**value_bits``."""
        return float(2.0**self.value_bits)

    @property
    def weight_bits(self) -> int:
        """log2 of the largest sum of weights: the data prime ``q0 >= 2^(data_bits - 1)``
        must hold ``|sum_i w_i u_i| * Delta`` below ``q0 / 2``."""
        return self.data_bits - 2 - self.scale_bits - self.value_bits

    @property
    def max_weight_total(self) -> int:
        """Largest sum of the integer weights the server may apply: ``2**weight_bits``."""
        return int(2**self.weight_bits)

    @property
    def error_bound(self) -> float:
        """Bound on the aggregate's max absolute error (module docstring):
        ``8 * sqrt(N/2 * (3.2^2 + 1/12)) / 2**scale_bits``."""
        sigma_slot = math.sqrt(self.slots * (NOISE_SIGMA**2 + 1.0 / 12.0))
        return ERROR_SIGMAS * sigma_slot / self.scale
