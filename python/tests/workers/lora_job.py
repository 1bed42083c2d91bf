"""A LoRA-style fine-tuning job on hyperdcp's incremental checkpoints, for test_incremental.py.

A frozen base of many tensors, small trained adapters, AdamW over the adapters only; every step
is saved (sync or async by step parity) into an incremental CheckpointManager with keep_last=2.
The job resumes from the root when it holds a step, checks what it loaded against the same
training replayed from scratch, bit for bit, and trains on to --steps. Deterministic: a step's
state depends only on the step number.

    python lora_job.py ROOT --steps N
"""

import argparse
import sys

import torch

import hyperdcp as dcp

BASE_TENSORS, DIM, RANK = 24, 64, 4


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.base = torch.nn.ParameterList(
            torch.nn.Parameter(torch.randn(DIM, DIM, generator=g), requires_grad=False)
            for _ in range(BASE_TENSORS))
        self.lora_a = torch.nn.Parameter(torch.randn(DIM, RANK, generator=g) * 0.01)
        self.lora_b = torch.nn.Parameter(torch.zeros(RANK, DIM))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for w in self.base:
            x = torch.tanh(x @ w + (x @ self.lora_a) @ self.lora_b)
        return x


def build():
    torch.manual_seed(0)
    model = Model()
    opt = torch.optim.AdamW([model.lora_a, model.lora_b], lr=1e-2)
    return model, opt


def train_step(model: Model, opt: torch.optim.Optimizer, step: int) -> None:
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(8, DIM, generator=g)
    loss = model(x).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()


def state(model: Model, opt: torch.optim.Optimizer, step: int) -> dict:
    return {"model": model.state_dict(), "optim": opt.state_dict(), "step": step}


def replay(step: int) -> dict:
    """The state after training steps 1..step, from scratch."""
    model, opt = build()
    for s in range(1, step + 1):
        train_step(model, opt, s)
    return state(model, opt, step)


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--steps", type=int, required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    model, opt = build()
    start = 1
    with dcp.CheckpointManager(args.root, keep_last=2, incremental=True, full_every=4,
                               no_dist=True) as mgr:
        latest = mgr.latest_step()
        if latest is not None:
            # Stateful objects, as torch DCP takes them: a fresh optimizer's state is created
            # from the checkpoint.
            sd = {"model": model, "optim": opt, "step": 0}
            mgr.load(sd)
            if not same(state(model, opt, sd["step"]), replay(latest)) or sd["step"] != latest:
                print(f"RESUMED WRONG STATE at step {latest}", flush=True)
                return 3
            for kept in mgr.steps():  # every step the manager lists loads, bit for bit
                m2, o2 = build()
                sd2 = {"model": m2, "optim": o2, "step": 0}
                mgr.load(sd2, step=kept)
                if not same(state(m2, o2, sd2["step"]), replay(kept)):
                    print(f"KEPT STEP {kept} LOADS WRONG", flush=True)
                    return 4
            print(f"resumed {latest}", flush=True)
            start = latest + 1
        for step in range(start, args.steps + 1):
            train_step(model, opt, step)
            sd = {"model": model, "optim": opt, "step": step}
            if step % 2:
                mgr.save(step, sd)
            else:
                mgr.async_save(step, sd)
            print(f"saved {step}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
