"""Data-parallel training under ``torchrun``: every rank steps its own environments and
computes gradients on its own rollout; gradients are averaged before each optimizer step,
so all ranks hold identical weights. Rank 0 owns logging.

We average gradients by hand instead of wrapping the model in DDP because GSPO's
Hutchinson probes need a double backward and frozen layers change which parameters
have gradients; both are awkward with DDP's bucketed hooks.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from trainer import npu
from trainer.devices import dist_backend


@dataclass(frozen=True)
class DistContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def average_gradients(self, params: list[torch.nn.Parameter]) -> None:
        """Mean of every ``p.grad`` across ranks, as one flat all-reduce."""
        grads = [p.grad for p in params if p.grad is not None]
        if not self.enabled or not grads:
            return
        flat = torch.cat([g.reshape(-1).float() for g in grads])
        dist.all_reduce(flat)
        flat /= self.world_size
        offset = 0
        for g in grads:
            n = g.numel()
            g.copy_(flat[offset:offset + n].view_as(g))
            offset += n

    def all_reduce_mean(self, tensors: list[torch.Tensor]) -> None:
        if not self.enabled or not tensors:
            return
        flat = torch.cat([t.reshape(-1).float() for t in tensors])
        dist.all_reduce(flat)
        flat /= self.world_size
        offset = 0
        for t in tensors:
            n = t.numel()
            t.copy_(flat[offset:offset + n].view_as(t))
            offset += n

    def broadcast_module(self, module: torch.nn.Module) -> None:
        """Start every rank from rank 0's weights."""
        if not self.enabled:
            return
        for tensor in list(module.parameters()) + list(module.buffers()):
            dist.broadcast(tensor.data, src=0)


def init_distributed(device: torch.device) -> DistContext:
    """Join the process group when launched by torchrun (WORLD_SIZE > 1), else no-op."""
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    if world_size <= 1:
        return DistContext()
    if not dist.is_initialized():
        if device.type == "npu":
            npu.distributed_env_defaults()
        dist.init_process_group(backend=dist_backend(device))
    return DistContext(rank=dist.get_rank(), world_size=dist.get_world_size(),
                       local_rank=int(os.environ.get("LOCAL_RANK", 0)))


def shutdown(ctx: DistContext) -> None:
    if ctx.enabled and dist.is_initialized():
        dist.destroy_process_group()
