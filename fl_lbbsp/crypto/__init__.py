"""CKKS homomorphic encryption of model updates (TenSEAL): keys, encryption, checks, sums.

Needs the ``he`` extra (``pip install fl_lbbsp[he]``). Silos hold the secret context, the
server only the public one; silos weight and encrypt their updates, the server checks and
adds the ciphertexts, silos decrypt the sum and divide by the plaintext sum of weights.
"""

try:
    import tenseal  # noqa: F401
except ImportError as err:  # pragma: no cover - depends on the environment
    raise ImportError(
        "fl_lbbsp.crypto needs TenSEAL: pip install 'fl_lbbsp[he]' (tenseal>=0.3.14)"
    ) from err

from .ckks import (
    EncryptedUpdate,
    InvalidUpdateError,
    NonFiniteUpdateError,
    ParsedUpdate,
    TensorSpec,
    UpdateChecker,
    aggregate_updates,
    decrypt_update,
    encrypt_update,
    flatten,
    unflatten,
)
from .config import CKKSConfig
from .keys import (
    PUBLIC_CONTEXT_FILE,
    SECRET_CONTEXT_FILE,
    CKKSKeys,
    KeyFileError,
    KeyFiles,
    generate_keys,
    key_fingerprint,
    load_keys,
    load_server_keys,
    load_silo_keys,
    write_key_files,
)

__all__ = [
    "PUBLIC_CONTEXT_FILE",
    "SECRET_CONTEXT_FILE",
    "CKKSConfig",
    "CKKSKeys",
    "EncryptedUpdate",
    "InvalidUpdateError",
    "KeyFileError",
    "KeyFiles",
    "NonFiniteUpdateError",
    "ParsedUpdate",
    "TensorSpec",
    "UpdateChecker",
    "aggregate_updates",
    "decrypt_update",
    "encrypt_update",
    "flatten",
    "generate_keys",
    "key_fingerprint",
    "load_keys",
    "load_server_keys",
    "load_silo_keys",
    "unflatten",
    "write_key_files",
]
