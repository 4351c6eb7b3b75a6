"""Microsoft SEAL's objects under a TenSEAL context, and their bytes.

TenSEAL's vectors always encrypt at the top of the chain and serialize both polynomials of
a ciphertext; SEAL itself (``tenseal.sealapi``) encrypts at any level and, with the
secret key, returns a seeded ``Serializable`` whose ``c1`` is a PRNG seed. This module
holds one SEAL encoder, evaluator and (on silos) encryptor and decryptor per key, and moves
SEAL objects to and from bytes through a scratch file (the bindings save and load paths
only), in ``/dev/shm`` where there is one.

Reference: Microsoft SEAL 4.x, ``Encryptor::encrypt_symmetric`` (seeded serialization)
and ``CKKSEncoder``; Benaissa et al., "TenSEAL", 2021.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import tenseal as ts
import tenseal.sealapi as sealapi

__all__ = ["Seal", "load_ciphertext", "save_object"]


def _scratch_folder() -> str:
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else tempfile.gettempdir()


_SCRATCH = _scratch_folder()


def save_object(obj: Any) -> bytes:
    """The bytes SEAL's ``save`` writes for ``obj`` (a ciphertext, a seeded
    ``Serializable`` or a key), compressed as SEAL compresses by default (zstd)."""
    fd, path = tempfile.mkstemp(prefix="fl_lbbsp-seal-", dir=_SCRATCH)
    os.close(fd)
    try:
        obj.save(path)
        return Path(path).read_bytes()
    finally:
        os.unlink(path)


def load_ciphertext(context: Any, data: bytes) -> Any:
    """A ``sealapi.Ciphertext`` from its bytes, checked by SEAL against ``context`` (a
    seeded one expanded); SEAL's ``ValueError``/``RuntimeError`` when they are not one."""
    fd, path = tempfile.mkstemp(prefix="fl_lbbsp-seal-", dir=_SCRATCH)
    try:
        os.write(fd, data)
        os.close(fd)
        ciphertext = sealapi.Ciphertext()
        ciphertext.load(context, path)
        return ciphertext
    finally:
        os.unlink(path)


class Seal:
    """SEAL's encoder and evaluator for a TenSEAL context, and with the secret key its
    symmetric encryptor and decryptor.

    Parameters
    ----------
    context : tenseal.Context
        The federation's context (secret on silos, public on the server).
    """

    def __init__(self, context: ts.Context) -> None:
        self.context = context.seal_context().data
        self.encoder = sealapi.CKKSEncoder(self.context)
        self.evaluator = sealapi.Evaluator(self.context)
        self.parms_id = list(self.context.last_parms_id())
        """The data level: one prime, the special prime dropped."""
        self.encryptor: Any = None
        self.decryptor: Any = None
        if context.is_private():
            secret = context.secret_key().data
            self.encryptor = sealapi.Encryptor(self.context, secret)
            self.decryptor = sealapi.Decryptor(self.context, secret)
        self._weights: dict[int, Any] = {}

    def weight(self, value: int) -> Any:
        """The plaintext of the integer ``value`` at scale 1 (a constant polynomial, kept):
        multiplying by it leaves a ciphertext's scale and level as they are."""
        plain = self._weights.get(value)
        if plain is None:
            plain = sealapi.Plaintext()
            self.encoder.encode(float(value), self.parms_id, 1.0, plain)
            if len(self._weights) < 4096:
                self._weights[value] = plain
        return plain
