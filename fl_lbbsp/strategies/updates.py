"""How a strategy reads, checks and sums the updates in its replies (the Flower side).

Each :class:`Updates` pairs a parser of a reply's ArrayRecord with one of the core's
aggregators (:mod:`fl_lbbsp.core.aggregation`): the plaintext mean by dataset size
(:class:`PlainMean`) and the parameter server's SGD step on the batch-size-weighted
gradient (:class:`GradientUpdate`). The encrypted ones live in
:mod:`fl_lbbsp.strategies.encrypted`. Replies are added one at a time as they are
screened: the arrays are zero-copy views of the received bytes, accumulated in place.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, Protocol, TypeVar

import numpy as np
from flwr.app import Array, ArrayRecord

from ..contract import InvalidReplyError
from ..core.aggregation import WeightedMean
from ..core.centered_clip import CenteredClip
from ..core.optim import SGD, GradientStep
from ..core.round.state import RoundState
from ..core.trusted_clip import TrustedClip
from ..security.screening import Layout
from ..security.update_screen import update_distance
from .validation import check_array_record, layout_of

__all__ = ["GradientUpdate", "PlainMean", "Updates"]

U = TypeVar("U")


class Updates(Protocol[U]):
    """The updates of one kind of strategy: parse, check and sum them, and checkpoint."""

    def begin(self, arrays: ArrayRecord, state: RoundState) -> None:
        """Start a round whose global model (as sent) is ``arrays``."""

    def config(self, state: RoundState) -> dict[str, float | int]:
        """Entries every train message of the round carries besides the instruction."""

    def expected_bytes(self, arrays: ArrayRecord) -> int:
        """The size of the update a reply should carry."""

    def parse(self, record: ArrayRecord, metrics: Mapping[str, Any], state: RoundState) -> U:
        """The reply's update, checked; :class:`InvalidReplyError` says why not."""

    def add(
        self,
        update: U,
        *,
        weight: float,
        scale: float = 1.0,
        silo: str | None = None,
        claimed: bool = False,
    ) -> None:
        """Accumulate one accepted update; ``scale`` (``sqrt(B_eq / B_i)``, >= 1) lets a
        silo sent a small batch a longer update where the aggregation clips; ``silo``: the
        stable id of the silo that sent it (a robust history's key); ``claimed``: the
        weight is the silo's own unchecked claim (where the aggregation clips, it buys no
        more pull than the median weight's)."""

    def distance(self, update: U) -> float | None:
        """How far the update moves the model (its distance to the global model sent, or
        a gradient's norm) for the server's screening; ``None``: unreadable (encrypted)."""

    @property
    def count(self) -> int:
        """Updates added this round."""

    def result(self) -> ArrayRecord:
        """The new global model; ``ValueError`` if none can be formed."""

    def settings(self) -> dict[str, Any]:
        """Settings a checkpoint must have been written with (JSON values)."""

    def state_dict(self) -> tuple[dict[str, Any], dict[str, ArrayRecord]]:
        """State between two rounds: JSON values and ArrayRecords."""

    def load_state_dict(self, state: Mapping[str, Any], records: Mapping[str, ArrayRecord]) -> None:
        """Restore :meth:`state_dict`."""


