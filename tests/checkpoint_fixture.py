"""A parameter server with momentum and three workers of speeds 4:2:1, fed replies that
depend only on the round, and its checkpoints (:func:`write_checkpoint`).

``tests/data/checkpoint-before-engine`` holds the round-2 checkpoint that
``python tests/checkpoint_fixture.py DIR`` wrote with the fl_lbbsp of commit ae7511b (the
checkpoint format 1): ``test_checkpoint.py`` checks that today's code refuses it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

NODES = (11, 12, 13)
SPEEDS = {11: 400.0, 12: 200.0, 13: 100.0}  # samples per second
SETTINGS: dict[str, Any] = {
    "initial_batch_size": 16,
    "lr": 0.1,
    "momentum": 0.9,
    "min_train_nodes": 3,
    "min_available_nodes": 3,
    "min_batch_fraction": 1 / 3,  # that version's default (today's is 0: a noise budget)
}
SHAPES = {"w": (3, 2), "b": (2,)}


def weights() -> dict[str, np.ndarray]:
    """The initial model."""
    return {k: np.full(s, 0.5, dtype=np.float32) for k, s in SHAPES.items()}


def replies(server_round: int, sizes: dict[int, int]) -> list[Any]:
    """Every worker's reply in ``server_round``, having been sent ``sizes``."""
    from flwr.app import (
        Array,
        ArrayRecord,
        ConfigRecord,
        Message,
        MessageType,
        Metadata,
        MetricRecord,
        RecordDict,
    )

    out = []
    for node in NODES:
        n = sizes[node]
        grads = {
            k: np.full(s, (node - 10) * 0.1 + 0.01 * server_round, dtype=np.float32)
            for k, s in SHAPES.items()
        }
        metrics = MetricRecord(
            {
                "batch-size": n,
                "num-examples": n,
                "train-time": n / SPEEDS[node],
                "samples-processed": n,
                "cpu-percent": 50.0,
                "memory-percent": 10.0,
                "max-batch-size": 0,
            }
        )
        content = RecordDict(
            {
                "arrays": ArrayRecord({k: Array(v) for k, v in grads.items()}),
                "metrics": metrics,
                "silo": ConfigRecord({"silo-id": f"w{node}"}),
            }
        )
        metadata = Metadata(
            run_id=1, message_id="", src_node_id=node, dst_node_id=0,
            reply_to_message_id="", group_id="1", created_at=time.time(), ttl=60.0,
            message_type=MessageType.TRAIN,
        )  # fmt: skip
        out.append(Message(content=content, metadata=metadata))
    return out


def sent_sizes(messages: list[Any]) -> dict[int, int]:
    """Node -> the batch size its train message carries."""
    return {
        m.metadata.dst_node_id: int(m.content.config_records["config"]["batch-size"])
        for m in messages
    }


def write_checkpoint(folder: Path, rounds: int, **settings: Any) -> Path:
    """Run ``rounds`` rounds of the parameter server (no training: the fixture replies)
    and save the checkpoint of the last in ``folder`` (needs Flower's TaskIdentity set:
    the tests' ``flower_task``)."""
    from flwr.app import Array, ArrayRecord, ConfigRecord

    from fl_lbbsp.strategies import LBBSPCluster
    from fl_lbbsp.strategies.checkpoint import CheckpointStore
    from fl_lbbsp.strategies.checkpointing import save_checkpoint

    class Grid:
        def get_node_ids(self) -> list[int]:
            return list(NODES)

    strategy = LBBSPCluster(**{**SETTINGS, **settings})
    arrays = ArrayRecord({k: Array(v) for k, v in weights().items()})
    for server_round in range(1, rounds + 1):
        messages = strategy.configure_train(server_round, arrays, ConfigRecord(), Grid())  # type: ignore[arg-type]
        after, _ = strategy.aggregate_train(
            server_round, replies(server_round, sent_sizes(list(messages)))
        )
        assert after is not None
        arrays = after
    return save_checkpoint(CheckpointStore(folder), strategy, rounds, arrays)
