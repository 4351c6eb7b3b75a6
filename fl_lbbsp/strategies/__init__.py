"""Flower strategies over the LB-BSP core.

``EncryptedLBBSPFedAvg`` (CKKS-encrypted updates) needs the ``he`` extra (TenSEAL) and is
imported on first use.
"""

from typing import Any

from .cluster import LBBSPCluster
from .config import BalancingConfig
from .fedavg import LBBSPFedAvg
from .legacy import LBBSPStrategy

__all__ = [
    "BalancingConfig",
    "EncryptedLBBSPFedAvg",
    "LBBSPCluster",
    "LBBSPFedAvg",
    "LBBSPStrategy",
]


def __getattr__(name: str) -> Any:
    if name == "EncryptedLBBSPFedAvg":
        from .encrypted import EncryptedLBBSPFedAvg

        return EncryptedLBBSPFedAvg
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
