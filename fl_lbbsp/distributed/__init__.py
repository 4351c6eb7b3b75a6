"""LB-BSP on torch.distributed: per-rank batch sizes in DDP, weighted gradient
aggregation, launched with torchrun (gloo on CPU, NCCL on GPU).

What a DDP script adds::

    coordinator = LBBSPCoordinator(initial_batch_size=64)          # after init_process_group
    model = coordinator.register(DistributedDataParallel(model))   # weighted all-reduce hook
    loader = lbbsp_data_loader(train_set, plan=coordinator)       # batch B_rank each iteration
    for x, y in loader:
        coordinator.begin()
        loss = F.cross_entropy(model(x), y); opt.zero_grad(); loss.backward(); opt.step()
        coordinator.step()                                         # gather times, rebalance

Reference: Chen et al., "Accelerating Distributed Learning in Non-Dedicated
Environments", IEEE TCC 2021, Sec. 3 and 4.
"""

from .coordinator import LBBSPCoordinator, Overhead, RankFailureError, RankReport
from .hooks import WeightedHookState, weighted_all_reduce_, weighted_allreduce_hook
from .runtime import default_backend, init_distributed
from .sampler import BatchPlan, LBBSPBatchSampler, Split, lbbsp_data_loader

__all__ = [
    "BatchPlan",
    "LBBSPBatchSampler",
    "LBBSPCoordinator",
    "Overhead",
    "RankFailureError",
    "RankReport",
    "Split",
    "WeightedHookState",
    "default_backend",
    "init_distributed",
    "lbbsp_data_loader",
    "weighted_all_reduce_",
    "weighted_allreduce_hook",
]
