"""Optimizers handed to a load before their first step."""

import sys
from typing import Any


def fill_empty_optimizers(state_dict: Any, directory: str) -> None:
    """A freshly built optimizer (no state yet) handed as a Stateful template would load
    nothing of the checkpoint's state: its state is created first (torch's get_state_dict
    does the same), when the checkpoint holds state for it, so the load fills it or fails
    naming what it cannot place. Never an empty success."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(state_dict, dict):
        return
    # Only optimizers whose state_dict() is torch's own: a container that overrides it
    # (torchtitan's OptimizersContainer: torch's get_optimizer_state_dict) creates the state
    # itself, and its own `state` stays empty.
    optimizer = torch.optim.Optimizer
    empty = [k for k, v in state_dict.items() if isinstance(v, optimizer) and not v.state
             and type(v).state_dict is optimizer.state_dict]
    if not empty:
        return
    from ._metadata import read_metadata

    stored = read_metadata(directory).tensors
    for key in empty:
        if any(name.startswith(f"{key}.state.") for name in stored):
            from torch.distributed.checkpoint.state_dict import _init_optim_state

            _init_optim_state(state_dict[key])
