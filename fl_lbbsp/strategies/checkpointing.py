"""A strategy's checkpoints: :class:`Checkpointing` wraps a strategy (as Flower's DP
wrappers do), writes a checkpoint after every training round and alone shifts the round
numbers of a resumed run; :func:`resume_from` restores a strategy from its folder.
:meth:`LBBSPFedAvg.start <fl_lbbsp.strategies.LBBSPFedAvg.start>` wraps itself in one when
it has a ``checkpoint_dir``; the file is :mod:`fl_lbbsp.strategies.checkpoint`.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from ..core.settings import BalancingConfig
from ..telemetry import TelemetryWriter
from .checkpoint import (
    FORMAT_VERSION,
    Checkpoint,
    CheckpointError,
    CheckpointInvalidError,
    CheckpointLimits,
    CheckpointStore,
    CheckpointWriteError,
    check_arrays,
    load_checkpoint_key,
)
from .config import ServerConfig
from .later_rounds import EvaluateFn, LaterRounds
from .train_round import one_blas_thread

__all__ = ["Checkpointable", "Checkpointing", "resume_from", "save_checkpoint", "store_of"]

log = logging.getLogger("fl_lbbsp")


@runtime_checkable
class Checkpointable(Protocol):
    """What a checkpointed strategy offers besides Flower's round methods (every
    :class:`~fl_lbbsp.strategies.EngineStrategy` does): the folder and key
    (``server_config``), the dataset-size bound (``config``), the telemetry, and the
    settings a checkpoint must match, its state and their restore."""

    server_config: ServerConfig
    telemetry: TelemetryWriter

    @property
    def config(self) -> BalancingConfig: ...
    @property
    def scheme(self) -> str: ...
    def checkpoint_settings(self) -> dict[str, Any]: ...
    def checkpoint_state(self) -> tuple[dict[str, Any], dict[str, ArrayRecord]]: ...
    def load_checkpoint_state(
        self, state: Mapping[str, Any], records: Mapping[str, ArrayRecord]
    ) -> None: ...


def store_of(strategy: Checkpointable) -> CheckpointStore | None:
    """The strategy's ``checkpoint_dir`` under its ``checkpoint_key`` (``None``: no
    folder); a key file that cannot be used is a ``CheckpointError``."""
    server = strategy.server_config
    if server.checkpoint_dir is None:
        return None
    key = None if server.checkpoint_key is None else load_checkpoint_key(server.checkpoint_key)
    return CheckpointStore(server.checkpoint_dir, key=key)


def _manifest(strategy: Checkpointable) -> dict[str, Any]:
    return {
        "format": FORMAT_VERSION,
        "strategy": type(strategy).__name__,
        "scheme": strategy.scheme,
        "settings": strategy.checkpoint_settings(),
    }


def save_checkpoint(
    store: CheckpointStore, strategy: Checkpointable, server_round: int, arrays: ArrayRecord
) -> Path:
    """Write ``strategy``'s checkpoint of ``server_round`` with global model ``arrays``."""
    state, records = strategy.checkpoint_state()
    manifest = {**_manifest(strategy), "round": server_round, "saved_at": time.time()}
    return store.save(server_round, arrays=arrays, manifest=manifest, state=state, records=records)


