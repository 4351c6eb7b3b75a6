"""The ServerApp of Flower's quickstart-pytorch with ``LBBSPFedAvg`` instead of ``FedAvg``."""

from __future__ import annotations

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from torch.utils.data import DataLoader

from fl_lbbsp.strategies import LBBSPFedAvg

from .task import Net, load_test_data, test

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run ``num-server-rounds`` LB-BSP rounds, evaluating the global model centrally."""
    config = context.run_config
    torch.manual_seed(0)
    model = Net()
    strategy = LBBSPFedAvg(  # was: FedAvg(fraction_evaluate=0.0)
        initial_batch_size=int(config["batch-size"]),
        local_steps=int(config["local-steps"]),
        lr=float(config["lr"]),
        fraction_evaluate=0.0,
        telemetry_path=str(config["telemetry"]) or None,
        # a cost model's times (client_app.py) are no wall time: not checked against it
        check_times=False if str(config.get("cost-model", "")) else None,
    )
    testloader = DataLoader(load_test_data(), batch_size=256)

    def evaluate_global(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        model.load_state_dict(arrays.to_torch_state_dict())
        loss, accuracy = test(model, testloader)
        return MetricRecord({"loss": loss, "accuracy": accuracy})

    strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(model.state_dict()),
        num_rounds=int(config["num-server-rounds"]),
        train_config=ConfigRecord(),
        evaluate_fn=evaluate_global,
    )
