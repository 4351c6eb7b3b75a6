"""A textbook DDP training script, the baseline of ``bench_ddp.py``: what a user writes from
PyTorch's documentation, with nothing of LB-BSP in it.

torchrun starts the ranks; each initialises the gloo process group, draws its share of
every epoch with ``DistributedSampler`` through a ``DataLoader`` (per-rank batch 64), and
trains LeNet-5 wrapped in ``DistributedDataParallel(model)``, whose built-in all-reduce
averages the gradients; SGD lr 0.05, momentum 0.9, one torch thread per rank::

    torchrun --standalone --nproc-per-node 2 benchmarks/stock_ddp.py \\
        --dataset mnist:../shared/data/mnist --iterations 200 --json-log stock.json

What it adds for the benchmark, outside the training step: rank 0 records each
iteration's wall time (from the end of the iteration before, the batch's loading
included; an evaluation and its barrier are left out) and writes them to ``--json-log`` in
the layout ``examples/ddp_lbbsp.py`` writes; ``--pin`` pins rank r to CPU r (as the
example's ``--pin``, for the benchmark's CPU-burner case); ``--eval-every`` evaluates on
rank 0. The data (the project's MNIST loader and 80/20 split) and the model
(``fl_lbbsp.models``) are the example's, so that only the training loop differs.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from fl_lbbsp.datasets import load_source, train_test_split
from fl_lbbsp.models import build_model


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--dataset", default="embedded", help="embedded | mnist:PATH")
    cli.add_argument("--iterations", type=int, default=200)
    cli.add_argument("--batch-size", type=int, default=64, help="per-rank batch size")
    cli.add_argument("--lr", type=float, default=0.05)
    cli.add_argument("--momentum", type=float, default=0.9)
    cli.add_argument("--seed", type=int, default=0)
    cli.add_argument("--eval-every", type=int, default=0, help="0: once, at the end")
    cli.add_argument("--pin", action="store_true", help="pin rank r to CPU r mod #CPUs")
    cli.add_argument("--json-log", type=Path, default=None, help="rank 0 writes a JSON log here")
    args = cli.parse_args(argv)
    if args.iterations <= 0 or args.batch_size <= 0 or args.eval_every < 0:
        cli.error("--iterations and --batch-size must be positive, --eval-every >= 0")
    return args


def accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    with torch.no_grad():
        correct = sum(
            int((model(x[i : i + 500]).argmax(1) == y[i : i + 500]).sum())
            for i in range(0, len(x), 500)
        )
    model.train()
    return correct / len(x)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    if args.pin and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {rank % (os.cpu_count() or 1)})

    data = load_source(args.dataset)
    train_set, test_set = train_test_split(data, test_fraction=0.2, seed=args.seed)
    dataset = TensorDataset(torch.from_numpy(train_set.x), torch.from_numpy(train_set.y))
    test_x, test_y = torch.from_numpy(test_set.x), torch.from_numpy(test_set.y)
    sampler = DistributedSampler(dataset, seed=args.seed)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True)

    torch.manual_seed(args.seed)
    model = build_model("lenet5", input_shape=train_set.input_shape,
                        num_classes=train_set.num_classes)  # fmt: skip
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=args.momentum)

    eval_every = args.eval_every or args.iterations
    iterations: list[dict[str, Any]] = []
    evaluations: list[dict[str, Any]] = []
    training_time = 0.0
    iteration, epoch = 0, 0
    last = time.perf_counter()
    while iteration < args.iterations:
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = F.cross_entropy(ddp(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            now = time.perf_counter()
            iteration += 1
            training_time += now - last
            iterations.append({"iteration": iteration, "wall": now - last,
                               "sizes": [len(x)] * world})  # fmt: skip
            last = now
            if iteration % eval_every == 0 or iteration == args.iterations:
                if rank == 0:
                    evaluations.append({"iteration": iteration, "time": training_time,
                                        "accuracy": accuracy(model, test_x, test_y),
                                        "loss": loss.item()})  # fmt: skip
                dist.barrier()
                last = time.perf_counter()
            if iteration == args.iterations:
                break
        epoch += 1

    if rank == 0 and args.json_log is not None:
        log = {
            "config": {**{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                       "world_size": world, "backend": dist.get_backend(), "script": "stock"},
            "iterations": iterations, "evaluations": evaluations, "rebalances": [],
            "summary": {"training_time": training_time, "iterations": iteration,
                        "samples": sum(sum(it["sizes"]) for it in iterations),
                        "final_sizes": [args.batch_size] * world,
                        "balancer_overhead_per_iteration": 0.0,
                        "balancer_seconds_per_iteration": 0.0},
        }  # fmt: skip
        args.json_log.parent.mkdir(parents=True, exist_ok=True)
        args.json_log.write_text(json.dumps(log))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
