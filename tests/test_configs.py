"""Every strategy and trainer setting is validated by a pydantic model whose error names
the field and the bad value."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import math
import pkgutil
from collections.abc import Callable
from functools import partial
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

import fl_lbbsp
from fl_lbbsp.clients.app import SiloSetup
from fl_lbbsp.clients.cluster import WorkerSetup
from fl_lbbsp.clients.emulation import CostModel, SlowdownSchedule
from fl_lbbsp.clients.trainer import TrainerConfig
from fl_lbbsp.contract import RecordKeys
from fl_lbbsp.core.settings import BalancingKnobs, IterativeSettings, Tuning
from fl_lbbsp.datasets import PartitionSpec
from fl_lbbsp.runs.cluster import ClusterConfig
from fl_lbbsp.runs.fl import SimulationConfig
from fl_lbbsp.strategies import LBBSPCluster, LBBSPFedAvg, LBBSPStrategy
from fl_lbbsp.strategies.config import InvalidSettingError

HAS_TENSEAL = importlib.util.find_spec("tenseal") is not None
NAN, INF = math.nan, math.inf
ROUND = {"initial_batch_size": 8, "local_steps": 2, "lr": 0.1}


def fedavg(**kwargs: Any) -> LBBSPFedAvg:
    return LBBSPFedAvg(**{**ROUND, **kwargs})


def cluster(**kwargs: Any) -> LBBSPCluster:
    return LBBSPCluster(**{"initial_batch_size": 8, "lr": 0.1, **kwargs})


def legacy(**kwargs: Any) -> LBBSPStrategy:
    return LBBSPStrategy(**{**ROUND, **kwargs})


def encrypted(**kwargs: Any) -> Any:
    from fl_lbbsp.strategies.encrypted import EncryptedLBBSPFedAvg

    return EncryptedLBBSPFedAvg(public_context="/no/such/keys", **{**ROUND, **kwargs})


def encrypted_cluster(**kwargs: Any) -> Any:
    from fl_lbbsp.strategies.encrypted_cluster import EncryptedLBBSPCluster

    return EncryptedLBBSPCluster(
        public_context="/no/such/keys", **{"initial_batch_size": 8, "lr": 0.1, **kwargs}
    )


def ckks(**kwargs: Any) -> Any:
    from fl_lbbsp.crypto import CKKSConfig

    return CKKSConfig(**kwargs)


def trainer(**kwargs: Any) -> TrainerConfig:
    return TrainerConfig(**{"batch_size": 8, "local_steps": 2, "lr": 0.1, **kwargs})


he = pytest.mark.skipif(not HAS_TENSEAL, reason="the he extra (tenseal) is not installed")

# (build, field, bad value, text the message must show: default repr(value))
CASES: list[Any] = [
    # strategies: BalancingConfig, ServerConfig, ParameterServerConfig, EncryptionConfig
    (fedavg, "initial_batch_size", 0, None),
    (fedavg, "local_steps", -1, None),
    (fedavg, "lr", 0.0, None),
    (fedavg, "lr", NAN, None),
    (fedavg, "alpha", 1.5, None),
    (fedavg, "alpha", NAN, None),
    (fedavg, "estimator", "kalman", None),
    (fedavg, "allocator", "greedy", None),
    (fedavg, "min_batch_size", 0, None),
    (partial(fedavg, min_batch_size=8), "max_batch_size", 4, None),
    (fedavg, "max_change_ratio", 1.0, None),
    (fedavg, "max_change_ratio", INF, None),
    (fedavg, "deadline_margin", 0.5, None),
    (fedavg, "deadline_floor", 0.0, None),
    (fedavg, "deadline_ceiling", NAN, None),
    (partial(fedavg, deadline_floor=30.0), "deadline_ceiling", 5.0, None),
    (fedavg, "poll_interval", 0.0, None),
    (fedavg, "fraction_train", 1.5, None),
    (fedavg, "fraction_evaluate", -0.1, None),
    (fedavg, "min_train_nodes", -1, None),
    (fedavg, "min_available_nodes", -2, None),
    (fedavg, "checkpoint_dir", 5, None),
    (fedavg, "telemetry_path", 3.5, None),
    (fedavg, "history", 0, None),
    (fedavg, "min_fit_spread", -0.1, None),
    (BalancingKnobs, "noise_budget", 0.5, None),
    (BalancingKnobs, "change_confirm", 0, None),
    (Tuning, "alpha", 0.0, None),
    (IterativeSettings, "fine_window", 0, None),
    (partial(fedavg, allocator="iterative"), "allocator_options", {"stride": 2}, "stride"),
    (partial(Tuning, min_claimed_time=5.0), "max_claimed_time", 5.0, "max_claimed_time"),
    (partial(fedavg, balancing=BalancingKnobs()), "alpha", 0.0, None),
    (cluster, "momentum", 1.0, None),
    (cluster, "momentum", NAN, None),
    (cluster, "aggregation", "median", None),
    (cluster, "lr", -0.1, None),
    (legacy, "alpha", 0.0, None),
    (fedavg, "max_batch_size", 4, "4"),  # below the fedavg helper's B_init
    (legacy, "max_batch_size", 4, "4"),
    (legacy, "max_weight_ratio", 0.5, None),
    (fedavg, "min_train_silos", 0, None),
    (fedavg, "max_num_examples", -5, None),
    (fedavg, "max_reply_bytes", 0, None),
    (fedavg, "extra_metric_keys", "train-acc", None),
    (cluster, "min_train_silos", 1.5, None),
    (legacy, "max_reply_bytes", -1, None),
    pytest.param(encrypted, "exclude_named_for", 0, None, marks=he),
    pytest.param(encrypted, "deadline_margin", 0.9, None, marks=he),
    pytest.param(encrypted_cluster, "aggregation", "naive", None, marks=he),
    pytest.param(encrypted_cluster, "max_history", 0, None, marks=he),
    pytest.param(encrypted_cluster, "evaluate_every", 0, None, marks=he),
    pytest.param(encrypted_cluster, "momentum", -0.5, None, marks=he),
    # trainer side
    (trainer, "batch_size", 0, None),
    (trainer, "batch_size", 2.5, None),
    (trainer, "local_steps", 0, None),
    (trainer, "lr", INF, None),
    (trainer, "server_round", -1, None),
    (SiloSetup, "num_silos", 0, None),
    (SiloSetup, "seed", -1, None),
    (SiloSetup, "model", "resnet", None),
    (SiloSetup, "partition", "labels:0", None),
    (SiloSetup, "dataset", "imagenet", None),
    (SiloSetup, "slowdowns", ("2", "0.5"), "'0.5'"),
    (SiloSetup, "test_fraction", 1.0, None),
    (SiloSetup, "torch_threads", 0, None),
    (SiloSetup, "evaluate_on", "val", None),
    (WorkerSetup, "num_workers", 0, None),
    (WorkerSetup, "data", "half", None),
    (WorkerSetup, "cost_models", ("fast",), "'fast'"),
    (WorkerSetup, "slowdowns", ("1:0",), "'1:0'"),
    (WorkerSetup, "seed", -3, None),
    (partial(CostModel, per_sample=0.01), "max_batch_size", 0, None),
    (CostModel, "per_sample", NAN, None),
    (partial(CostModel, per_sample=0.01), "fixed", -1.0, None),
    (partial(CostModel, per_sample=0.01), "floor", -0.5, None),
    (SlowdownSchedule, "steps", {0: 2.0}, "0"),
    (SlowdownSchedule, "steps", {1: 0.5}, "0.5"),
    (SlowdownSchedule, "steps", {2: INF}, "inf"),
    (SlowdownSchedule, "steps", {}, None),
    (PartitionSpec, "kind", "shards", None),
    (partial(PartitionSpec, kind="labels"), "classes_per_silo", 0, None),
    (partial(PartitionSpec, kind="dirichlet"), "alpha", -1.0, None),
    pytest.param(ckks, "poly_modulus_degree", 1000, None, marks=he),
    pytest.param(ckks, "coeff_mod_bit_sizes", (60,), None, marks=he),
    pytest.param(ckks, "scale_bits", 0, None, marks=he),
    pytest.param(ckks, "min_headroom_bits", 61, None, marks=he),
    pytest.param(ckks, "encryption", "rsa", None, marks=he),
    (RecordKeys, "batch_size", "", None),
    # runs
    (SimulationConfig, "silos", 0, None),
    (SimulationConfig, "speeds", (1.0, -2.0), "-2.0"),
    (SimulationConfig, "speeds", (1.0, NAN), "nan"),
    (SimulationConfig, "rounds", 0, None),
    (SimulationConfig, "lr", INF, None),
    (SimulationConfig, "partition", "dirichlet:-1", None),
    (SimulationConfig, "model", "vgg", None),
    (SimulationConfig, "seed", -1, None),
    (SimulationConfig, "allocator", "iterative", None),
    (SimulationConfig, "dataset", "mnist:", None),
    (SimulationConfig, "max_change_ratio", 0.5, None),
    (SimulationConfig, "checkpoint_dir", 7, None),
    (ClusterConfig, "workers", 0, None),
    (ClusterConfig, "momentum", 1.0, None),
    (ClusterConfig, "cost_model", "a,b", None),
    (ClusterConfig, "eval_every", 0, None),
    (ClusterConfig, "speeds", (0.0, 1.0, 1.0, 1.0), "0.0"),
    (ClusterConfig, "seed", -5, None),
]


@pytest.mark.parametrize(("build", "field", "value", "shown"), CASES)
def test_error_names_the_field_and_the_value(
    build: Callable[..., Any], field: str, value: Any, shown: str | None
) -> None:
    # Execute
    with pytest.raises(ValueError) as caught:
        build(**{field: value})

    # Assert: a ValueError whose message names the field and shows the value, both in
    # the same error (its location and input, or the text of a check across fields); a
    # strategy's in the user's terms, in one part per error
    expected = repr(value) if shown is None else shown
    assert field in str(caught.value) and expected in str(caught.value)
    if isinstance(caught.value, InvalidSettingError):
        parts = str(caught.value).split(": ", 1)[1].split("; ")
        assert any(field in part and expected in part for part in parts), parts
        return
    assert isinstance(caught.value, ValidationError)
    assert any(
        (field in ".".join(map(str, e["loc"])) or field in e["msg"])
        and (repr(e["input"]) == expected or expected in e["msg"])
        for e in caught.value.errors()
    ), caught.value.errors()


def _defined_models() -> set[str]:
    """Every pydantic model class defined in fl_lbbsp (modules that import)."""
    found = set()
    for info in pkgutil.walk_packages(fl_lbbsp.__path__, "fl_lbbsp."):
        try:
            module = importlib.import_module(info.name)
        except ImportError:  # an optional extra that is not installed
            continue
        for name, obj in vars(module).items():
            if inspect.isclass(obj) and issubclass(obj, BaseModel) and obj.__module__ == info.name:
                found.add(name)
    return found


def test_every_config_class_is_covered() -> None:
    # Prepare: the classes the cases construct (strategies build theirs from keywords)
    covered = {
        "BalancingConfig", "BalancingKnobs", "Tuning", "IterativeSettings", "ServerConfig",
        "ReplyLimits",
        "ParameterServerConfig",
        "EncryptionConfig",
        "EncryptedClusterConfig",
        "RoundInstruction", "SiloSetup", "WorkerSetup", "CostModel", "SlowdownSchedule",
        "PartitionSpec", "CKKSConfig", "RecordKeys", "SimulationConfig", "ClusterConfig",
        "RunSettings",  # the base of the two above: its fields are checked through them
        # a checkpoint's contents, validated on load: tests/test_checkpoint_validation.py
        "OpenRecord", "Manifest", "EstimatorState", "LastReport", "SiloModel", "BalancerState",
        "EngineState", "StrategyState", "_Contents", "ClaimsState", "FitState",
        "IterativeAllocatorState", "IterativeState", "PooledShape",  # and test_checkpoint_hostile
        "MemoryState",  # tests/test_memory_caps.py
        "SpeedEstimator", "EMA", "Last", "ChangeAwareEMA", "NARX",  # test_core_estimators.py
        "Allocator", "Linear", "Proportional", "Iterative",  # test_core_allocators.py
        "TrustState", "Agreement",  # a checkpoint's trusted-clip history: test_trusted_clip.py
    }  # fmt: skip

    # Execute
    defined = _defined_models()

    # Assert: a new config class needs its cases above
    assert defined - covered == set()
    assert "BalancingConfig" in defined and "SiloSetup" in defined


def test_the_balancer_takes_every_knob_of_its_config() -> None:
    # Prepare: every balancer setting away from its default
    from fl_lbbsp.core.balancer import BatchSizeBalancer
    from fl_lbbsp.core.settings import BalancingConfig, Tuning

    config = BalancingConfig(
        initial_batch_size=16, local_steps=2, lr=0.1, estimator="last", alpha=0.5,
        allocator="proportional", min_batch_size=2, min_batch_fraction=0.25,
        noise_budget=2.0, max_batch_size=64, history=7, min_fit_spread=0.3,
        max_change_ratio=3.0, fit="wls", change_sigmas=4.0, change_threshold=0.3,
        change_confirm=3, common_noise=False, order_tolerance=None, equal_split_guard=False,
        equal_split_margin=0.1, estimator_options={}, allocator_options={},
        max_dataset_size=5, check_times=True, time_tolerance=3.0, min_claimed_time=0.1,
        max_claimed_time=10.0, balance=False,
    )  # fmt: skip
    changed = {
        k
        for k, v in config.tuning
        if v != Tuning.model_fields[k].get_default(call_default_factory=True)
    }

    # Execute
    balancer = BatchSizeBalancer(initial_batch_size=16, knobs=config)
    saved = balancer.state_dict()["config"]
    again = BatchSizeBalancer.from_state_dict(balancer.state_dict())

    # Assert: the balancer holds each value as given (the options aside, all moved)
    assert changed == set(Tuning.model_fields) - {"estimator_options", "allocator_options"}
    assert saved == {
        "initial_batch_size": 16,
        **config.model_dump(mode="json", include=set(BalancingKnobs.model_fields)),
    }
    knobs = config.model_dump(include=set(BalancingKnobs.model_fields))
    assert again.knobs == BalancingKnobs.model_validate(knobs)


def test_an_older_flat_balancer_config_is_read_into_its_tuning() -> None:
    # Prepare: a state_dict config as earlier versions wrote it, every knob by name
    from fl_lbbsp.core.balancer import BatchSizeBalancer

    state = BatchSizeBalancer(initial_batch_size=8).state_dict()
    state["config"] = {"initial_batch_size": 8, "allocator": "proportional", "history": 7}

    # Execute
    balancer = BatchSizeBalancer.from_state_dict(state)

    # Assert
    assert balancer.tuning.allocator == "proportional" and balancer.tuning.history == 7


def test_a_strategy_takes_its_knobs_as_one_value_a_keyword_winning() -> None:
    # Execute
    strategy = fedavg(balancing=BalancingKnobs(noise_budget=None, alpha=0.5), alpha=0.3)

    # Assert
    assert strategy.config.noise_budget is None
    assert strategy.config.tuning.alpha == 0.3


@pytest.mark.parametrize(
    "given",
    [
        {"tuning": Tuning(allocator="proportional", history=7)},
        {"tuning": {"allocator": "proportional", "history": 7}},
        {"allocator": "proportional", "history": 7},
        {"balancing": BalancingKnobs(tuning=Tuning(history=3)), "allocator": "proportional",
         "history": 7},
    ],
    ids=["model", "mapping", "by-name", "by-name-winning"],
)  # fmt: skip
def test_a_strategy_takes_its_tuning_as_a_model_or_by_name(given: dict[str, Any]) -> None:
    # Execute
    tuning = fedavg(**given).config.tuning

    # Assert
    assert tuning == Tuning(allocator="proportional", history=7)


def test_a_balancer_built_without_settings_has_the_knobs_defaults() -> None:
    # Prepare
    from fl_lbbsp.core.balancer import BatchSizeBalancer

    # Execute
    saved = BatchSizeBalancer(initial_batch_size=8).state_dict()["config"]

    # Assert: every default as BalancingKnobs and Tuning declare it
    assert saved == {"initial_batch_size": 8, **BalancingKnobs().model_dump(mode="json")}
