"""Cluster mode through the in-process grid: a short run without Ray."""

from __future__ import annotations

from pathlib import Path

from fl_lbbsp.runs.cluster import ClusterConfig, run_cluster_in_process
from fl_lbbsp.runs.summary import summarise


def test_in_process_run_balances_by_the_cost_model(tmp_path: Path) -> None:
    # Prepare: worker 0 twice as fast as worker 1 under a linear cost model
    config = ClusterConfig(
        scheme="lbbsp", workers=2, speeds=(2.0, 1.0), iterations=4, batch_size=16,
        model="mlp", cost_model="0.01", allocator="linear", eval_every=2, out=tmp_path,
    )  # fmt: skip

    # Execute
    events = run_cluster_in_process(config)

    # Assert: every iteration ran with the total kept, the fast worker got more samples,
    # and the test accuracy was evaluated at rounds 0, 2 and 4
    train = [e for e in events if e["event"] == "train"]
    assert [e["round"] for e in train] == [1, 2, 3, 4]
    assert all(e["total_batch_size"] == 32 for e in train)
    last = train[-1]["silos"]
    assert last["0"]["batch-size"] > last["1"]["batch-size"]
    assert [e["round"] for e in events if e["event"] == "evaluate"] == [0, 2, 4]
    assert summarise(events)["iterations"] == 4
