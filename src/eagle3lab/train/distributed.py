"""Data-parallel training under torchrun: one process per device, NCCL between GPUs (each rank on its own GPU,
LOCAL_RANK), gloo between CPU processes. A single process (no WORLD_SIZE) needs none of it."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class Dist:
    rank: int = 0
    world: int = 1

    @property
    def main(self) -> bool:
        return self.rank == 0

    def barrier(self):
        if self.world > 1:
            dist.barrier()

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        """The sum over ranks (a copy); `t` must live on this rank's device (NCCL reduces GPU tensors only)."""
        if self.world > 1:
            t = t.clone()
            dist.all_reduce(t)
        return t

    def gather(self, obj) -> list:
        """Every rank's `obj`, in rank order."""
        if self.world == 1:
            return [obj]
        out = [None] * self.world
        dist.all_gather_object(out, obj)
        return out


def init_distributed(device: torch.device) -> Dist:
    """Join the torchrun process group: NCCL when this rank trains on a GPU, gloo on the CPU."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return Dist()
    if device.type == "cuda":
        torch.cuda.set_device(device)  # NCCL's collectives (and all_gather_object) use the current device
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    if device.type == "cpu":
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))  # ranks share the cores
    return Dist(dist.get_rank(), dist.get_world_size())
