"""Validated CKKS parameters: ring degree, modulus chain and scale.

The server only ever adds ciphertexts, so no multiplication spends a level and the chain can
be as short as SEAL allows: one data prime that holds the scale plus headroom for the sum,
and the special prime (Cheon et al., "Homomorphic Encryption for Arithmetic of Approximate
Numbers", ASIACRYPT 2017; Microsoft SEAL's 128-bit security table for the total modulus).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = ["MAX_COEFF_MODULUS_BITS", "CKKSConfig"]

# Largest total coefficient modulus (bits) per ring degree for 128-bit classical security
# (HomomorphicEncryption.org standard, as enforced by Microsoft SEAL).
MAX_COEFF_MODULUS_BITS: dict[int, int] = {
    2048: 54,
    4096: 109,
    8192: 218,
    16384: 438,
    32768: 881,
}


class CKKSConfig(BaseModel):
    """CKKS encryption parameters for summing model updates.

    Parameters
    ----------
    poly_modulus_degree : int (default: 8192)
        Ring degree N, a power of two from 2048 to 32768; a ciphertext holds N/2 values.
    coeff_mod_bit_sizes : tuple of int (default: (60, 40))
        Bit sizes of the coefficient-modulus primes, each from 20 to 60. The last prime
        is SEAL's special (key-switching) prime; the others hold the data.
    scale_bits : int (default: 40)
        log2 of the CKKS scale: values are encoded as ``round(v * 2**scale_bits)``.
    min_headroom_bits : int (default: 8)
        Bits the data primes must offer above the scale: the largest encodable magnitude is
        ``2**(data_bits - scale_bits - 1)``, and the sum of every silo's weighted update
        must stay below it.
    encryption : {"symmetric", "asymmetric"} (default: "symmetric")
        ``"symmetric"``: silos encrypt with the secret key they hold anyway (to decrypt the
        sum); about twice as fast as public-key encryption with a tenth of the noise, and
        the server's context holds no key at all. ``"asymmetric"``: silos encrypt with the
        public key, which the server's context then also holds (so it could encrypt too).

    Raises
    ------
    pydantic.ValidationError
        On a ring degree that is not a supported power of two, a prime outside 20..60 bits,
        a chain longer than the ring degree allows at 128-bit security, or a chain too short
        for the scale; the message names the field and the value.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    poly_modulus_degree: int = Field(default=8192, strict=True)
    coeff_mod_bit_sizes: tuple[int, ...] = (60, 40)
    scale_bits: int = Field(default=40, ge=1, le=120, strict=True)
    min_headroom_bits: int = Field(default=8, ge=1, le=60, strict=True)
    encryption: Literal["symmetric", "asymmetric"] = "symmetric"

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
        if len(value) < 2:
            raise ValueError(
                "coeff_mod_bit_sizes needs at least two primes (data and special), "
                f"got {list(value)!r}"
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
        headroom = self.data_bits - self.scale_bits
        if headroom < self.min_headroom_bits:
            raise ValueError(
                f"coeff_mod_bit_sizes {list(self.coeff_mod_bit_sizes)} is too short for "
                f"scale_bits={self.scale_bits}: the data primes give {self.data_bits} bits, "
                f"{headroom} above the scale, fewer than min_headroom_bits="
                f"{self.min_headroom_bits}"
            )
        return self

    @property
    def slots(self) -> int:
        """Values per ciphertext: N / 2."""
        return self.poly_modulus_degree // 2

    @property
    def data_bits(self) -> int:
        """Bits of the data primes (every prime but the special one)."""
        return sum(self.coeff_mod_bit_sizes[:-1])

    @property
    def scale(self) -> float:
        """The CKKS scale ``2**scale_bits``."""
        return float(2**self.scale_bits)

    @property
    def max_abs_value(self) -> float:
        """Largest magnitude a decrypted sum can have: ``2**(data_bits - scale_bits - 1)``."""
        return float(2 ** (self.data_bits - self.scale_bits - 1))