def _flat(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """Strategy, scheme and every setting as one flat mapping (JSON values)."""
    flat = {k: manifest.get(k) for k in ("format", "strategy", "scheme")}
    for group, value in dict(manifest.get("settings") or {}).items():
        flat.update(value if isinstance(value, dict) else {group: value})
    return json.loads(json.dumps(flat))  # type: ignore[no-any-return]


def resume_from(
    strategy: Checkpointable,
    *,
    store: CheckpointStore | None = None,
    max_silos: int | None = None,
    initial_arrays: ArrayRecord | None = None,
) -> Checkpoint | None:
    """The newest checkpoint in ``store`` (``None``: :func:`store_of` the strategy), held
    against the strategy's bounds (``max_silos``, its ``max_dataset_size``), class, scheme
    and settings (one newer than the checkpoint is not compared) and ``initial_arrays``
    (:func:`~.checkpoint.check_arrays`), and restored into it; ``None``: a fresh start.

    Raises
    ------
    CheckpointError
        Another strategy, scheme or settings (each difference named), or no readable file;
        (``CheckpointInvalidError``) one that fails validation or cannot be restored.
    """
    store = store if store is not None else store_of(strategy)
    limits = CheckpointLimits(max_silos, strategy.config.tuning.max_dataset_size)
    if store is None or (checkpoint := store.latest(limits=limits)) is None:
        return None
    found, expected = _flat(checkpoint.manifest), _flat(_manifest(strategy))
    if newer := [name for name in expected if name not in found]:
        log.info(
            "checkpoint %s predates the settings %s: resumed with this strategy's values",
            checkpoint.path,
            ", ".join(newer),
        )
    if differences := [
        f"{name}={found[name]!r} (this strategy: {value!r})"
        for name, value in expected.items()
        if name in found and found[name] != value
    ]:
        raise CheckpointError(
            f"checkpoint {checkpoint.path} was written with {'; '.join(differences)}: resume "
            "with the same strategy and settings, or use another checkpoint_dir"
        )
    if initial_arrays is not None:
        with one_blas_thread():  # its norms are memory-bound; a busy machine's BLAS hangs
            check_arrays(checkpoint, initial_arrays, encrypted="fingerprint" in expected)
    try:
        strategy.load_checkpoint_state(checkpoint.state, checkpoint.records)
    except Exception as err:  # noqa: BLE001 - whatever the strategy cannot restore is refused
        reason = f"the strategy cannot restore it ({f'{type(err).__name__}: {err}'[:300]})"
        raise CheckpointInvalidError(checkpoint.path, "state", reason) from None
    return checkpoint


class Checkpointing(LaterRounds):
    """Checkpoint ``strategy`` after every training round; resume it from the newest one.

    Parameters
    ----------
    strategy : Strategy
        The wrapped strategy, :class:`Checkpointable` too (every
        :class:`~fl_lbbsp.strategies.EngineStrategy` is).
    store : CheckpointStore
        Where the checkpoints are written and the newest is resumed from.

    Notes
    -----
    Round k's checkpoint holds its new global model (the model sent, when it aggregated
    nothing) and the strategy's state; a round that stops the run (``NoUpdateError``)
    writes none. A failed write (a full disk) is logged and the run goes on; at the end of
    a :meth:`run` that wrote none it raises
    :class:`~fl_lbbsp.strategies.checkpoint.CheckpointWriteError`, one whose last writes
    failed logs an error naming the checkpoint a rerun resumes from.
    """

    def __init__(self, strategy: Strategy, *, store: CheckpointStore) -> None:
        if not isinstance(strategy, Checkpointable):
            raise TypeError(f"{type(strategy).__name__} offers no checkpoint state")
        super().__init__(strategy)
        self.checkpointed: Checkpointable = strategy
        self.store = store
        self.written: Path | None = None  # the newest checkpoint this run wrote
        self._unsaved: list[tuple[int, OSError]] = []  # the writes failed since
        self._sent: ArrayRecord | None = None

    def __repr__(self) -> str:
        return f"Checkpointing({self.strategy!r}, store={self.store.directory})"

    def summary(self) -> None:
        """The wrapped strategy's summary, and where the checkpoints go."""
        self.strategy.summary()
        log.info("checkpoints: every round in %s", self.store.directory)

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """The wrapped strategy's, in the run's round numbers."""
        self._sent = arrays
        return super().configure_train(server_round, arrays, config, grid)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The wrapped strategy's; then the round's checkpoint (a failed write is logged)."""
        arrays, metrics = super().aggregate_train(server_round, replies)
        server_round += self.round_offset
        model = arrays if arrays is not None else self._sent
        if model is not None:
            try:
                self.written = save_checkpoint(self.store, self.checkpointed, server_round, model)
                self._unsaved.clear()
            except OSError as err:
                self._unsaved.append((server_round, err))
                log.error("round %d: checkpoint not written: %s", server_round, err)
        return arrays, metrics

    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: EvaluateFn | None = None,
        *,
        resume: Checkpoint | None = None,
    ) -> Result:
        """Flower's round loop (:meth:`flwr.serverapp.strategy.Strategy.start`), resumed
        from ``resume`` (restored already, as a runner resolves it) or else the store's
        newest checkpoint (:func:`resume_from`): from round k, its model replaces
        ``initial_arrays``, ``evaluate_fn`` first evaluates it as round k, and rounds
        k+1 .. ``num_rounds`` run.

        Raises
        ------
        CheckpointError
            As :func:`resume_from`; (``CheckpointWriteError``) a run that wrote no checkpoint.
        """
        strategy = self.checkpointed
        if resume is None:
            resume = resume_from(strategy, store=self.store, initial_arrays=initial_arrays)
        if resume is not None:
            self.round_offset, initial_arrays = resume.server_round, resume.arrays
            dropped = strategy.telemetry.drop_rounds_after(self.round_offset)
            removed = f"; {dropped} telemetry events of later rounds removed" if dropped else ""
            log.info(
                f"[{strategy.scheme}] resuming from {resume.path}: round "
                f"{self.round_offset} of {num_rounds} done; the initial arrays passed to start "
                f"are ignored{removed}"
            )
            if self.round_offset >= num_rounds:
                return Result(arrays=resume.arrays)
        return self.run(
            grid=grid,
            initial_arrays=initial_arrays,
            num_rounds=num_rounds - self.round_offset,
            timeout=timeout,
            train_config=train_config,
            evaluate_config=evaluate_config,
            evaluate_fn=evaluate_fn,
        )

    def run(self, **options: Any) -> Result:
        """:meth:`LaterRounds.run`, every round checkpointed.

        Raises
        ------
        CheckpointWriteError
            No checkpoint written at all.
        """
        result = super().run(**options)
        if self._unsaved:  # no checkpoint at all is an error; later ones missing, a line
            (first, _), (last, err) = self._unsaved[0], self._unsaved[-1]
            if self.written is None:
                raise CheckpointWriteError(
                    f"no checkpoint written in {self.store.directory}: the writes of "
                    f"{len(self._unsaved)} rounds failed, the last with: {err}",
                    result=result,
                )
            rounds = f"round {first}" if first == last else f"rounds {first}-{last}"
            log.error(
                "%s not checkpointed (%s): a rerun resumes from %s", rounds, err, self.written
            )
        return result
