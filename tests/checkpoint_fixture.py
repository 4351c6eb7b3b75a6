"""The rounds behind ``tests/data/checkpoint-before-engine``: a parameter server with
momentum and three workers of speeds 4:2:1, fed replies that depend only on the round.

``python tests/checkpoint_fixture.py DIR`` (run with the fl_lbbsp of commit ae7511b, the
last before the round engine) wrote the checkpoint of round 2 and, in ``expected.json``,
what that version did in round 3 from it: the batch sizes it sent and the weights it
computed. ``test_checkpoint.py`` resumes the checkpoint with today's code.
"""

from __future__ import annotations

import json
import sys
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


def main(folder: Path) -> None:  # pragma: no cover - run once, with the old version
    from flwr.app import Array, ArrayRecord, ConfigRecord
    from flwr.supercore.task_identity import TaskIdentity

    from fl_lbbsp.strategies import LBBSPCluster
    from fl_lbbsp.strategies.checkpoint import CheckpointStore, save_checkpoint

    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0

    class Grid:
        def get_node_ids(self) -> list[int]:
            return list(NODES)

    strategy = LBBSPCluster(**SETTINGS)
    arrays = ArrayRecord({k: Array(v) for k, v in weights().items()})
    for server_round in (1, 2):
        sent = sent_sizes(
            list(strategy.configure_train(server_round, arrays, ConfigRecord(), Grid()))
        )
        arrays, _ = strategy.aggregate_train(server_round, replies(server_round, sent))
    save_checkpoint(CheckpointStore(folder), strategy, 2, arrays)
    sent = sent_sizes(list(strategy.configure_train(3, arrays, ConfigRecord(), Grid())))
    after, _ = strategy.aggregate_train(3, replies(3, sent))
    expected = {
        "round_3_sizes": {str(k): v for k, v in sent.items()},
        "round_3_weights": {k: after[k].numpy().tolist() for k in SHAPES},
    }
    (folder / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")


if __name__ == "__main__":  # pragma: no cover
    main(Path(sys.argv[1]))
