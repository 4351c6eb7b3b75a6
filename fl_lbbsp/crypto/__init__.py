"""CKKS homomorphic encryption of model updates (TenSEAL): keys, encryption, checks, sums.

Needs the ``he`` extra (``pip install fl_lbbsp[he]``). Silos hold the secret context, the
server only the public one; silos encrypt their updates unweighted (seeded symmetric
ciphertexts), the server checks them, multiplies each by its integer weight and adds,
silos decrypt the sum and divide by the plaintext sum of weights.
"""

try:
    import tenseal  # noqa: F401
except ImportError as err:  # pragma: no cover - depends on the environment
    raise ImportError(
        "fl_lbbsp.crypto needs TenSEAL: pip install 'fl_lbbsp[he]' (tenseal>=0.3.14)"
    ) from err

from . import ckks, keys
from .ckks import *  # noqa: F403 - the names in ckks.__all__
from .config import CKKSConfig
from .keys import *  # noqa: F403 - the names in keys.__all__

__all__ = ["CKKSConfig", *ckks.__all__, *keys.__all__]
