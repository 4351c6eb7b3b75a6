"""LB-BSP in a DDP training script: LeNet-5 on MNIST with per-rank batch sizes.

Launch with torchrun (gloo on CPU, NCCL on GPU), e.g. 4 ranks of which rank 0 behaves as a
machine 4x slower and rank 1 as one 2x slower (emulated, fl_lbbsp.clients.emulation: a rank
whose compute took t of CPU time waits until k t has passed since the compute started)::

    torchrun --standalone --nproc-per-node 4 examples/ddp_lbbsp.py \\
        --dataset mnist:../shared/data/mnist --slowdowns 4,2,1,1 --iterations 300

``--mode ddp`` runs plain DDP (equal batches, gradient mean) on the same data stream for
comparison. The lines marked ``# LB-BSP`` are all a DDP script needs.

Elastic restart: with ``--checkpoint PATH`` rank 0 saves the model, the optimiser and the
balancer's state every ``--checkpoint-every`` iterations and every rank resumes from the
file at start, so ``torchrun --max-restarts 3 ...`` restarts a job whose rank died and
continues from the last checkpoint (with another world size too: the balancer splits the
same global batch over the new ranks).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import TensorDataset

from fl_lbbsp.clients.emulation import CostModel, emulated_time
from fl_lbbsp.datasets import load_source, train_test_split
from fl_lbbsp.distributed import (
    LBBSPCoordinator,
    RankFailureError,
    init_distributed,
    lbbsp_data_loader,
)
from fl_lbbsp.models import build_model


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def _every(text: str) -> int | str:
    if text == "auto":
        return text
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError("--every must be a positive integer or auto")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument(
        "--mode",
        choices=("lbbsp", "ddp"),
        default="lbbsp",
        help="lbbsp: balanced batch sizes, weighted gradient; ddp: plain DDP",
    )
    cli.add_argument("--dataset", default="embedded", help="embedded | mnist:PATH | cifar10:PATH")
    cli.add_argument("--iterations", type=int, default=300)
    cli.add_argument("--batch-size", type=int, default=64, help="initial per-rank batch B_init")
    cli.add_argument("--lr", type=float, default=0.05)
    cli.add_argument("--momentum", type=float, default=0.9)
    cli.add_argument("--seed", type=int, default=0)
    cli.add_argument(
        "--split",
        choices=("global", "shard"),
        default="global",
        help="global: ranks split one global batch (BSP's exact gradient)",
    )
    cli.add_argument("--every", type=_every, default=10,
                     help="exchange times every k iterations, or auto (default: 10)")  # fmt: skip
    cli.add_argument("--backoff", type=int, default=4,
                     help="k backs off up to this many times while the sizes hold; 1: never "
                     "(default: 4)")  # fmt: skip
    cli.add_argument(
        "--no-review",
        dest="review",
        action="store_false",
        help="apply the balancer's allocation without the gate's review of it",
    )
    cli.add_argument(
        "--slowdowns", default="", help="emulated slowdown k per rank, e.g. 4,2,1,1 (default: none)"
    )
    cli.add_argument("--cost-model", type=CostModel.parse, default=None,
                     help="emulate a batch time t(B) = k (m B + b) instead of k t: 'm,b' in "
                     "seconds (per sample, per batch), waited out (default: none)")  # fmt: skip
    cli.add_argument("--threads", default="1", help="torch threads, one value or one per rank")
    cli.add_argument("--pin", action="store_true", help="pin rank r to CPU r mod #CPUs")
    cli.add_argument("--eval-every", type=int, default=25)
    cli.add_argument("--json-log", type=Path, default=None, help="rank 0 writes a JSON log here")
    cli.add_argument("--checkpoint", type=Path, default=None)
    cli.add_argument("--checkpoint-every", type=int, default=50)
    cli.add_argument("--die-at", type=int, default=None,
                     help="(to try an elastic restart) the last rank exits at this iteration "
                     "of the first attempt")  # fmt: skip
    cli.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        help="seconds a collective waits for a peer before failing",
    )
    args = cli.parse_args(argv)
    for name in ("iterations", "batch_size", "eval_every", "checkpoint_every", "backoff"):
        if getattr(args, name) <= 0:
            cli.error(f"--{name.replace('_', '-')} must be positive")
    return args


def per_rank(values: list[float], world: int, default: float, what: str) -> list[float]:
    if not values:
        return [default] * world
    if len(values) == 1:
        return values * world
    if len(values) != world:
        raise SystemExit(f"error: {what} lists {len(values)} values for {world} ranks")
    return values


def _first_attempt() -> bool:
    return os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"


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
    rank, world = init_distributed(timeout=args.timeout)
    try:
        code = train(args, rank, world)
    except (RankFailureError, RuntimeError) as err:
        # A peer died (in the balancer's exchange or the gradient all-reduce): say so in
        # one line and exit at once, without tearing down the broken group, so that
        # torchrun --max-restarts restarts the job from the last checkpoint.
        text = " ".join(str(err).split())[:300]
        if not isinstance(err, RankFailureError):
            text = f"rank {rank}: training failed ({text}); exiting for torchrun to restart"
        print(f"error: {text}", file=sys.stderr, flush=True)
        os._exit(1)
    dist.destroy_process_group()
    return code


def train(args: argparse.Namespace, rank: int, world: int) -> int:
    slowdowns = per_rank(_floats(args.slowdowns), world, 1.0, "--slowdowns")
    threads = per_rank(_floats(args.threads), world, 1.0, "--threads")
    torch.set_num_threads(int(threads[rank]))
    if args.pin and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {rank % (os.cpu_count() or 1)})
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" \
        else torch.device("cpu")  # fmt: skip

    data = load_source(args.dataset)
    train_set, test_set = train_test_split(data, test_fraction=0.2, seed=args.seed)
    dataset = TensorDataset(torch.from_numpy(train_set.x), torch.from_numpy(train_set.y))
    test_x, test_y = (
        torch.from_numpy(test_set.x).to(device),
        torch.from_numpy(test_set.y).to(device),
    )

    torch.manual_seed(args.seed)
    model = build_model("lenet5", input_shape=train_set.input_shape,
                        num_classes=train_set.num_classes).to(device)  # fmt: skip
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    emulating = any(k != 1.0 for k in slowdowns) or args.cost_model is not None
    coordinator = LBBSPCoordinator(  # LB-BSP: the plan of per-rank batch sizes
        initial_batch_size=args.batch_size, every=args.every, balance=args.mode == "lbbsp",
        backoff=args.backoff, review=args.review,
        cpu_time=emulating,  # an emulated slowdown scales the CPU time of the compute
    )  # fmt: skip
    start = 0
    if args.checkpoint is not None and args.checkpoint.is_file():
        saved = torch.load(args.checkpoint, map_location=device, weights_only=False)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        coordinator.load_state_dict(saved["coordinator"])  # LB-BSP: resume the balancer
        start = coordinator.iteration
        if rank == 0:
            print(f"resumed from {args.checkpoint} at iteration {start}", flush=True)
    # LB-BSP: time each rank's backward (DDP keeps its own all-reduce)
    ddp = coordinator.register(DistributedDataParallel(model))
    loader = lbbsp_data_loader(  # LB-BSP: batch B_rank of each iteration
        dataset, plan=coordinator, split=args.split, seed=args.seed,
        num_batches=args.iterations - start, start=start,
    )  # fmt: skip

    log: dict[str, Any] = {
        "config": {**{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                   "world_size": world, "backend": dist.get_backend(),
                   "slowdowns_per_rank": slowdowns, "threads_per_rank": threads},
        "iterations": [], "evaluations": [], "rebalances": [],
    }  # fmt: skip
    training_time = 0.0
    computes: list[float | None] = []  # this rank's reported compute time per iteration
    batches = iter(loader)
    last = time.perf_counter()  # an iteration's wall time runs from the end of the last
    for iteration in range(start + 1, args.iterations + 1):
        if iteration == args.die_at and rank == world - 1 and _first_attempt():
            print(f"rank {rank}: dying at iteration {iteration} (--die-at)", flush=True)
            os._exit(1)
        coordinator.begin()  # LB-BSP: the iteration's compute starts
        began = time.perf_counter()
        x, y = next(batches)
        x, y = x.to(device), y.to(device)
        loss = F.cross_entropy(ddp(x), y)
        optimizer.zero_grad()
        coordinator.scale_loss(loss).backward()  # LB-BSP: n B_rank / X, DDP's mean weighted
        optimizer.step()
        measured = coordinator.compute_time()
        if emulating and measured is not None:
            # A machine k times slower, of its own: t is this rank's CPU time (the ranks
            # share this host's cores; the wall time would multiply their contention by
            # k), and the rank waits until k t (or k (m B + b)) has passed since its
            # compute started, so the time it queued for a core is part of the wait.
            cpu = coordinator.compute_cpu_time()
            reported = emulated_time(measured if cpu is None else cpu, slowdowns[rank],
                                     cost=args.cost_model, batch_size=len(x),
                                     started=coordinator.began_at)  # fmt: skip
        else:
            reported = measured if measured is not None else time.perf_counter() - began
        sizes = coordinator.sizes
        changed = coordinator.step(reported)  # LB-BSP: every k, times exchanged, next sizes
        now = time.perf_counter()
        wall, last = now - last, now
        training_time += wall
        computes.append(reported if measured is not None else None)
        if rank == 0:
            log["iterations"].append({"iteration": iteration, "wall": wall, "sizes": list(sizes),
                                      "compute": reported})  # fmt: skip
            if changed:
                verdict = coordinator.last_verdict
                gate = None if verdict is None else {
                    "gain": verdict.gain, "noise": verdict.noise, "reason": verdict.reason,
                    "move": verdict.move}  # fmt: skip
                log["rebalances"].append({"iteration": iteration, "reports": {
                    str(r): [rep.batch_size, rep.compute_time, rep.iterations]
                    for r, rep in coordinator.last_reports.items()},
                    "sizes": list(coordinator.sizes), "gate": gate,
                    "every": coordinator.current_every})  # fmt: skip
        evaluate = iteration % args.eval_every == 0 or iteration == args.iterations
        save = args.checkpoint is not None and iteration % args.checkpoint_every == 0
        if rank == 0 and evaluate:
            acc = accuracy(model, test_x, test_y)
            log["evaluations"].append({"iteration": iteration, "time": training_time,
                                       "accuracy": acc, "loss": loss.item()})  # fmt: skip
            sizes_now = list(coordinator.sizes)
            print(f"iteration {iteration}: accuracy {acc:.4f}, training time "
                  f"{training_time:.2f} s, sizes {sizes_now}", flush=True)  # fmt: skip
        if rank == 0 and save:
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                     "coordinator": coordinator.state_dict()}  # fmt: skip
            args.checkpoint.parent.mkdir(parents=True, exist_ok=True)
            torch.save(state, args.checkpoint.with_suffix(".tmp"))
            os.replace(args.checkpoint.with_suffix(".tmp"), args.checkpoint)
        if evaluate or save:
            dist.barrier()  # everyone starts the next iteration together
            last = time.perf_counter()  # the evaluation is not training time
    coordinator.close()  # LB-BSP: no exchange of times left running at the teardown
    overhead = coordinator.overhead
    if rank == 0:
        log["summary"] = {
            "training_time": training_time, "iterations": args.iterations - start,
            "samples": sum(sum(it["sizes"]) for it in log["iterations"]),
            "final_sizes": list(coordinator.sizes),
            "balancer_overhead_per_iteration": overhead.per_iteration,
            "balancer_overhead_per_rebalance": overhead.per_rebalance,
            "balancer_seconds_per_iteration": overhead.seconds / max(overhead.iterations, 1),
            "disagreements": coordinator.disagreements,
        }  # fmt: skip
    if args.json_log is not None:
        # Rank 0 writes the log, every other rank its compute times beside it.
        args.json_log.parent.mkdir(parents=True, exist_ok=True)
        if rank == 0:
            log["compute"] = computes
            args.json_log.write_text(json.dumps(log, default=str))
        else:
            path = args.json_log.with_name(f"{args.json_log.stem}.rank{rank}.json")
            path.write_text(json.dumps({"compute": computes}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
