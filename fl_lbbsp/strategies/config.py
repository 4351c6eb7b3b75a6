"""Validated configuration of the LB-BSP strategies (errors name the field and value).

The balancing settings and reply limits are the core's
(:class:`~fl_lbbsp.core.settings.BalancingConfig`,
:class:`~fl_lbbsp.core.settings.ReplyLimits`); this module adds the server's. The
strategies' keyword-only constructors build these models, so a bad value raises an error
naming the keyword and the value (:func:`setting_error`).
"""

from __future__ import annotations

import logging
import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from ..contract import RecordKeys
from ..core.settings import BalancingConfig, ReplyLimits, Tuning

__all__ = [
    "EncryptedClusterConfig",
    "EncryptionConfig",
    "InvalidSettingError",
    "RUN_CONFIG_ALIASES",
    "RUN_CONFIG_KEYS",
    "ParameterServerConfig",
    "ServerConfig",
    "parameter_server_keywords",
    "record_keys",
    "refuse_numeric_strings",
    "setting_error",
    "settings_of_run_config",
    "split_settings",
]


log = logging.getLogger("fl_lbbsp")


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
        File of a checkpoint key (``fl-lbbsp keys checkpoint``): checkpoints carry an
        HMAC-SHA256 under it, so an edited one is refused. ``None``: a SHA-256 digest,
        which detects damage, not edits.
    max_update_ratio : float (default: 10.0)
        An update whose distance to the global model (a gradient's norm in cluster mode)
        is more than this many times the median of the round's and the recent rounds'
        accepted ones is rejected (:mod:`fl_lbbsp.security.update_screen`); > 1.
    update_spread_sigmas : float (default: 3.0)
        The bound widens to this many robust standard deviations of the log-distances
        when the federation's updates are naturally that spread; > 0.
    max_weight_ratio : float | None (default: 2.0)
        An undeclared dataset size weighs at most this many times the median of the
        federation's sizes, and never more than all the other silos together; >= 1.
        ``k < n / 2`` colluding liars then hold at most ``k r / (k r + n - k)`` of the
        weight among honest silos of equal size
        (:func:`~fl_lbbsp.security.update_screen.cap_weights`). With two silos that makes
        the mean unweighted (neither counts more than the other). ``None``: every size
        counts whole, as Flower's FedAvg weighs them, for an operator who trusts the
        silos' sizes; declaring them in the silo registry keeps the cap for the others.
    robust_aggregation : {"trusted-clip", "centered-clip", "mean"} (default: "trusted-clip")
        How plaintext updates are combined: ``"centered-clip"``, each update clipped
        around a robust centre before the dataset-size-weighted mean
        (:class:`~fl_lbbsp.core.centered_clip.CenteredClip`: no minority of silos can steer
        the model, and with no update clipped it is FedAvg's mean); ``"trusted-clip"``,
        the same over the silos whose history of agreement with the others' centre is
        not a negative outlier of the federation's (the Hampel identifier), a persistent
        opponent left out and named (:class:`~fl_lbbsp.core.trusted_clip.TrustedClip`;
        the default, chosen on section ``robustness``: it holds every iid attack where
        centred clipping alone loses up to 19 points, at the same honest cost);
        ``"mean"``: FedAvg's weighted mean alone. Encrypted updates cannot be read, so
        this applies to plaintext only.
    clip_factor : float (default: 1.0)
        The clipping radius of ``"centered-clip"`` in medians of the updates' distances
        to the robust centre (each widened by ``sqrt(B_eq / B_i)`` for a silo sent less
        than the equal split); > 0.
    bound_claimed_pull : bool (default: False)
        Under a robust aggregation, an undeclared dataset size above the round's median
        weight pulls the model away from the robust centre no further than the median
        weight's (its clip radius scaled by ``w_med / w_i``): a silo gains no pull from
        claiming more data, but an honest large silo the registry did not declare loses
        pull where its data differ from the others' (measured in ``docs/security.md``).
        For federations that cannot declare their silos' sizes.
    max_loss_ratio : float (default: 10.0)
        A round whose silos' median ``train-loss`` (of the model they were sent) is not
        finite or over this many times the lowest median seen has diverged: the model is
        rolled back to the last one that trained sanely, with an error logged; > 1.
    max_empty_rounds : int (default: 3)
        Consecutive rounds without an aggregated update after which ``start`` stops with
        :class:`~fl_lbbsp.strategies.NoUpdateError` (a first such round stops it at once).
    spend_saved_time : bool (default: False)
        After the configured rounds, ``start`` spends the wall time the balanced split saved
        on more rounds, numbered on: as many as fit, at their measured mean round time, in
        the equal split's (FedAvg's) predicted time for the rounds run, none predicted to
        overshoot it by over half a round. ``False``: the same rounds, sooner.
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
    max_weight_ratio: float | None = Field(default=2.0, ge=1, allow_inf_nan=False)
    robust_aggregation: Literal["trusted-clip", "centered-clip", "mean"] = "trusted-clip"
    clip_factor: float = Field(default=1.0, gt=0, allow_inf_nan=False)
    bound_claimed_pull: bool = Field(default=False, strict=True)
    max_loss_ratio: float = Field(default=10.0, gt=1, allow_inf_nan=False)
    max_empty_rounds: int = Field(default=3, ge=1, strict=True)
    spend_saved_time: bool = Field(default=False, strict=True)

    @property
    def start_only(self) -> str | None:
        """The setting given that only ``LBBSPFedAvg.start`` carries out, not a wrapper
        strategy's loop (``checkpoint_dir``, ``spend_saved_time``); ``None``: neither."""
        if self.checkpoint_dir is not None:
            return "checkpoint_dir"
        return "spend_saved_time" if self.spend_saved_time else None

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
    """How the encrypted strategy treats a silo named for spoiling an aggregate.

    Parameters
    ----------
    exclude_named_for : int | None (default: None)
        Rounds a silo named for spoiling an aggregate is left out, the round it is named
        in included, >= 1; ``None``: for the rest of the run.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

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
    """A strategy's ``keys`` argument as :class:`~fl_lbbsp.contract.RecordKeys`
    (:meth:`~fl_lbbsp.contract.RecordKeys.of`).

    Raises
    ------
    TypeError
        ``keys`` is neither a RecordKeys, a mapping of its fields nor ``None``.
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
    (:class:`ServerConfig`), the reply limits (:class:`ReplyLimits`) and the rest,
    balancing (:class:`BalancingConfig`, which refuses a name it does not know)."""
    server = {k: v for k, v in settings.items() if k in ServerConfig.model_fields}
    limits = {k: v for k, v in settings.items() if k in ReplyLimits.model_fields}
    balancing = {k: v for k, v in settings.items() if k not in server and k not in limits}
    return server, limits, balancing


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
    "spend-saved-time": "spend_saved_time",
}
"""Run-config keys a strategy reads from a Flower app's run config -> the keyword each
sets; the first three are required, ``telemetry-path`` ``""`` means none."""

EPOCHS_KEY = "local-epochs"
"""The run-config key of Flower's app templates for the epochs a silo trains a round; with
no ``local-steps`` declared, :func:`settings_of_run_config` derives tau from it."""

RUN_CONFIG_ALIASES: dict[str, str] = {"lr": "learning-rate"}
"""A key of :data:`RUN_CONFIG_KEYS` -> the name Flower's own app templates give it, read
when the key itself is absent (``flwr new``'s PyTorch app declares ``learning-rate``)."""


def refuse_numeric_strings(settings: Mapping[str, Any], *, owner: str) -> None:
    """Refuse a number written as a string (``"2.0"``, ``"10"``) for any numeric setting,
    the same way for every setting and every entry point (a constructor keyword, a run
    config value), instead of coercing some fields and refusing others.

    Raises
    ------
    InvalidSettingError
        Naming each such setting, its value and how to write it.
    """
    models: tuple[type[BaseModel], ...] = (ServerConfig, ReplyLimits, BalancingConfig, Tuning)
    bad = []
    for name, value in settings.items():
        if not isinstance(value, str) or not _is_number(value):
            continue
        field = next((m.model_fields[name] for m in models if name in m.model_fields), None)
        if field is None or field.annotation is None:
            continue
        try:
            TypeAdapter(field.annotation).validate_python(value, strict=True)
        except ValidationError:
            bad.append(f"{name} must be a number, not the string {value!r}")
    if bad:
        raise InvalidSettingError(
            f"{owner}: "
            + "; ".join(bad)
            + " (pass the number itself; in a Flower run config write it unquoted, "
            "e.g. --run-config 'local-steps=10')"
        )


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def local_steps_of_epochs(epochs: float, batch_size: int, num_examples: int | Sequence[int]) -> int:
    """tau for ``epochs`` epochs of the median silo at ``batch_size``:
    ``max(1, round(epochs * ceil(n / batch_size)))`` with ``n`` the median of
    ``num_examples`` (a silo's dataset size, or every silo's). LB-BSP keeps tau the same
    for every silo (Chen et al., IEEE TCC 2021, Sec. 3.5), so a silo with more data than
    the median trains under ``epochs`` epochs a round and one with less over.

    Raises
    ------
    ValueError
        ``epochs`` not positive and finite, or a size not positive.
    """
    sizes = [num_examples] if isinstance(num_examples, int) else list(num_examples)
    if not sizes or any(isinstance(n, bool) or n <= 0 for n in sizes):
        raise ValueError(f"num_examples must be positive sizes, got {num_examples!r}")
    if not (epochs > 0 and math.isfinite(epochs)):
        raise ValueError(f"local-epochs must be positive, got {epochs!r}")
    median = statistics.median(sizes)
    return max(1, round(epochs * math.ceil(median / batch_size)))


def settings_of_run_config(
    run_config: Mapping[str, Any], overrides: Mapping[str, Any], *, owner: str
) -> dict[str, Any]:
    """A strategy's keywords from a Flower app's run config, ``overrides`` winning.

    tau (``local-steps``) replaces the app's own ``local-epochs``: when the run config
    declares no ``local-steps`` but ``local-epochs`` and ``overrides`` give
    ``num_examples`` (a silo's dataset size, or a list of every silo's), tau is the median
    silo's steps for those epochs at ``batch-size`` (:func:`local_steps_of_epochs`), said
    once at INFO; with both ``local-steps`` and ``local-epochs`` declared, one line says
    which one the silos run.

    Raises
    ------
    InvalidSettingError
        A required key is missing from both: the message says where to declare it (and,
        for ``local-steps`` next to a ``local-epochs``, how to derive it); a number
        written as a string (:func:`refuse_numeric_strings`).
    """
    config = dict(run_config)
    given = dict(overrides)
    sizes = given.pop("num_examples", None)
    for key, alias in RUN_CONFIG_ALIASES.items():
        if key not in config and alias in config:
            config[key] = config[alias]
        elif alias in config and config[alias] != config[key]:
            log.warning(
                "the run config has %s = %s and %s = %s: the strategy sends every silo %s",
                key, config[key], alias, config[alias], key,
            )  # fmt: skip
    epochs = config.get(EPOCHS_KEY)
    if "local-steps" not in config and "local_steps" not in given and epochs is not None:
        batch = given.get("initial_batch_size", config.get("batch-size"))
        if sizes is not None and isinstance(batch, int) and not isinstance(batch, bool):
            try:
                tau = local_steps_of_epochs(float(epochs), batch, sizes)
            except (TypeError, ValueError) as err:
                raise InvalidSettingError(f"{owner}.from_run_config: {err}") from None
            log.info(
                "local-steps = %d: %s local epoch(s) of the median silo at batch-size %d "
                "(tau is the same for every silo; it replaces the app's local-epochs)",
                tau, epochs, batch,
            )  # fmt: skip
            given["local_steps"] = tau
        else:
            raise InvalidSettingError(
                f"{owner}.from_run_config: the run config has local-epochs = {epochs} but "
                "no 'local-steps': LB-BSP trains every silo tau local steps, which replace "
                "the app's epochs; declare local-steps = local-epochs x ceil(n / batch-size) "
                "for the median silo's n samples (for example, one epoch of 2,688 samples "
                "at batch-size 32 would be local-steps = 84) under [tool.flwr.app.config], "
                "or pass num_examples=n (or every silo's sizes) to from_run_config to "
                "derive it"
            )
    elif sizes is not None:
        raise InvalidSettingError(
            f"{owner}.from_run_config: num_examples derives local-steps from local-epochs; "
            "the run config declares local-steps (or it was passed) or no local-epochs"
        )
    elif epochs is not None and "local-steps" in config:
        log.info(
            "local-steps = %s replaces the app's local-epochs = %s: every silo runs that "
            "many steps a round (one epoch of n samples at batch-size B is ceil(n / B))",
            config["local-steps"], epochs,
        )  # fmt: skip
    required = ("batch-size", "local-steps", "lr")
    missing = [k for k in required if k not in config and RUN_CONFIG_KEYS[k] not in given]
    if missing:
        named = f" (keywords given: {', '.join(sorted(given))})" if given else ""
        raise InvalidSettingError(
            f"{owner}.from_run_config: the run config has no "
            + ", ".join(repr(key) for key in missing)
            + "; declare them in the app's pyproject.toml under [tool.flwr.app.config], "
            "e.g. batch-size = 32, local-steps = 10, lr = 0.05, or pass them: "
            "from_run_config(context.run_config, "
            + ", ".join(f"{RUN_CONFIG_KEYS[k]}=..." for k in missing)
            + ")"
            + named
        )
    settings = {name: config[key] for key, name in RUN_CONFIG_KEYS.items() if key in config}
    if settings.get("telemetry_path") == "":
        settings["telemetry_path"] = None
    return {**settings, **given}
