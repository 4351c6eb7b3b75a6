"""Flower strategies over the LB-BSP core."""

from .cluster import LBBSPCluster
from .config import BalancingConfig
from .fedavg import LBBSPFedAvg

__all__ = ["BalancingConfig", "LBBSPCluster", "LBBSPFedAvg"]
