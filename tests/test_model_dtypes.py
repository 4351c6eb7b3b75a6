"""Models with integer and 0-d layers (BatchNorm's ``num_batches_tracked``, an int64
scalar) keep their layout through the plaintext aggregations and the Message-API strategy
(the legacy strategy's case is in tests/test_legacy.py)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fl_lbbsp.contract import RecordKeys
from fl_lbbsp.core.aggregation import WeightedMean, as_layer
from fl_lbbsp.core.centered_clip import CenteredClip
from fl_lbbsp.runs.inprocess import InProcessGrid
from fl_lbbsp.strategies import LBBSPFedAvg

KEYS = RecordKeys()


# ------------------------------------------------------------------ the aggregators
@pytest.mark.parametrize("make", [WeightedMean, lambda: CenteredClip(iterations=1)])
def test_an_integer_scalar_layer_comes_back_a_rounded_array_of_its_dtype(make: Any) -> None:
    # Prepare: a float layer and an int64 scalar (a counter); weights 1 and 2
    mean = make()
    mean.begin([np.zeros(3, np.float32), np.array(0, np.int64)])

    # Execute: counters 10 and 20: the weighted mean is 16.67
    mean.add([np.ones(3, np.float32), np.array(10)], weight=1.0)
    mean.add([np.ones(3, np.float32), np.array(20)], weight=2.0)
    layers = mean.result()

    # Assert: an array (Flower's Array takes no numpy scalar), int64, rounded to 17
    assert isinstance(layers[1], np.ndarray) and layers[1].shape == ()
    assert layers[1].dtype == np.int64 and int(layers[1]) == 17
    assert layers[0].dtype == np.float32


@pytest.mark.parametrize(
    ("values", "dtype", "message"),
    [(np.array([np.nan]), np.float32, "NaN or inf"), (np.array([1e40]), np.float32, "as float32"),
     (np.array([300.0]), np.int8, "does not fit int8")],
)  # fmt: skip
def test_a_layer_that_cannot_take_its_dtype_is_refused(
    values: Any, dtype: Any, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        as_layer(values, np.dtype(dtype), 0)


# ------------------------------------------------------------ the Message-API strategy
def _app() -> ClientApp:
    """Silo p adds 1 to the weights and 10 * (p + 1) steps to the counter."""
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        p = int(context.node_config["partition-id"])  # type: ignore[arg-type]
        b = int(msg.content["config"][KEYS.batch_size])  # type: ignore[index]
        arrays = msg.content["arrays"]
        moved = ArrayRecord(
            {
                "w": Array(arrays["w"].numpy() + np.float32(1)),  # type: ignore[index]
                "n": Array(np.asarray(arrays["n"].numpy() + 10 * (p + 1))),  # type: ignore[index]
            }
        )
        metrics = {KEYS.num_examples: 100, KEYS.train_time: 0.01 * (p + 1), KEYS.batch_size: b}
        silo = ConfigRecord({KEYS.silo_id: str(p)})
        content = RecordDict(
            {"arrays": moved, "metrics": MetricRecord(metrics), KEYS.silo_record: silo}
        )
        return Message(content, reply_to=msg)

    return app


@pytest.mark.parametrize("robust", ["mean", "centered-clip"])
def test_the_message_api_strategy_keeps_an_integer_scalar_buffer(robust: str) -> None:
    # Prepare: 3 silos of equal size; counters +10, +20, +30 in round 1
    strategy = LBBSPFedAvg(
        initial_batch_size=8, local_steps=2, lr=0.1, fraction_evaluate=0.0,
        min_train_nodes=3, min_available_nodes=3, deadline_margin=None,
        robust_aggregation=robust,
    )  # fmt: skip
    initial = ArrayRecord(
        {"w": Array(np.zeros(4, np.float32)), "n": Array(np.array(0, dtype=np.int64))}
    )

    # Execute
    result = strategy.start(grid=InProcessGrid(_app(), num_nodes=3), initial_arrays=initial,
                            num_rounds=2)  # fmt: skip

    # Assert: two rounds ran, the counter is int64 and 0-d: the mean is 20, then 20 + 20
    # (centred clipping, once the batch sizes differ, clips within the silos' 30 to 50)
    counter = result.arrays["n"].numpy()
    assert counter.dtype == np.int64 and counter.shape == ()
    assert int(counter) == 40 if robust == "mean" else 30 <= int(counter) <= 50
    assert result.arrays["w"].numpy() == pytest.approx(np.full(4, 2.0))
