"""LB-BSP on torch.distributed: per-rank batch sizes in DDP, weighted gradient
aggregation, launched with torchrun (gloo on CPU, NCCL on GPU).

What a DDP script adds::

    coordinator = LBBSPCoordinator(initial_batch_size=64)          # after init_process_group
    model = coordinator.register(DistributedDataParallel(model))   # times its backward
    loader = lbbsp_data_loader(train_set, plan=coordinator)       # batch B_rank each iteration
    for x, y in loader:
        coordinator.begin()
        loss = coordinator.scale_loss(F.cross_entropy(model(x), y))  # n B_rank / X
        opt.zero_grad(); loss.backward(); opt.step()
        coordinator.step()                                         # every k: times, sizes

The loss factor makes DDP's own all-reduce mean the batch-size-weighted mean (exactly 1
while the sizes are equal); the times travel every k iterations; the sizes stay while the
ranks are equal within their noise (:class:`HoldGate`). See docs/ddp.md.

Reference: Chen et al., "Accelerating Distributed Learning in Non-Dedicated
Environments", IEEE TCC 2021, Sec. 3 and 4.
"""

from .coordinator import LBBSPCoordinator, Overhead, RankFailureError, RankReport
from .gate import HoldGate, Verdict, WindowStats
from .hooks import WeightedHookState, weighted_all_reduce_, weighted_allreduce_hook
from .runtime import default_backend, init_distributed
from .sampler import BatchPlan, LBBSPBatchSampler, Split, lbbsp_data_loader

__all__ = [
    "BatchPlan",
    "HoldGate",
    "LBBSPBatchSampler",
    "LBBSPCoordinator",
    "Overhead",
    "RankFailureError",
    "RankReport",
    "Split",
    "Verdict",
    "WeightedHookState",
    "WindowStats",
    "default_backend",
    "init_distributed",
    "lbbsp_data_loader",
    "weighted_all_reduce_",
    "weighted_allreduce_hook",
]
