"""Reference: NVIDIA FLARE's default CKKS setting, with the TenSEAL calls FLARE makes.

A stand-in for FLARE's HE components, kept as a measuring stick for the ``he`` benchmark
section (``benchmarks/he_overhead.py``); it does not import FLARE. What it reproduces:

* the context of ``nvflare.lighter.impl.he.HEBuilder`` (its defaults): CKKS, N = 8192,
  coefficient moduli [60, 40, 40], ``ENCRYPTION_TYPE.SYMMETRIC``, relinearisation keys
  generated, ``global_scale = 2**40``; the server's context is the serialized context with
  the relinearisation keys and without the secret key;
* ``HEModelEncryptor.encryption`` on the client: each layer flattened, multiplied by its
  weight in plaintext (``weigh_by_local_iter``: the local steps, here the weight the
  benchmark gives), and encrypted whole with ``ts.ckks_vector(context, values)
  .serialize()`` (TenSEAL splits a layer longer than N/2 into several ciphertexts);
* ``HEInTimeAccumulateWeightedAggregator`` on the server: ``ts.ckks_vector_from`` for
  each layer, added as they arrive, then multiplied by ``1 / sum of the weights``
  (which rescales: the aggregate drops one prime) and serialized;
* ``HEModelDecryptor`` on the client: ``ts.ckks_vector_from(context, data).decrypt()``.

Sources read: NVFlare ``nvflare/lighter/impl/he.py``,
``nvflare/app_opt/he/model_encryptor.py`` and ``intime_accumulate_model_aggregator.py``
(Apache-2.0; nothing copied, the calls are TenSEAL's public API).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import tenseal as ts

POLY_MODULUS_DEGREE = 8192
COEFF_MOD_BIT_SIZES = (60, 40, 40)
SCALE_BITS = 40


@dataclass(frozen=True)
class Contexts:
    """The clients' context (secret key) and the server's (relinearisation keys only)."""

    client: ts.Context
    server: ts.Context


def make_contexts() -> Contexts:
    """The contexts ``HEBuilder()`` provisions with its defaults."""
    context = ts.context(
        ts.SCHEME_TYPE.CKKS,
        poly_modulus_degree=POLY_MODULUS_DEGREE,
        coeff_mod_bit_sizes=list(COEFF_MOD_BIT_SIZES),
        encryption_type=ts.ENCRYPTION_TYPE.SYMMETRIC,
    )
    context.generate_relin_keys()
    context.global_scale = 2**SCALE_BITS
    server = ts.context_from(
        context.serialize(
            save_public_key=False,
            save_secret_key=False,
            save_galois_keys=False,
            save_relin_keys=True,
        )
    )
    return Contexts(client=context, server=server)


def encrypt(
    context: ts.Context, layers: Mapping[str, np.ndarray], weight: float
) -> dict[str, bytes]:
    """One client's upload: every layer weighted in plaintext and encrypted whole."""
    return {
        name: ts.ckks_vector(context, (values.ravel() * np.float64(weight)).tolist()).serialize()
        for name, values in layers.items()
    }


def aggregate(
    context: ts.Context, uploads: Sequence[Mapping[str, bytes]], weights: Sequence[float]
) -> dict[str, bytes]:
    """The server's sum of the uploads, divided by the sum of the weights, serialized."""
    total: dict[str, ts.CKKSVector] = {}
    for upload in uploads:
        for name, data in upload.items():
            vector = ts.ckks_vector_from(context, data)
            total[name] = vector if name not in total else total[name] + vector
    scale = 1.0 / float(sum(weights))
    return {name: (vector * scale).serialize() for name, vector in total.items()}


def decrypt(context: ts.Context, aggregate: Mapping[str, bytes]) -> dict[str, np.ndarray]:
    """A client's decryption of the aggregate, layer by layer."""
    return {
        name: np.asarray(ts.ckks_vector_from(context, data).decrypt(), dtype=np.float64)
        for name, data in aggregate.items()
    }
