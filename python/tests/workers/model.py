"""A small model, its optimizer and a few training steps, the same on every layout."""

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_state_dict,
                                                     set_state_dict)


def make_model() -> nn.Module:
    torch.manual_seed(0)
    # 7 output rows: uneven shards over 2 ranks.
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 7))


def make_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)


def train(model: nn.Module, optim: torch.optim.Optimizer, steps: int) -> None:
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(8, 16, generator=g)
        loss = model(x).square().mean()
        loss.backward()
        optim.step()
        optim.zero_grad()


def state(model: nn.Module, optim: torch.optim.Optimizer) -> dict:
    """The dcp state dict: model and optimizer in the layout they live in."""
    msd, osd = get_state_dict(model, optim)
    return {"model": msd, "optim": osd}


def restore(model: nn.Module, optim: torch.optim.Optimizer, sd: dict) -> None:
    set_state_dict(model, optim, model_state_dict=sd["model"], optim_state_dict=sd["optim"])


def full_state(model: nn.Module, optim: torch.optim.Optimizer) -> dict:
    """Unsharded copies on CPU, to compare layouts exactly."""
    msd, osd = get_state_dict(
        model, optim, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {"model": msd, "optim": osd}


def assert_equal(got, want, path: str = "") -> None:
    """Nested structures equal, tensors bit for bit."""
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor) and got.dtype == want.dtype, path
        assert torch.equal(got, want), f"{path}: {got} != {want}"
    elif isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys(), f"{path}: {got.keys()}"
        for k in want:
            assert_equal(got[k], want[k], f"{path}.{k}")
    elif isinstance(want, (list, tuple)):
        assert type(got) is type(want) and len(got) == len(want), f"{path}: {got}"
        for i, (g, w) in enumerate(zip(got, want)):
            assert_equal(g, w, f"{path}.{i}")
    else:
        assert got == want, f"{path}: {got!r} != {want!r}"
