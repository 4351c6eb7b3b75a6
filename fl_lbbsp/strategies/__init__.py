"""Flower strategies over the LB-BSP core."""

from .config import BalancingConfig
from .fedavg import LBBSPFedAvg

__all__ = ["BalancingConfig", "LBBSPFedAvg"]
