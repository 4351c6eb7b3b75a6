"""Validated configuration of the LB-BSP strategies (errors name the field and value).

The balancing settings and reply limits are the core's
(:class:`~fl_lbbsp.core.settings.BalancingConfig`,
:class:`~fl_lbbsp.core.settings.ReplyLimits`); this module adds the server's.

The strategies keep plain keyword-only constructors; each builds these models from its
keywords, so a bad value raises :class:`pydantic.ValidationError` (a ``ValueError``) that
names the keyword and the value.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ..contract import RecordKeys
from ..core.settings import BalancingConfig, BalancingKnobs, ReplyLimits, Tuning

__all__ = [
    "BalancingConfig",
    "BalancingKnobs",
    "EncryptedClusterConfig",
    "EncryptionConfig",
    "InvalidSettingError",
    "RUN_CONFIG_ALIASES",
    "RUN_CONFIG_KEYS",
    "ParameterServerConfig",
    "ReplyLimits",
    "ServerConfig",
    "Tuning",
    "parameter_server_keywords",
    "record_keys",
    "setting_error",
    "settings_of_run_config",
    "split_settings",
]


class ServerConfig(BaseModel):
    """Settings of a Message-API LB-BSP strategy beyond balancing: round deadlines, reply
    polling, node sampling, telemetry and checkpoints.

    Parameters
    ----------
    deadline_margin : float | None (default: 3.0)
        Round deadline = this multiple (>= 1) of the predicted round time; ``None``: no
        deadline.
    deadline_floor : float (default: 30.0)
        Shortest round deadline in seconds, positive.
    deadline_ceiling : float (default: 3600.0)
        Longest round deadline in seconds, at least ``deadline_floor``.
    poll_interval : float | None (default: 0.1)
        Seconds between two pulls for replies, positive; ``None``: the Grid's own loop.
    fraction_train, fraction_evaluate : float (default: 1.0)
        Share of the available nodes sampled for training / evaluation, in [0, 1].
    min_train_nodes, min_evaluate_nodes, min_available_nodes : int (default: 2)
        As in :class:`flwr.serverapp.strategy.FedAvg`, non-negative.
    telemetry_path : Path | None (default: None)
        JSON-lines telemetry file.
    checkpoint_dir : Path | None (default: None)
        Folder for one checkpoint per finished round; ``start`` resumes from it.
    checkpoint_key : Path | None (default: None)
        File of a checkpoint key (``fl-lbbsp keys checkpoint``): checkpoints are written
        with an HMAC-SHA256 under it and only such checkpoints are resumed, so an edited
        one is refused (:mod:`fl_lbbsp.strategies.checkpoint`). ``None``: a SHA-256
        digest, which detects damage, not edits.
    max_update_ratio : float (default: 10.0)
        An update whose distance to the global model (a gradient's norm in cluster mode)
        is more than this many times the median of the round's and the recent rounds'
        accepted ones is rejected (:mod:`fl_lbbsp.security.update_screen`); > 1.
    update_spread_sigmas : float (default: 3.0)
        The bound widens to this many robust standard deviations of the log-distances
        when the federation's updates are naturally that spread; > 0.
    max_weight_ratio : float (default: 10.0)
        An undeclared dataset size weighs at most this many times the median of the other
        silos' sizes, and never more than all of them together; >= 1.
    max_empty_rounds : int (default: 3)
        Consecutive rounds without any aggregated update after which ``start`` stops
        with :class:`~fl_lbbsp.strategies.NoUpdateError` (a first round without one
        stops it at once): a run never ends "completed" with the model it started from.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    deadline_margin: float | None = Field(default=3.0, ge=1.0, allow_inf_nan=False)
    deadline_floor: float = Field(default=30.0, gt=0, allow_inf_nan=False)
    deadline_ceiling: float = Field(default=3600.0, gt=0, allow_inf_nan=False)
    poll_interval: float | None = Field(default=0.1, gt=0, allow_inf_nan=False)
    fraction_train: float = Field(default=1.0, ge=0, le=1)
    fraction_evaluate: float = Field(default=1.0, ge=0, le=1)
    min_train_nodes: int = Field(default=2, ge=0)
    min_evaluate_nodes: int = Field(default=2, ge=0)
    min_available_nodes: int = Field(default=2, ge=0)
    telemetry_path: Path | None = None
    checkpoint_dir: Path | None = None
    checkpoint_key: Path | None = None
    max_update_ratio: float = Field(default=10.0, gt=1, allow_inf_nan=False)
    update_spread_sigmas: float = Field(default=3.0, gt=0, allow_inf_nan=False)
    max_weight_ratio: float = Field(default=10.0, ge=1, allow_inf_nan=False)
    max_empty_rounds: int = Field(default=3, ge=1, strict=True)

    @model_validator(mode="after")
    def _deadline_order(self) -> ServerConfig:
        if self.deadline_ceiling < self.deadline_floor:
            raise ValueError(
                f"deadline_ceiling ({self.deadline_ceiling!r}) is below deadline_floor "
                f"({self.deadline_floor!r})"
            )
        return self


class ParameterServerConfig(BaseModel):
    """The parameter server's update in cluster mode.

    Parameters
    ----------
    momentum : float (default: 0.0)
        SGD momentum, in [0, 1).
    aggregation : {"weighted", "naive"} (default: "weighted")
        Gradients weighted by batch size (Sec. 3.4), or their plain (biased) mean.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    momentum: float = Field(default=0.0, ge=0, lt=1)
    aggregation: Literal["weighted", "naive"] = "weighted"


def parameter_server_keywords(
    *, initial_batch_size: int, lr: float, evaluate: bool
) -> dict[str, Any]:
    """The strategy keywords that every parameter-server mode fixes: one round is one
    iteration (one local step, the server applies the update), every worker trains, and
    evaluation (when ``evaluate``) asks every worker but waits for none."""
    return {
        "initial_batch_size": initial_batch_size,
        "local_steps": 1,
        "lr": lr,
        "parameter_server": True,
        "fraction_train": 1.0,
        "fraction_evaluate": 1.0 if evaluate else 0.0,
        "min_evaluate_nodes": 0,
    }


class EncryptionConfig(BaseModel):
    """How the encrypted strategy announces and checks the silos' weights.

    Parameters
    ----------
    initial_weight_total : float | None (default: None)
        Positive total S announced before any silo reported its dataset size; ``None``:
        the number of sampled silos.
    weight_tolerance : float (default: 1e-6)
        Relative tolerance of the weight check, in (0, 1).
    exclude_named_for : int | None (default: None)
        Rounds a silo named for spoiling an aggregate is left out, the round it is named
        in included, >= 1; ``None``: for the rest of the run.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    initial_weight_total: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    weight_tolerance: float = Field(default=1e-6, gt=0, lt=1)
    exclude_named_for: int | None = Field(default=None, ge=1, strict=True)


class EncryptedClusterConfig(BaseModel):
    """The encrypted parameter server's history of aggregates and its evaluation.

    Parameters
    ----------
    max_history : int (default: 32)
        Aggregates kept for workers that fall behind, positive.
    evaluate_every : int | None (default: None)
        Federated evaluation after every this many iterations (positive); ``None``: never.
    aggregation : {"weighted"} (default: "weighted")
        Encrypted gradients are weighted by batch size only.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_history: int = Field(default=32, ge=1, strict=True)
    evaluate_every: int | None = Field(default=None, ge=1, strict=True)
    aggregation: Literal["weighted"] = "weighted"


class InvalidSettingError(ValueError):
    """A strategy argument that is out of range or of the wrong type.

    The message names the strategy, the argument as the user wrote it, what it must be,
    and the value given; no internal class name.
    """


def setting_error(err: ValidationError, *, owner: str) -> InvalidSettingError:
    """``err`` (from building a settings model out of ``owner``'s keywords) in the user's
    terms: ``"LBBSPFedAvg: initial_batch_size must be greater than 0 (got 0)"``."""
    parts = []
    for item in err.errors():
        message = str(item["msg"]).removeprefix("Value error, ")
        message = message.replace("Input should be", "must be")
        if item["type"] == "extra_forbidden":
            message = f"is not a setting of {owner}"
        if item["loc"]:
            name = ".".join(str(p) for p in item["loc"] if p != "tuning")  # the knob's name
            parts.append(f"{name} {message} (got {item.get('input')!r:.80})")
        else:
            parts.append(message)
    return InvalidSettingError(f"{owner}: " + "; ".join(parts))


def record_keys(keys: object) -> RecordKeys:
    """A strategy's or silo's ``keys`` argument as :class:`~fl_lbbsp.contract.RecordKeys`.

    Parameters
    ----------
    keys : RecordKeys | Mapping[str, str] | None
        The names; a mapping of field names to names (``{"batch_size": "bs"}``) is
        converted; ``None``: the defaults.

    Raises
    ------
    TypeError
        ``keys`` is neither.
    InvalidSettingError
        The mapping names a field RecordKeys does not have, or a name is empty.
    """
    try:
        return RecordKeys.of(keys, owner="a strategy's keys=...")
    except ValidationError as err:
        raise setting_error(err, owner="keys") from err


def split_settings(
    settings: Mapping[str, Any],
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """A strategy's setting keywords, each to the model that declares it: the server's
    (:class:`ServerConfig`), the reply limits (:class:`ReplyLimits`, all four always
    given, defaults filled) and the rest, balancing (:class:`BalancingConfig`, which
    refuses a name it does not know)."""
    server = {k: v for k, v in settings.items() if k in ServerConfig.model_fields}
    limits = {k: v for k, v in settings.items() if k in ReplyLimits.model_fields}
    balancing = {k: v for k, v in settings.items() if k not in server and k not in limits}
    defaults = {name: field.default for name, field in ReplyLimits.model_fields.items()}
    return server, {**defaults, **limits}, balancing


RUN_CONFIG_KEYS: dict[str, str] = {
    "batch-size": "initial_batch_size",
    "local-steps": "local_steps",
    "lr": "lr",
    "fraction-train": "fraction_train",
    "fraction-evaluate": "fraction_evaluate",
    "min-train-nodes": "min_train_nodes",
    "min-evaluate-nodes": "min_evaluate_nodes",
    "min-available-nodes": "min_available_nodes",
    "telemetry-path": "telemetry_path",
}
"""Run-config keys a strategy reads from a Flower app's run config -> the keyword each
sets; the first three are required, ``telemetry-path`` ``""`` means none."""

RUN_CONFIG_ALIASES: dict[str, str] = {"lr": "learning-rate"}
"""A key of :data:`RUN_CONFIG_KEYS` -> the name Flower's own app templates give it, read
when the key itself is absent (``flwr new``'s PyTorch app declares ``learning-rate``)."""


def settings_of_run_config(
    run_config: Mapping[str, Any], overrides: Mapping[str, Any], *, owner: str
) -> dict[str, Any]:
    """A strategy's keywords from a Flower app's run config, ``overrides`` winning.

    Raises
    ------
    InvalidSettingError
        A required key is missing from both: the message says where to declare it.
    """
    config = dict(run_config)
    for key, alias in RUN_CONFIG_ALIASES.items():
        if key not in config and alias in config:
            config[key] = config[alias]
    required = ("batch-size", "local-steps", "lr")
    missing = [k for k in required if k not in config and RUN_CONFIG_KEYS[k] not in overrides]
    if missing:
        given = f" (keywords given: {', '.join(sorted(overrides))})" if overrides else ""
        raise InvalidSettingError(
            f"{owner}.from_run_config: the run config has no "
            + ", ".join(repr(key) for key in missing)
            + "; declare them in the app's pyproject.toml under [tool.flwr.app.config], "
            "e.g. batch-size = 32, local-steps = 10, lr = 0.05, or pass them: "
            "from_run_config(context.run_config, "
            + ", ".join(f"{RUN_CONFIG_KEYS[k]}=..." for k in missing)
            + ")"
            + given
        )
    settings = {name: config[key] for key, name in RUN_CONFIG_KEYS.items() if key in config}
    if settings.get("telemetry_path") == "":
        settings["telemetry_path"] = None
    return {**settings, **overrides}
