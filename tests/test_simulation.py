"""End to end through Flower's Simulation Engine (Ray), on the embedded data."""

from __future__ import annotations

import pytest

from fl_lbbsp.runs.fl import SimulationConfig, run
from fl_lbbsp.runs.summary import fit_cost_line, summarise

pytestmark = pytest.mark.slow


def test_lbbsp_simulation_balances_emulated_silos(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Prepare: 3 silos of emulated capacity 4:2:1, 2 classes each; their times come from
    # a cost model (waited out), so the batch sizes do not depend on this machine's load
    config = SimulationConfig(
        scheme="lbbsp",
        silos=3,
        speeds=(4.0, 2.0, 1.0),
        partition="labels:2",
        rounds=4,
        local_steps=10,
        batch_size=32,
        lr=0.05,
        model="mlp",
        cost_model="0.0005,0.001",
        out=tmp_path,
    )

    # Execute
    events = run(config)

    # Assert
    train = [e for e in events if e["event"] == "train"]
    evaluate = [e for e in events if e["event"] == "evaluate"]
    assert [e["round"] for e in train] == [1, 2, 3, 4]
    assert len(evaluate) == 5  # initial model and every round
    assert all(e["total_batch_size"] == 96 for e in train)
    assert all(sum(s["batch-size"] for s in e["silos"].values()) == 96 for e in train)
    assert {s["batch-size"] for s in train[0]["silos"].values()} == {32}
    last = train[-1]["silos"]
    assert last["0"]["batch-size"] > last["1"]["batch-size"] > last["2"]["batch-size"]
    assert [last[s]["slowdown"] for s in ("0", "1", "2")] == [1.0, 2.0, 4.0]
    summary = summarise(events, cost=fit_cost_line(events), target_accuracy=0.5, steady_from=3)
    assert summary["emulated"] is True
    assert summary["idle_fraction_steady"] < train[0]["idle_fraction"]
    assert 0.0 <= summary["final_accuracy"] <= 1.0


def test_cluster_simulation_balances_cost_model_workers(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Prepare: 4 workers of emulated capacity 4:2:1:1 on a GPU-shaped cost model
    from fl_lbbsp.runs.cluster import ClusterConfig, run_cluster

    config = ClusterConfig(
        scheme="lbbsp",
        workers=4,
        speeds=(4.0, 2.0, 1.0, 1.0),
        iterations=5,
        batch_size=32,
        lr=0.05,
        model="mlp",
        cost_model="0.01,0.05,0.1,200",
        eval_every=5,
        out=tmp_path,
    )

    # Execute
    events = run_cluster(config)
    summary = summarise(events, target_accuracy=0.0)

    # Assert: the global batch stays 128; after the first report the batch sizes follow
    # the emulated capacities; the messaging overhead is measured every iteration
    train = [e for e in events if e["event"] == "train"]
    assert [e["round"] for e in train] == [1, 2, 3, 4, 5]
    assert all(sum(s["batch-size"] for s in e["silos"].values()) == 128 for e in train)
    last = train[-1]["silos"]
    assert last["0"]["batch-size"] > last["1"]["batch-size"] > last["2"]["batch-size"]
    assert train[-1]["round_time"] < train[0]["round_time"]
    assert all(e["overhead"] is not None and e["overhead"] >= 0 for e in train)
    assert summary["iterations_to_target"] == 0 and summary["time_to_target"] == 0.0
    assert 0 < summary["overhead_share"] < 1


def test_encrypted_cluster_keeps_worker_replicas_across_iterations(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Prepare: the workers' replicas live in Flower's node state between iterations
    pytest.importorskip("tenseal")
    from fl_lbbsp.crypto import generate_keys, write_key_files
    from fl_lbbsp.runs.cluster import ClusterConfig, run_cluster

    keys = write_key_files(generate_keys(), tmp_path / "keys")
    config = ClusterConfig(
        scheme="lbbsp", workers=2, speeds=(2.0, 1.0), iterations=3, batch_size=16, model="mlp",
        cost_model="0.01", eval_every=3, out=tmp_path / "run", encrypt=keys.public.parent,
    )  # fmt: skip

    # Execute
    events = run_cluster(config)

    # Assert: every iteration aggregated both encrypted gradients (none rejected) and the
    # workers evaluated their replicas at version 3
    train = [e for e in events if e["event"] == "train"]
    assert [e["round"] for e in train] == [1, 2, 3]
    assert all(sorted(e["silos"]) == ["0", "1"] and not e["missed"] for e in train)
    assert all(s["he-time"] > 0 for e in train for s in e["silos"].values())
    assert not [e for e in events if e["event"] == "rejected"]
    evaluate = [e for e in events if e["event"] == "evaluate"]
    assert [(e["round"], e["federated"]) for e in evaluate] == [(3, True)]
