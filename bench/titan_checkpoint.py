"""torchtitan's own checkpoint timings, on torch DCP or on hyperdcp (hyperdcp.install()).

torchtitan's CheckpointManager saves an FSDP2 model with its AdamW state, learning-rate
scheduler, data loader and train state (sync mode: `dcp.save` per step), then a restarted job
finds the newest step by itself and loads it (`dcp.load`). This times those calls, as
torchtitan's trainer makes them, barrier to barrier (max over ranks), on the same job with
either library. Run each library in its own job, alternating, e.g.:

  for i in 1 2 3; do for lib in torch hyperdcp; do
    OMP_NUM_THREADS=1 torchrun --nproc_per_node 2 bench/titan_checkpoint.py $lib /tmp/titan \\
      --size-mb 512 --saves 3
  done; done

Prints one line per job: the library, the bytes saved, the median save and load seconds, the
time inside the library's save and load, the framework's own share of it (its Statefuls'
state_dict() and load_state_dict(), which run inside either library's call), the CPU seconds
of all ranks in each call, and the disk's own time for the same bytes (each rank writes and
fsyncs its share, then reads it back), measured in the same job.
The page cache is not dropped: loads read what the saves just wrote (warm), for both.
"""

import argparse
import os
import shutil
import statistics
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("library", choices=["torch", "hyperdcp"])
parser.add_argument("dir")
parser.add_argument("--size-mb", type=int, default=512, help="model + optimizer state, about")
parser.add_argument("--saves", type=int, default=3)
args = parser.parse_args()

if args.library == "hyperdcp":
    import hyperdcp

    hyperdcp.install()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402
from torchtitan.components.checkpoint import CheckpointManager  # noqa: E402
from torchtitan.components.optimizer import (LRSchedulersContainer,  # noqa: E402
                                             OptimizersContainer, ParamGroupConfig)

# The library's own share: time inside torch DCP's save and load (whichever serves them).
import torch.distributed.checkpoint as _dcp  # noqa: E402

inside = {"save": 0.0, "load": 0.0, "engine": 0.0}


def _timing(name, fn):
    def call(*a, **k):
        t0 = time.perf_counter()
        try:
            result = fn(*a, **k)
            inside["engine"] += getattr(result, "total_seconds", 0.0)  # hyperdcp's C++ share
            return result
        finally:
            inside[name] += time.perf_counter() - t0
    return call


_dcp.save, _dcp.load = _timing("save", _dcp.save), _timing("load", _dcp.load)

dist.init_process_group("gloo")
RANK = dist.get_rank()
WIDTH = 1024
# fp32 parameters and AdamW's two moments: 12 bytes a parameter.
LAYERS = max(1, args.size_mb * 2**20 // (12 * WIDTH * WIDTH))


class TrainState:
    def __init__(self):
        self.step = 0

    def state_dict(self):
        return {"step": self.step}

    def load_state_dict(self, sd):
        self.step = sd["step"]


def job(folder: str):
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    optims = OptimizersContainer.Config(
        param_groups=[ParamGroupConfig(pattern=r".*", optimizer_name="AdamW",
                                       optimizer_kwargs={"lr": 1e-3})],
        implementation="for-loop").build(model_parts=[model])
    scheds = LRSchedulersContainer.Config(warmup_steps=1).build(optimizers=optims,
                                                                 training_steps=100)
    state = TrainState()
    manager = CheckpointManager.Config(enable=True, folder=folder, interval=1,
                                       keep_latest_k=0).build(
        dataloader=None, model_parts=[model], optimizers=optims, lr_schedulers=scheds,
        states={"train_state": state}, sd_adapter=None, base_folder=args.dir)
    return model, optims, scheds, state, manager


def timed(fn, cpu: list = None) -> float:
    """Seconds barrier to barrier, max over ranks; the CPU seconds (user + system, every
    thread) of all ranks in that window are appended to `cpu`."""
    dist.barrier()
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    dist.barrier()
    took = torch.tensor([time.perf_counter() - t0, time.process_time() - c0], dtype=torch.float64)
    dist.all_reduce(took[:1], op=dist.ReduceOp.MAX)
    cpu_sum = took[1:].clone()
    dist.all_reduce(cpu_sum, op=dist.ReduceOp.SUM)
    if cpu is not None:
        cpu.append(cpu_sum.item())
    return took[0].item()


def floor(nbytes: int) -> tuple:
    """The disk's own rate for a checkpoint of `nbytes` on this job's ranks: each rank writes
    its share in 8 MiB pieces and fsyncs it, then reads it back (warm), as the libraries do."""
    share = nbytes // dist.get_world_size()
    piece = bytearray(8 << 20)
    path = os.path.join(args.dir, f"floor-{RANK}")

    def write():
        with open(path, "wb") as f:
            for pos in range(0, share, len(piece)):
                f.write(memoryview(piece)[:min(len(piece), share - pos)])
            f.flush()
            os.fsync(f.fileno())

    def read():
        with open(path, "rb", buffering=0) as f:
            while f.readinto(piece):
                pass

    w, r = timed(write), timed(read)
    os.remove(path)
    return w, r


def main() -> None:
    folder = f"titan-{args.library}"
    if RANK == 0:
        shutil.rmtree(os.path.join(args.dir, folder), ignore_errors=True)
    dist.barrier()
    model, optims, scheds, state, manager = job(folder)
    x = torch.randn(8, WIDTH)
    model(x).square().mean().backward()
    optims.step()  # AdamW state exists
    saves, save_cpu, load_cpu = [], [], []
    for _ in range(args.saves):
        state.step += 1
        saves.append(timed(lambda: manager.save(state.step), save_cpu))
    save_inside = inside["save"] / args.saves
    manager.close()
    model, optims, scheds, state, manager = job(folder)  # a restarted job
    loads = [timed(lambda: manager.load(), load_cpu)]
    load_inside = inside["load"]
    assert state.step == args.saves, state.step
    manager.close()
    # The framework's own part of a load, the same for either library: its Statefuls'
    # state_dict() (torch's get_model/optimizer_state_dict, which first gives a fresh optimizer
    # its state with a zero step) and load_state_dict() (set_*_state_dict), in a fresh job.
    model, optims, scheds, state, manager = job(folder)
    t0 = time.perf_counter()
    statefuls = {k: v for k, v in manager.states.items() if hasattr(v, "load_state_dict")}
    sds = {k: v.state_dict() for k, v in statefuls.items()}
    t1 = time.perf_counter()
    for k, v in statefuls.items():
        v.load_state_dict(sds[k])
    helpers_save, helpers_load = t1 - t0, time.perf_counter() - t1
    manager.close()
    size = sum(p.numel() * 12 for p in model.parameters())  # parameters + 2 moments, fp32
    write_floor, read_floor = floor(size)
    if RANK == 0:
        print(f"titan_checkpoint {args.library}: {size / 2**20:.0f} MiB, save "
              f"{statistics.median(saves):.3f} s (median of {len(saves)}), load "
              f"{statistics.median(loads):.3f} s; in {args.library}'s save and load (rank 0, "
              f"mean): {save_inside:.3f} s and {load_inside:.3f} s; the framework's own "
              f"state_dict() and load_state_dict() in a fresh job: {helpers_save:.3f} s and "
              f"{helpers_load:.3f} s; CPU of all ranks: save {statistics.median(save_cpu):.3f} s, "
              f"load {statistics.median(load_cpu):.3f} s; the disk for the same bytes: write + "
              f"fsync {write_floor:.3f} s, read {read_floor:.3f} s", flush=True)
        shutil.rmtree(os.path.join(args.dir, folder), ignore_errors=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
