"""Deterministic global tensors and the DTensor layouts the workers save and load."""

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

# name -> (global shape, dtype). Uneven: 10 rows and 3 rows over 4 (or 3) ranks.
SHAPES = {
    "even": ((8, 6), torch.float32),
    "uneven": ((10, 5), torch.float32),
    "tiny": ((3, 4), torch.bfloat16),
    "replicated": ((4, 4), torch.int64),
    "grid": ((6, 8), torch.float64),
}


def full(name: str, salt: int = 0) -> torch.Tensor:
    shape, dtype = SHAPES[name]
    n = shape[0] * shape[1]
    return (torch.arange(n, dtype=torch.float64).reshape(shape) * 1.5 + salt).to(dtype)


def placements(layout: str, name: str):
    """The placements of `name` in layout "a" (save) or "b" (load), on a 1-d mesh of all
    ranks (and a 2-d mesh for "grid" when the world has 4 ranks)."""
    if name == "replicated":
        return (Replicate(),) if layout == "a" else (Shard(1),)
    if name == "grid" and dist.get_world_size() == 4:
        return (Shard(0), Shard(1)) if layout == "a" else (Replicate(), Shard(0))
    return (Shard(0),) if layout == "a" else (Shard(1),)


def mesh_for(name: str):
    n = dist.get_world_size()
    if name == "grid" and n == 4:
        return init_device_mesh("cpu", (2, 2))
    return init_device_mesh("cpu", (n,))


def dtensor(layout: str, name: str, salt: int = 0):
    return distribute_tensor(full(name, salt), mesh_for(name), placements(layout, name))


def state(layout: str, salt: int = 0) -> dict:
    """A nested state dict: DTensors of every layout plus non-tensor values."""
    return {
        "model": {name: dtensor(layout, name, salt) for name in SHAPES},
        "extra": {"step": 100 + salt, "lr": 0.125, "name": "run-a", "flags": [True, None],
                  "betas": (0.9, 0.999)},
    }


def empty_state(layout: str) -> dict:
    sd = state(layout, salt=0)
    for t in sd["model"].values():
        t.to_local().fill_(-7)
    sd["extra"] = {"step": 0, "lr": 0.0, "name": "", "flags": [False, 1], "betas": (0, 0)}
    return sd


def check(sd: dict, salt: int = 0) -> None:
    for name, t in sd["model"].items():
        got, want = t.full_tensor(), full(name, salt)
        assert torch.equal(got, want), f"{name}: {got} != {want}"
    assert sd["extra"] == {"step": 100 + salt, "lr": 0.125, "name": "run-a",
                           "flags": [True, None], "betas": (0.9, 0.999)}, sd["extra"]
