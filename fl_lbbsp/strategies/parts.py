"""The parts a Message-API LB-BSP strategy is built from, and what it says of them.

:class:`EngineParts` builds, from a strategy's setting keywords, the round engine
(:class:`~fl_lbbsp.core.round.engine.RoundEngine`), the server's settings, telemetry, defences
and round outcomes, and gives what the strategy's summary, logs and checkpoints need of
them: its scheme, its settings line, the state a checkpoint holds.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flwr.app import ArrayRecord
from pydantic import ValidationError

from ..contract import RecordKeys
from ..core.round.deadline import DeadlinePolicy
from ..core.round.engine import RoundEngine
from ..core.round.rewriters import FastestReplies, InstructionRewriter
from ..core.settings import CLAIM_SETTINGS
from ..security.identity import SiloRegistry, load_registry
from ..telemetry import TelemetryWriter
from .config import ServerConfig, setting_error, split_settings
from .defenses import Defenses
from .outcomes import RoundOutcomes, route_to_flower
from .rounds import EngineView
from .updates import Updates

__all__ = ["EngineParts"]

log = logging.getLogger("fl_lbbsp")


class EngineParts(EngineView):
    """The engine, settings, telemetry, defences and outcomes of an LB-BSP strategy."""

    keys: RecordKeys
    updates: Updates[Any]
    server_config: ServerConfig
    telemetry: TelemetryWriter
    poll_interval: float | None
    outcomes: RoundOutcomes
    """Rejections logged once per silo and cause, empty rounds counted."""
    defenses: Defenses

    def build_parts(
        self,
        *,
        initial_batch_size: int,
        local_steps: int,
        lr: float,
        rewriter: InstructionRewriter | None,
        selector: FastestReplies | None,
        silo_registry: str | Path | Mapping[str, Any] | SiloRegistry | None,
        parameter_server: bool,
        settings: Mapping[str, Any],
    ) -> ServerConfig:
        """Build the parts from the strategy's keywords; return the server's settings.

        A parameter server weighs replies by their batch sizes, gives sample offsets and
        leaves out a reply without a usable report; FL weighs them by dataset size.

        Raises
        ------
        InvalidSettingError
            On a bad setting, naming the keyword, its bounds and the value.
        """
        server, limits, balancing = split_settings(settings)
        weight_key = self.keys.batch_size if parameter_server else self.keys.num_examples
        try:
            config = self.server_config = ServerConfig(**server)
            self.engine = RoundEngine.from_keywords(
                initial_batch_size=initial_batch_size,
                local_steps=local_steps,
                lr=lr,
                keys=self.keys,
                weight_key=weight_key,
                balancing=balancing,
                deadline=DeadlinePolicy(
                    margin=config.deadline_margin,
                    floor=config.deadline_floor,
                    ceiling=config.deadline_ceiling,
                ),
                rewriter=rewriter,
                selector=selector,
                registry=None if silo_registry is None else load_registry(silo_registry),
                offsets=parameter_server,
                require_valid_report=parameter_server,
                **limits,
            )
        except ValidationError as err:
            raise setting_error(err, owner=type(self).__name__) from None
        self.telemetry = TelemetryWriter(config.telemetry_path)
        self.poll_interval = config.poll_interval
        self.outcomes = RoundOutcomes(max_empty_rounds=config.max_empty_rounds)
        self.engine.max_weight_ratio = config.max_weight_ratio
        self.defenses = Defenses(
            max_update_ratio=config.max_update_ratio,
            update_spread_sigmas=config.update_spread_sigmas,
            max_weight_ratio=config.max_weight_ratio,
            weigh_by_size=not parameter_server,
        )
        route_to_flower()
        return config

    @property
    def scheme(self) -> str:
        """``"lbbsp"`` (``"lbbsp-tau"``, ``"lbbsp-partial"``, ...) when balancing,
        ``"fedavg"`` (``"partial"``) otherwise."""
        rewriter = self.engine.rewriter
        if self.engine.selector is not None:
            return "lbbsp-partial" if self.config.balance else "partial"
        if not self.config.balance:
            return "fedavg"
        return "lbbsp" if rewriter is None else f"lbbsp-{rewriter.name}"

    def log_settings(self) -> None:
        """One line with the LB-BSP settings (for the strategy's summary)."""
        c = self.config
        log.info(
            "LB-BSP settings: scheme=%s B_init=%d tau=%d eta=%g estimator=%s(alpha=%g) "
            "allocator=%s",
            self.scheme,
            c.initial_batch_size,
            c.local_steps,
            c.lr,
            c.estimator,
            c.alpha,
            c.allocator,
        )

    # -------------------------------------------------------------- checkpoints
    def checkpoint_settings(self) -> dict[str, Any]:
        """The settings a checkpoint must have been written with for this strategy to
        resume it (JSON values): those that decide batch sizes and updates."""
        balancing = self.config.model_dump(mode="json", exclude=set(CLAIM_SETTINGS))
        return {"balancing": balancing, **self.updates.settings()}

    def checkpoint_state(self) -> tuple[dict[str, Any], dict[str, ArrayRecord]]:
        """The state between two rounds: the engine's (JSON) and the updates' (JSON and
        ArrayRecords)."""
        state, records = self.updates.state_dict()
        return {**self.engine.state_dict(), **state}, records

    def load_checkpoint_state(
        self, state: Mapping[str, Any], records: Mapping[str, ArrayRecord]
    ) -> None:
        """Restore :meth:`checkpoint_state`."""
        self.engine.load_state_dict(state)
        self.updates.load_state_dict(state, records)
