"""Flower strategies over the LB-BSP core."""

from .config import BalancingConfig
from .fedavg import LBBSPFedAvg
from .legacy import LBBSPStrategy

__all__ = ["BalancingConfig", "LBBSPFedAvg", "LBBSPStrategy"]