class PlainMean:
    """FedAvg's mean of plaintext updates, weighted by dataset size.

    Parameters
    ----------
    robust : CenteredClip | None (default: None)
        Combine the updates by weighted centred clipping (the strategies' default,
        ``robust_aggregation``, is its :class:`~fl_lbbsp.core.trusted_clip.TrustedClip`);
        ``None``: FedAvg's weighted mean, summed in place.
    """

    def __init__(self, *, robust: CenteredClip | None = None) -> None:
        self._mean: WeightedMean | CenteredClip = WeightedMean() if robust is None else robust
        self.robust = robust
        self._layout: Layout | None = None
        self._start: list[np.ndarray] | None = None

    def begin(self, arrays: ArrayRecord, state: RoundState) -> None:
        """Learn the layout of ``arrays`` (names, shapes and dtypes) and its values (what
        every update's distance is measured from)."""
        self._layout = layout_of(arrays)
        self._start = None
        if self._layout is not None:
            # in float64 once per round, not once per reply (update_distance's dtype)
            self._start = [
                np.asarray(arrays[spec.name].numpy(), dtype=np.float64) for spec in self._layout
            ]
            if self.robust is None:
                self._mean.begin([np.empty(s.shape, dtype=s.dtype) for s in self._layout])
            else:  # the clip measures every update from the model sent
                self.robust.begin(
                    [a.astype(s.dtype) for a, s in zip(self._start, self._layout, strict=True)]
                )

    def config(self, state: RoundState) -> dict[str, float | int]:
        """Nothing beyond the instruction."""
        return {}

    def expected_bytes(self, arrays: ArrayRecord) -> int:
        """The model's own size."""
        return sum(len(array.data) for array in arrays.values())

    def parse(
        self, record: ArrayRecord, metrics: Mapping[str, Any], state: RoundState
    ) -> list[np.ndarray]:
        """The global model's names, shapes and dtypes, all finite: zero-copy views."""
        if self._layout is None:
            raise InvalidReplyError("no plaintext global model to compare the arrays with")
        return check_array_record(record, self._layout)

    def add(
        self,
        update: list[np.ndarray],
        *,
        weight: float,
        scale: float = 1.0,
        silo: str | None = None,
        claimed: bool = False,
    ) -> None:
        """Add ``weight * update`` to the running sum (or keep it for the clip, its radius
        widened by ``scale`` and, for a ``claimed`` weight, bounded as the median weight's,
        under the silo's id ``silo``: the trusted clip's history)."""
        if self.robust is None:
            self._mean.add(update, weight=weight)
        else:
            self.robust.add(update, weight=weight, scale=scale, silo=silo, claimed=claimed)

    def distance(self, update: list[np.ndarray]) -> float | None:
        """The update's L2 distance to the global model sent."""
        return update_distance(update, self._start)

    @property
    def count(self) -> int:
        """Updates added this round."""
        return self._mean.count

    def result(self) -> ArrayRecord:
        """The weighted mean, in the model's dtypes."""
        return self._record(self._mean.result())

    def _record(self, arrays: list[np.ndarray]) -> ArrayRecord:
        assert self._layout is not None
        return ArrayRecord(
            {spec.name: Array(a) for spec, a in zip(self._layout, arrays, strict=True)}
        )

    @property
    def distrusted(self) -> list[str]:
        """The silos the trusted clip left out of the last result (none otherwise)."""
        return list(self.robust.distrusted) if isinstance(self.robust, TrustedClip) else []

    def settings(self) -> dict[str, Any]:
        """The robust aggregation, if any."""
        if self.robust is None:
            return {}
        robust: dict[str, Any] = {
            "factor": self.robust.factor,
            "iterations": self.robust.iterations,
            "bound_claims": self.robust.bound_claims,
        }
        if isinstance(self.robust, TrustedClip):
            robust.update(decay=self.robust.decay, patience=self.robust.patience)
        return {"robust": robust}

    def state_dict(self) -> tuple[dict[str, Any], dict[str, ArrayRecord]]:
        """The trusted clip's history of each silo (``trust``), else none: the mean
        starts afresh every round."""
        if isinstance(self.robust, TrustedClip):
            return {"trust": self.robust.state_dict().model_dump(mode="json")}, {}
        return {}, {}

    def load_state_dict(self, state: Mapping[str, Any], records: Mapping[str, ArrayRecord]) -> None:
        """Restore the trusted clip's history (``trust``), if any."""
        if isinstance(self.robust, TrustedClip) and "trust" in state:
            self.robust.load_state_dict(state["trust"])


class GradientUpdate(PlainMean):
    """The parameter server's step: SGD on the batch-size-weighted mean gradient.

    Parameters
    ----------
    lr, momentum, aggregation :
        As in :class:`~fl_lbbsp.strategies.LBBSPCluster`; the momentum buffers are
        checkpointed (record ``optimizer``).
    robust : CenteredClip | None (default: None)
        Clip each gradient around a robust centre before the weighted mean.
    """

    def __init__(
        self,
        *,
        lr: float,
        momentum: float = 0.0,
        aggregation: Literal["weighted", "naive"] = "weighted",
        robust: CenteredClip | None = None,
    ) -> None:
        super().__init__()
        self.robust = robust
        self.optimizer = SGD(lr=lr, momentum=momentum)
        self.aggregation = aggregation
        self._step = GradientStep(optimizer=self.optimizer, robust=robust)

    def begin(self, arrays: ArrayRecord, state: RoundState) -> None:
        """Start an iteration at the weights ``arrays``."""
        self._layout = layout_of(arrays)
        if self._layout is not None:
            self._step.begin([arrays[spec.name].numpy() for spec in self._layout])

    def add(
        self,
        update: list[np.ndarray],
        *,
        weight: float,
        scale: float = 1.0,
        silo: str | None = None,
        claimed: bool = False,
    ) -> None:
        """Add a gradient, weighted by its batch size (or 1 when naive): a weight the
        server set, so ``claimed`` is ignored."""
        self._step.add(
            update,
            weight=1.0 if self.aggregation == "naive" else weight,
            scale=scale,
            silo=silo,
        )

    def distance(self, update: list[np.ndarray]) -> float | None:
        """The gradient's norm."""
        return update_distance(update, None)

    @property
    def count(self) -> int:
        """Gradients added this iteration."""
        return self._step.count

    def result(self) -> ArrayRecord:
        """The weights after one SGD step."""
        return self._record(self._step.result())

    def settings(self) -> dict[str, Any]:
        """The momentum and the aggregation."""
        return {
            "parameter_server": {
                "momentum": self.optimizer.momentum,
                "aggregation": self.aggregation,
            },
            **super().settings(),
        }

    def state_dict(self) -> tuple[dict[str, Any], dict[str, ArrayRecord]]:
        """The SGD momentum buffers (record ``optimizer``, named like the weights) and the
        trusted clip's history, if any."""
        trust, _ = super().state_dict()
        buffers = self.optimizer.buffers
        if buffers is None or self._layout is None:
            return trust, {}
        named = zip(self._layout, buffers, strict=True)
        return trust, {"optimizer": ArrayRecord({s.name: Array(np.asarray(b)) for s, b in named})}

    def load_state_dict(self, state: Mapping[str, Any], records: Mapping[str, ArrayRecord]) -> None:
        """Restore the momentum buffers (in the weights' order) and the history."""
        super().load_state_dict(state, records)
        buffers = records.get("optimizer")
        self.optimizer.buffers = None if buffers is None else [a.numpy() for a in buffers.values()]
