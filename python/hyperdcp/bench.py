"""dcp against torch.distributed.checkpoint, on the same DTensor state dict, in one run.

    torchrun --nproc_per_node 4 -m hyperdcp.bench [--size-mb 256] [--repeat 3] [--dir DIR]
        [--hidden 1024] [--pause 1] [--json OUT] [--no-verify]

The state dict is model-shaped (bf16 embedding and per-layer attention/MLP matrices, fp32
norms, a step counter) on a 1-d mesh of every rank: the embedding and the norms are
Replicate() (about a quarter of the bytes: dedup matters), the matrices Shard(0). Both
libraries save it into the same directory, with their defaults (torch: FileSystemWriter /
FileSystemReader, fsync on), under the same conditions:

- save: the directory is deleted and `sync`ed (then --pause seconds) before each save;
- load.cold: every file of the checkpoint is fsync'ed and dropped from the page cache
  (posix_fadvise DONTNEED) before the load; the residency left (mincore) is reported;
- load.warm: every file is read just before the load;
- reshard: a cold load into other placements (Shard(0) -> Shard(1), Replicate() -> Shard(0));
- with --dir s3://bucket/prefix (configured from the environment: AWS_ENDPOINT_URL, keys):
  torch DCP writes and reads through fsspec (FsspecWriter/FsspecReader over s3fs, its
  documented path to object storage), dcp natively; every object is deleted before each
  save, and there is no cache, so load.warm is another cold load;
- with an object store, the requests each library sent in each phase (all ranks, per GiB):
  dcp's client counts its own, torch's calls are counted where s3fs makes every one;
- async.blocked: async_save until it returned (the caller's blocking time, max over ranks),
  async.total: until persisted. torch's async_save gets a gloo group of its own, as its
  documentation advises (dcp derives one itself).

Times are barrier to barrier on rank 0, medians over --repeat; the order of the two
libraries alternates between repetitions. Loaded values are compared with the saved ones
in the first repetition (untimed). Ratio: torch seconds / dcp seconds (> 1: dcp faster).
"""

import argparse
import json
import statistics
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as torch_dcp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard

import hyperdcp as dcp
from hyperdcp import _dcp
from hyperdcp._bench_scratch import scratch_for
from hyperdcp._delegate import torch_function

PHASES = ["save", "load.cold", "load.warm", "reshard", "async.blocked", "async.total"]


