"""The ClientApp of Flower's quickstart-pytorch, made an LB-BSP silo by ``@lbbsp_train()``.

The decorator reads ``batch-size``, ``local-steps`` and ``lr`` from the message and hands
them over as ``plan``; the loader draws exactly ``plan.local_steps`` batches of
``plan.batch_size``; ``with plan.timed()`` marks the compute the silo reports as
``train-time``. The decorator adds the rest of LB-BSP's metrics and the silo id.
"""

from __future__ import annotations

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from torch.utils.data import DataLoader

from fl_lbbsp.clients import LocalTraining, lbbsp_train

from .task import Net, load_data
from .task import train as train_fn

app = ClientApp()


@app.train()
@lbbsp_train()  # new: the LB-BSP adapter
def train(msg: Message, context: Context, plan: LocalTraining) -> Message:
    """Train the model on local data (quickstart-pytorch's train, with ``plan``)."""
    torch.set_num_threads(1)
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    partition_id = int(context.node_config["partition-id"])
    num_partitions = int(context.node_config["num-partitions"])
    trainset = load_data(partition_id, num_partitions)
    trainloader = DataLoader(trainset, batch_sampler=plan.batch_sampler(len(trainset)))  # new
    with plan.timed():  # new: the compute LB-BSP balances
        train_loss = train_fn(model, trainloader, plan.lr)
    metrics = {"train_loss": train_loss, "num-examples": len(trainset)}
    content = RecordDict(
        {"arrays": ArrayRecord(model.state_dict()), "metrics": MetricRecord(metrics)}
    )
    return Message(content=content, reply_to=msg)
