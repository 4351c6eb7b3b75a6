"""Flower strategies over the LB-BSP core.

``LBBSPFedAvg`` (federated) is FedAvg driven by the round engine; ``LBBSPCluster``
(parameter server) is the same class composed with the SGD step. Baselines to compare with:
``LBBSPTau`` (tune tau instead of B), ``LBBSPEta`` (scale eta with B) and
``PartialAggregation`` (backup workers: aggregate the k fastest replies).

``EncryptedLBBSPFedAvg`` and ``EncryptedLBBSPCluster`` (CKKS-encrypted updates and
gradients) need the ``he`` extra (TenSEAL) and are imported on first use.
"""

from typing import Any

from ..core.settings import BalancingConfig, BalancingKnobs, Tuning
from .baselines import LBBSPEta, LBBSPTau, PartialAggregation
from .cluster import LBBSPCluster
from .fedavg import EngineStrategy, LBBSPFedAvg
from .legacy import LBBSPStrategy

__all__ = [
    "BalancingConfig",
    "BalancingKnobs",
    "EncryptedLBBSPCluster",
    "EncryptedLBBSPFedAvg",
    "EngineStrategy",
    "LBBSPCluster",
    "LBBSPEta",
    "LBBSPFedAvg",
    "LBBSPStrategy",
    "LBBSPTau",
    "PartialAggregation",
    "Tuning",
]


def __getattr__(name: str) -> Any:
    if name == "EncryptedLBBSPFedAvg":
        from .encrypted import EncryptedLBBSPFedAvg

        return EncryptedLBBSPFedAvg
    if name == "EncryptedLBBSPCluster":
        from .encrypted_cluster import EncryptedLBBSPCluster

        return EncryptedLBBSPCluster
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
