"""LB-BSP decisions in pure numpy: speed estimators, allocators, rounding, the balancer
and weighted aggregation. No Flower, no torch."""

from .aggregation import (
    Aggregator,
    WeightedMean,
    normalised_weights,
    weighted_average,
    weighted_sum,
)
from .allocation.allocators import (
    ideal_round_time,
    idle_fraction,
    linear_minmax,
    linear_minmax_continuous,
    proportional,
)
from .allocation.pipeline import ALLOCATORS, Allocator, Iterative, Linear, Proportional
from .allocation.rounding import integer_bounds, round_to_total
from .balancer import BALANCER_DEFAULTS, BatchSizeBalancer, InvalidReportError, SiloReport
from .optim import GradientStep
from .silo.costfit import CostFit, fit_linear_cost, fit_robust_cost
from .silo.estimators import (
    EMA,
    ESTIMATORS,
    ChangeAwareEMA,
    Last,
    Predictor,
    SpeedEstimator,
    parse_estimator,
    register,
)
from .silo.narx import NARX

__all__ = [
    "ALLOCATORS",
    "Aggregator",
    "Allocator",
    "BALANCER_DEFAULTS",
    "BatchSizeBalancer",
    "ChangeAwareEMA",
    "CostFit",
    "EMA",
    "ESTIMATORS",
    "GradientStep",
    "InvalidReportError",
    "Iterative",
    "Last",
    "Linear",
    "NARX",
    "Predictor",
    "Proportional",
    "SiloReport",
    "SpeedEstimator",
    "WeightedMean",
    "fit_linear_cost",
    "fit_robust_cost",
    "ideal_round_time",
    "idle_fraction",
    "integer_bounds",
    "linear_minmax",
    "linear_minmax_continuous",
    "parse_estimator",
    "normalised_weights",
    "proportional",
    "register",
    "round_to_total",
    "weighted_average",
    "weighted_sum",
]