# -- the state dict --------------------------------------------------------------------------
def model_shapes(size_mb: float, hidden: int,
                 layers: Optional[int] = None) -> Dict[str, Tuple[Tuple[int, ...], torch.dtype, bool]]:
    """name -> (global shape, dtype, replicated). About size_mb MiB of unique bytes (the
    layers' share set by `layers` when given: 6 tensors a layer)."""
    total = size_mb * (1 << 20)
    h = hidden
    vocab = max(64, int(total * 0.25 / (2 * h)) // 64 * 64)
    layers = layers or max(1, round(total * 0.75 / (24 * h * h)))
    shapes = {"model.embed.weight": ((vocab, h), torch.bfloat16, True)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes[p + "attn_norm.weight"] = ((h,), torch.float32, True)
        shapes[p + "attn.qkv.weight"] = ((3 * h, h), torch.bfloat16, False)
        shapes[p + "attn.o.weight"] = ((h, h), torch.bfloat16, False)
        shapes[p + "mlp_norm.weight"] = ((h,), torch.float32, True)
        shapes[p + "mlp.up.weight"] = ((4 * h, h), torch.bfloat16, False)
        shapes[p + "mlp.down.weight"] = ((h, 4 * h), torch.bfloat16, False)
    shapes["model.norm.weight"] = ((h,), torch.float32, True)
    return shapes


def full_tensor(name: str, shape: Tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """The same values on every rank (seeded by the name)."""
    g = torch.Generator().manual_seed(sum(ord(c) * (i + 1) for i, c in enumerate(name)))
    return torch.randn(shape, generator=g, dtype=torch.float32).to(dtype)


def placement(replicated: bool, layout: str, ndim: int):
    if layout == "save":
        return Replicate() if replicated else Shard(0)
    return Shard(0) if replicated or ndim == 1 else Shard(1)  # the reshard layout


def local_of(full: torch.Tensor, p: Any, rank: int, world: int) -> torch.Tensor:
    # A tensor of its own (storage offset 0): torch's async_save deep-copies DTensors, which
    # fails for one whose local tensor is a view at an offset.
    if isinstance(p, Replicate):
        return full.clone()
    return full.chunk(world, p.dim)[rank].clone(memory_format=torch.contiguous_format)


def make_state(shapes, mesh, layout: str, fill: bool) -> Dict[str, Any]:
    """The state dict in `layout` ("save" or "reshard"): the values, or zeros (fill=False)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    sd: Dict[str, Any] = {}
    for name, (shape, dtype, replicated) in shapes.items():
        p = placement(replicated, layout, len(shape))
        if fill:
            local = local_of(full_tensor(name, shape, dtype), p, rank, world)
        else:
            local = torch.zeros(local_of(torch.empty(shape, dtype=dtype, device="meta"), p,
                                         rank, world).shape, dtype=dtype)
        sd[name] = DTensor.from_local(local, mesh, [p], run_check=False, shape=torch.Size(shape),
                                      stride=torch.empty(shape, device="meta").stride())
    sd["step"] = 1000
    return sd


def check(sd: Dict[str, Any], shapes, layout: str, what: str) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    for name, (shape, dtype, replicated) in shapes.items():
        want = local_of(full_tensor(name, shape, dtype), placement(replicated, layout, len(shape)),
                        rank, world)
        if not torch.equal(sd[name].to_local(), want):
            raise AssertionError(f"rank {rank}: {what}: {name} differs from the saved values")
    if sd["step"] != 1000:
        raise AssertionError(f"rank {rank}: {what}: step is {sd['step']!r}, not 1000")


def zero(sd: Dict[str, Any]) -> None:
    for v in sd.values():
        if isinstance(v, DTensor):
            v.to_local().zero_()
    sd["step"] = 0


def unique_bytes(shapes) -> int:
    return sum(torch.Size(s).numel() * torch.empty((), dtype=d).element_size()
               for s, d, _ in shapes.values())


# -- the two libraries -------------------------------------------------------------------------
class Dcp:
    name = "dcp"

    def __init__(self) -> None:
        self.last: Any = None  # the last call's result (its python_seconds)

    def save(self, sd, d):
        self.last = dcp.save(sd, d)

    def load(self, sd, d):
        self.last = dcp.load(sd, d)

    def async_save(self, sd, d):
        self.last = h = dcp.async_save(sd, d)
        return lambda: h.result(timeout=600)


class TorchDcp:
    name = "torch"

    def __init__(self, scratch: Any) -> None:
        self.async_pg = dist.new_group(backend="gloo")
        self.scratch = scratch  # its writer and reader for the scratch space

    # torch's own functions, even under hyperdcp.install() (the baseline must be torch's).
    def save(self, sd, d):
        torch_function("save")(sd, storage_writer=self.scratch.torch_writer())

    def load(self, sd, d):
        torch_function("load")(sd, storage_reader=self.scratch.torch_reader())

    def async_save(self, sd, d):
        f = torch_function("async_save")(sd, storage_writer=self.scratch.torch_writer(),
                                         process_group=self.async_pg)
        return lambda: f.result(timeout=600)


class Requests:
    """Object-store requests of either library on this rank: dcp's own client counts what it
    sends; torch's calls through s3fs are counted where every one passes
    (S3FileSystem._call_s3, one per S3 API call)."""

    def __init__(self, object_store: bool) -> None:
        self.on = object_store
        self.torch = 0
        if not object_store:
            return
        import s3fs

        original = s3fs.S3FileSystem._call_s3
        counter = self

        async def counted(fs, method, *args, **kwargs):
            counter.torch += 1
            return await original(fs, method, *args, **kwargs)

        s3fs.S3FileSystem._call_s3 = counted

    def of(self, lib: Any) -> int:
        if not self.on:
            return 0
        return _dcp.object_store_requests() if isinstance(lib, Dcp) else self.torch


# -- the run -----------------------------------------------------------------------------------
def preparation_seconds(sd: Dict[str, Any], repeat: int = 7) -> float:
    """Turning the state dict into the engine's entries on a repeated call (the reused
    preparation: each tensor checked, values encoded), this rank, median of `repeat`."""
    from . import _prepare

    times = []
    for _ in range(repeat + 1):
        t0 = time.perf_counter()
        _prepare.release(_prepare.prepare(sd, for_load=False))
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def fault_seconds(nbytes: int) -> float:
    """Allocating `nbytes` and touching every page once: what preparing staging must cost."""
    t0 = time.perf_counter()
    buf = torch.empty(max(nbytes, 1), dtype=torch.uint8)
    buf.fill_(1)
    seconds = time.perf_counter() - t0
    del buf
    return seconds


class MemcpyReference:
    """The physical reference of async.blocked: one copy of the bytes a rank stages into
    memory already faulted in, measured on every rank at once right before each async save
    (median of 3 copies, max over ranks), so that it shares the phase's conditions."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = max(nbytes, 1)

    def measure(self) -> float:
        # Allocated for the measurement only: held through the bench, 2x the staged bytes
        # would crowd the page cache the load phases measure.
        src = torch.ones(self.nbytes, dtype=torch.uint8)
        dst = torch.empty_like(src)
        dst.copy_(src)  # faulted in before timing
        dist.barrier()
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            dst.copy_(src)
            times.append(time.perf_counter() - t0)
        return max_over_ranks(statistics.median(times))


def local_bytes(sd: Dict[str, Any]) -> int:
    """The tensor bytes this rank holds (what async_save stages)."""
    return sum((v.to_local() if isinstance(v, DTensor) else v).nbytes
               for v in sd.values() if isinstance(v, torch.Tensor))


def timed(fn: Callable[[], Any]) -> float:
    dist.barrier()
    t0 = time.perf_counter()
    fn()
    dist.barrier()
    return time.perf_counter() - t0


def over_ranks(x: float, op: Any) -> float:
    """`x` reduced over all ranks with `op` (a dist.ReduceOp)."""
    t = torch.tensor([x], dtype=torch.float64)
    dist.all_reduce(t, op=op)
    return float(t.item())


def sum_over_ranks(x: float) -> float:
    return over_ranks(x, dist.ReduceOp.SUM)


def max_over_ranks(x: float) -> float:
    return over_ranks(x, dist.ReduceOp.MAX)


def run_lib(lib, states, shapes, scratch: Any, args, verify: bool, out: Dict[str, List[float]],
            resident: List[float], python: Dict[str, List[float]],
            memcpy: MemcpyReference, requests: Requests,
            sent: Dict[str, List[float]]) -> None:
    """One repetition of every phase; `python` gets dcp's Python-side seconds per phase, `sent`
    the object-store requests of all ranks per phase."""
    src, same, other = states
    d = scratch.ckpt

    def counting(phase: str, fn: Callable[[], Any]) -> Callable[[], Any]:
        def run():
            before = requests.of(lib)
            result = fn()
            sent[phase].append(requests.of(lib) - before)
            return result
        return run

    def py(phase: str) -> None:
        if isinstance(lib, Dcp):
            last = lib.last
            s = (last.blocked_seconds - last.staging.blocked_seconds
                 if phase == "async.blocked" else last.python_seconds)
            python[phase].append(max_over_ranks(s))
            if phase == "async.blocked":
                python["staged_bytes"].append(float(last.staging.bytes_staged))

    def load(phase: str, dst: Dict[str, Any], layout: str) -> None:
        out[phase].append(timed(counting(phase, lambda: lib.load(dst, d))))
        py(phase)
        if verify:
            check(dst, shapes, layout, f"{lib.name} {phase}")

    scratch.fresh(args.pause)
    out["save"].append(timed(counting("save", lambda: lib.save(src, d))))
    py("save")

    zero(same)
    resident.append(scratch.cold())
    load("load.cold", same, "save")

    zero(same)
    scratch.warm()
    load("load.warm", same, "save")

    zero(other)
    resident.append(scratch.cold())
    load("reshard", other, "reshard")

    scratch.fresh(args.pause)
    if isinstance(lib, Dcp):
        python["memcpy"].append(memcpy.measure())
    dist.barrier()
    before = requests.of(lib)
    t0 = time.perf_counter()
    wait = lib.async_save(src, d)
    blocked = time.perf_counter() - t0
    wait()
    dist.barrier()
    total = time.perf_counter() - t0
    sent["async.total"].append(requests.of(lib) - before)
    out["async.blocked"].append(max_over_ranks(blocked))
    out["async.total"].append(total)
    py("async.blocked")
    if verify:
        zero(same)
        lib.load(same, d)
        check(same, shapes, "save", f"{lib.name} async save")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hyperdcp.bench", description=__doc__.split("\n")[0])
    ap.add_argument("--size-mb", type=float, default=256, help="unique bytes of the state (MiB)")
    ap.add_argument("--hidden", type=int, default=1024, help="hidden size (a multiple of 4)")
    ap.add_argument("--layers", type=int, default=None,
                    help="layers (6 tensors each; default: from --size-mb and --hidden)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default=None, help="scratch directory or s3://bucket/prefix "
                    "(default: ./dcp-bench-scratch)")
    ap.add_argument("--pause", type=float, default=1.0, help="seconds after delete + sync")
    ap.add_argument("--json", default=None, help="write the results here (rank 0)")
    ap.add_argument("--no-verify", action="store_true")
    args = ap.parse_args(argv)

    if not dist.is_initialized():
        dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.hidden % (4 * world):
        raise SystemExit(f"--hidden {args.hidden} is not a multiple of 4 x {world} ranks")
    scratch = scratch_for(args.dir or "dcp-bench-scratch")
    d = scratch.ckpt
    mesh = init_device_mesh("cpu", (world,))
    shapes = model_shapes(args.size_mb, args.hidden, args.layers)
    nbytes = unique_bytes(shapes)
    repl = sum(torch.Size(s).numel() * torch.empty((), dtype=t).element_size()
               for s, t, r in shapes.values() if r)
    states = (make_state(shapes, mesh, "save", True), make_state(shapes, mesh, "save", False),
              make_state(shapes, mesh, "reshard", False))
    libs = [Dcp(), TorchDcp(scratch)]
    results = {lib.name: {p: [] for p in PHASES} for lib in libs}
    requests = Requests(d.startswith("s3://"))
    sent = {lib.name: {p: [] for p in PHASES} for lib in libs}
    resident: Dict[str, List[float]] = {lib.name: [] for lib in libs}
    python: Dict[str, List[float]] = {p: [] for p in PHASES[:-1] + ["staged_bytes", "memcpy"]}
    memcpy_ref = MemcpyReference(local_bytes(states[0]))
    if rank == 0:
        print(f"dcp.bench: {world} ranks (gloo), {len(shapes)} tensors, "
              f"{nbytes / 2**20:.0f} MiB unique ({repl / 2**20:.0f} MiB replicated on every "
              f"rank), {args.repeat} repetitions, in {d}", flush=True)
    # The one-time cost of getting async_save ready (staging pool allocated and faulted in,
    # the saver's group connected), as a training script pays it before its first save.
    dist.barrier()
    t0 = time.perf_counter()
    dcp.prepare_async_save(states[0])
    prepare_s = max_over_ranks(time.perf_counter() - t0)
    for rep in range(args.repeat):
        order = libs if rep % 2 == 0 else libs[::-1]
        for lib in order:
            run_lib(lib, states, shapes, scratch, args, verify=rep == 0 and not args.no_verify,
                    out=results[lib.name], resident=resident[lib.name], python=python,
                    memcpy=memcpy_ref, requests=requests, sent=sent[lib.name])
        if rank == 0:
            print(f"  repetition {rep + 1}/{args.repeat} done", flush=True)
    scratch.fresh(0)
    prep = preparation_seconds(states[0])
    staged = int(statistics.median(python["staged_bytes"]))
    memcpy = statistics.median(python["memcpy"])
    # Each async save against the reference measured right before it.
    over_memcpy = statistics.median(
        b / m for b, m in zip(results["dcp"]["async.blocked"], python["memcpy"]))
    fault = fault_seconds(staged)
    # Requests of all ranks, per GiB of the checkpoint, median over repetitions.
    per_gib = {n: {p: statistics.median(sum_over_ranks(x) for x in v) / (nbytes / 2**30)
                   for p, v in r.items() if v}
               for n, r in sent.items()} if requests.on else {}

    if rank == 0:
        notes = scratch.notes()
        med = {n: {p: statistics.median(v) for p, v in r.items()} for n, r in results.items()}
        gib = nbytes / 2**30
        print(f"\n{'phase':<15}{'dcp s':>10}{'torch s':>10}{'torch/dcp':>11}"
              f"{'dcp GiB/s':>11}{'torch GiB/s':>13}")
        for p in PHASES:
            a, b = med["dcp"][p], med["torch"][p]
            rate = (lambda s: f"{gib / s:.2f}") if p != "async.blocked" else (lambda s: "-")
            print(f"{p:<15}{a:>10.3f}{b:>10.3f}{b / a:>10.2f}x{rate(a):>11}{rate(b):>13}")
        worst = max(max(v) for v in resident.values()) if any(resident.values()) else 0.0
        print(f"(median of {args.repeat}; page-cache residency before cold loads: at most "
              f"{worst:.3f})")
        for n in notes:
            print("note:", n)
        if per_gib:
            print("\nobject storage requests per GiB (all ranks, median):")
            for p in per_gib["dcp"]:
                print(f"  {p:<15}dcp {per_gib['dcp'][p]:>8.0f}   torch {per_gib['torch'][p]:>8.0f}")
        tensors = len(shapes)
        print(f"\ndcp's Python side (max over ranks, median): preparing {tensors} tensors, "
              "agreeing, finishing")
        py_med = {p: statistics.median(v) for p, v in python.items() if v}
        for p in PHASES[:-1]:
            print(f"  {p:<15}{py_med[p] * 1e3:>9.2f} ms{py_med[p] / tensors * 1e6:>9.2f} "
                  f"us/tensor  ({py_med[p] / med['dcp'][p] * 100:.0f}% of the call)")
        print(f"  preparation alone, repeated on the same state: {prep * 1e3:.2f} ms, "
              f"{prep / tensors * 1e6:.2f} us/tensor")
        print(f"  async.blocked is {over_memcpy:.2f}x one memcpy of "
              f"the {py_med['staged_bytes'] / 2**20:.0f} MiB staged per rank (median of each "
              f"save against the copy measured right before it; copy {memcpy * 1e3:.1f} ms, "
              f"{min(python['memcpy']) * 1e3:.1f}-{max(python['memcpy']) * 1e3:.1f})")
        print(f"  prepare_async_save (once, before the first async_save): {prepare_s:.3f} s; "
              f"allocating and faulting in the staged bytes once: {fault:.3f} s")
        if args.json:
            doc = {"ranks": world, "backend": "gloo", "unique_bytes": nbytes,
                   "replicated_bytes": repl, "tensors": len(shapes), "hidden": args.hidden,
                   "repeat": args.repeat, "dir": d, "torch_version": torch.__version__,
                   "resident_fraction_before_cold": resident, "notes": notes,
                   "phases": {p: {"dcp_seconds": med["dcp"][p], "torch_seconds": med["torch"][p],
                                  "ratio_torch_over_dcp": med["torch"][p] / med["dcp"][p],
                                  "dcp_seconds_each": results["dcp"][p],
                                  "torch_seconds_each": results["torch"][p]}
                              for p in PHASES},
                   "dcp_python_seconds": {p: py_med[p] for p in PHASES[:-1]},
                   "dcp_python_us_per_tensor": {p: py_med[p] / tensors * 1e6
                                                for p in PHASES[:-1]},
                   "staged_bytes": py_med["staged_bytes"], "memcpy_seconds": memcpy,
                   "memcpy_seconds_each": python["memcpy"],
                   "async_blocked_over_memcpy": over_memcpy,
                   "prepare_async_save_seconds": prepare_s, "fault_seconds": fault,
                   "preparation_seconds": prep, "requests_per_gib": per_gib}
            with open(args.json, "w") as fh:
                json.dump(doc, fh, indent=1)
    dist.barrier()
    if rank == 0:
        if args.dir is None:
            scratch.remove()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
