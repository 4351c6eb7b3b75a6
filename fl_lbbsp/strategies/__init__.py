"""Flower strategies over the LB-BSP core.

``EncryptedLBBSPFedAvg`` and ``EncryptedLBBSPCluster`` (CKKS-encrypted updates and
gradients) need the ``he`` extra (TenSEAL) and are imported on first use.
"""

from typing import Any

from .cluster import LBBSPCluster
from .config import BalancingConfig
from .fedavg import LBBSPFedAvg
from .legacy import LBBSPStrategy

__all__ = [
    "BalancingConfig",
    "EncryptedLBBSPCluster",
    "EncryptedLBBSPFedAvg",
    "LBBSPCluster",
    "LBBSPFedAvg",
    "LBBSPStrategy",
]


def __getattr__(name: str) -> Any:
    if name == "EncryptedLBBSPFedAvg":
        from .encrypted import EncryptedLBBSPFedAvg

        return EncryptedLBBSPFedAvg
    if name == "EncryptedLBBSPCluster":
        from .encrypted_cluster import EncryptedLBBSPCluster

        return EncryptedLBBSPCluster
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
