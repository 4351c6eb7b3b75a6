"""The server: FedAvg with LB-BSP batch sizes (LBBSPFedAvg), evaluated centrally."""

from __future__ import annotations

import logging

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp

from fl_lbbsp.clients import evaluate
from fl_lbbsp.strategies import LBBSPFedAvg

from .task import build_model_for, central_test_set

app = ServerApp()
log = logging.getLogger("fl_lbbsp")


def _positive_or_none(value: object) -> float | None:
    number = float(value)  # type: ignore[arg-type]
    return number if number > 0 else None


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run ``num-server-rounds`` LB-BSP rounds and evaluate the global model each round."""
    if not log.handlers:  # LB-BSP's per-round line in the run's log stream
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s : LB-BSP %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
    config = context.run_config
    torch.manual_seed(int(config["seed"]))
    test = central_test_set(context)
    model = build_model_for(context, test)
    min_nodes = int(config["min-nodes"])

    strategy = LBBSPFedAvg(
        initial_batch_size=int(config["batch-size"]),
        local_steps=int(config["local-steps"]),
        lr=float(config["lr"]),
        balance=str(config["scheme"]) == "lbbsp",
        allocator=str(config["allocator"]),
        estimator=str(config["estimator"]),
        estimator_options={
            "warmup": int(config.get("narx-warmup", 500)),
            "train_every": int(config.get("narx-train-every", 10)),
        }
        if str(config["estimator"]) == "narx"
        else None,
        alpha=float(config["alpha"]),
        telemetry_path=str(config["telemetry"]) or None,
        # a cost model's times (run config cost-model) are no wall time: not checked against it
        check_times=False if str(config.get("cost-model", "")) else None,
        deadline_margin=_positive_or_none(config["deadline-margin"]),
        deadline_floor=float(config["deadline-floor"]),
        deadline_ceiling=float(config["deadline-ceiling"]),
        poll_interval=_positive_or_none(config["poll-interval"]),
        fraction_evaluate=0.0,  # the server evaluates on the held-out split
        min_train_nodes=min_nodes,
        min_available_nodes=min_nodes,
        checkpoint_dir=str(config.get("checkpoint-dir", "")) or None,
        spend_saved_time=bool(config.get("spend-saved-time", False)),
        # registry.json of `fl-lbbsp keys silos`: only replies signed by the silo they
        # claim count (deploy-local --silo-registry gives it and the silos' keys)
        silo_registry=str(config.get("silo-registry", "")) or None,
    )
    x, y = torch.from_numpy(test.x), torch.from_numpy(test.y)

    def evaluate_global(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        model.load_state_dict(arrays.to_torch_state_dict())
        loss, accuracy = evaluate(model, x, y)
        strategy.telemetry.write(
            {"event": "evaluate", "round": server_round, "loss": loss, "accuracy": accuracy}
        )
        return MetricRecord({"loss": loss, "accuracy": accuracy})

    result = strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(model.state_dict()),
        num_rounds=int(config["num-server-rounds"]),
        train_config=ConfigRecord(),
        evaluate_fn=evaluate_global,
    )
    strategy.telemetry.write(
        {"event": "finished", "rounds": int(config["num-server-rounds"]), "ok": True}
    )
    log.info("final accuracy %s", result.evaluate_metrics_serverapp)
