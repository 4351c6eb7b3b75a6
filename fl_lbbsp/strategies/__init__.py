"""Flower strategies over the LB-BSP core."""

from .cluster import LBBSPCluster
from .config import BalancingConfig
from .fedavg import LBBSPFedAvg
from .legacy import LBBSPStrategy

__all__ = ["BalancingConfig", "LBBSPCluster", "LBBSPFedAvg", "LBBSPStrategy"]
