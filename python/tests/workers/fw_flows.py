"""Training frameworks' own checkpoint code, on torch DCP or on hyperdcp through install().

Args: FLOW MODE OUTDIR. FLOW is one of titan, accelerate, fabric, torchtune; MODE "torch" (the
framework on torch.distributed.checkpoint as it is) or "hyperdcp" (`hyperdcp.install()` first,
before any framework is imported, so the framework's calls to torch DCP run on hyperdcp).
Run under torchrun with 2 ranks (gloo, CPU). Each flow drives the framework's checkpoint API the
way its trainer does (save, discover the latest checkpoint, resume, export), checks in the job
that a resume restores model and optimizer bit for bit, and writes what it got (full tensors,
gathered to rank 0, plain CPU tensors, and the values the framework restored) to
OUTDIR/result-FLOW.pt on rank 0, so that a test compares the torch run with the hyperdcp run.
Prints "FLOW: ok" on every rank, or "FLOW: skipped (why)" where the framework is not installed.
"""

import os
import sys

FLOW, MODE, OUTDIR = sys.argv[1:4]

if MODE == "hyperdcp":
    import hyperdcp

    if not hasattr(hyperdcp, "install"):
        sys.exit(f"{FLOW}: this hyperdcp ({getattr(hyperdcp, '__file__', '?')}) has no "
                 "install(), which the hyperdcp mode needs")
    hyperdcp.install()
elif MODE != "torch":
    sys.exit(f"usage: fw_flows.py FLOW torch|hyperdcp OUTDIR (got mode {MODE!r})")

import importlib  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.distributed.checkpoint.state_dict import (StateDictOptions,  # noqa: E402
                                                     get_state_dict)
from torch.distributed.fsdp import fully_shard  # noqa: E402

OUT = Path(OUTDIR)
RANK = int(os.environ.get("RANK", "0"))


# ---------------------------------------------------------------------------------------------
# The model, its data and the comparisons: the same in every flow.

def make_model(seed: int) -> nn.Module:
    """~1.6 MB of parameters; 127 output rows shard unevenly over 2 ranks."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(128, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                         nn.Linear(512, 127))


def shard(model: nn.Module, mesh=None) -> nn.Module:
    """FSDP2 over the 2 ranks: each Linear, then the root."""
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def batch(step: int, rank: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(16, 128, generator=g)


def loss_of(model: nn.Module, step: int, rank: int) -> torch.Tensor:
    return model(batch(step, rank)).square().mean()


def train_step(model, optim, step: int, rank: int = None, backward=None) -> float:
    loss = loss_of(model, step, RANK if rank is None else rank)
    (backward or torch.Tensor.backward)(loss)
    optim.step()
    optim.zero_grad()
    return loss.item()


def full_state(model: nn.Module, optim) -> dict:
    """Model and optimizer unsharded on rank 0 (empty elsewhere), plain CPU tensors: copies
    (get_state_dict hands out the optimizer's live CPU tensors, "step" among them)."""
    msd, osd = get_state_dict(
        model, optim, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return plain({"model": msd, "optim": osd})


def plain(value):
    """Nested dicts/lists of tensors and values, the tensors as plain CPU tensors."""
    if isinstance(value, torch.Tensor):
        if hasattr(value, "full_tensor"):
            value = value.full_tensor()
        return value.detach().cpu().clone()
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(plain(v) for v in value)
    return value


def flatten(value, prefix: str, out: dict) -> dict:
    """{"a": {"b": t}} -> {"prefix/a/b": t}; lists stay values (with tensors inside)."""
    if isinstance(value, dict):
        for k, v in value.items():
            flatten(v, f"{prefix}/{k}", out)
    else:
        out[prefix] = plain(value)
    return out


def assert_equal(got, want, path: str = "") -> None:
    """Nested structures equal, tensors bit for bit (dtype included)."""
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), f"{path}: {type(got)}"
        assert got.dtype == want.dtype and got.shape == want.shape, \
            f"{path}: {got.dtype}{tuple(got.shape)} != {want.dtype}{tuple(want.shape)}"
        assert torch.equal(got, want), f"{path}: values differ" + (
            f" ({got.item()} != {want.item()})" if want.dim() == 0 else "")
    elif isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys(), \
            f"{path}: keys {sorted(map(str, got))} != {sorted(map(str, want))}"
        for k in want:
            assert_equal(got[k], want[k], f"{path}/{k}")
    elif isinstance(want, (list, tuple)):
        assert isinstance(got, (list, tuple)) and len(got) == len(want), f"{path}: {got!r}"
        for i, (g, w) in enumerate(zip(got, want)):
            assert_equal(g, w, f"{path}/{i}")
    else:
        assert got == want, f"{path}: {got!r} != {want!r}"


def listing(path: Path) -> list:
    return sorted(p.name for p in path.iterdir()) if path.is_dir() else []


def check_saved(path: Path) -> None:
    """The framework's save went through the mode's library: under install() a hyperdcp
    checkpoint (a do-nothing install() would otherwise compare torch with torch), else torch's."""
    if RANK != 0:
        return
    if MODE == "hyperdcp":
        import hyperdcp

        hyperdcp.read_metadata(path)  # DcpError where it is not a hyperdcp checkpoint
    else:
        assert (path / ".metadata").is_file(), f"{path}: no .metadata, not a torch DCP save"


def framework(name: str):
    """The framework's module, or None (and the flow is skipped) where it is not installed."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        print(f"{FLOW}: skipped ({name} is not importable: {e})", flush=True)
        return None


def init_gloo() -> None:
    if not dist.is_initialized():
        dist.init_process_group("gloo")


# ---------------------------------------------------------------------------------------------
# torchtitan: CheckpointManager (dcp.save / dcp.async_save / dcp.load, step-N folders found by
# their .metadata, keep_latest_k purging, a model-only export in export_dtype at the last step).

class Loader:
    """A dataloader position under a per-rank key, as torchtitan's ParallelAwareDataloader."""

    def __init__(self):
        self.pos = 0

    def state_dict(self):
        return {f"dp_rank_{RANK}": {"pos": self.pos}, "world_size": 2}

    def load_state_dict(self, sd):
        assert sd["world_size"] == 2, sd
        self.pos = sd[f"dp_rank_{RANK}"]["pos"]


class TrainState:
    """torchtitan's Trainer is itself the "train_state" Stateful: step and tokens seen."""

    def __init__(self):
        self.step, self.ntokens_seen = 0, 0

    def state_dict(self):
        return {"step": self.step, "ntokens_seen": self.ntokens_seen}

    def load_state_dict(self, sd):
        self.step, self.ntokens_seen = sd["step"], sd["ntokens_seen"]


def flow_titan() -> dict:
    if framework("torchtitan") is None:
        return None
    from torchtitan.components.checkpoint import CheckpointManager
    from torchtitan.components.optimizer import (LRSchedulersContainer, OptimizersContainer,
                                                 ParamGroupConfig)

    init_gloo()
    result = {}

    def job(seed: int, folder: str, async_mode: str, sd_adapter=None, **config):
        model = shard(make_model(seed))
        optims = OptimizersContainer.Config(
            param_groups=[ParamGroupConfig(pattern=r".*", optimizer_name="AdamW",
                                           optimizer_kwargs={"lr": 1e-2, "weight_decay": 0.1})],
            implementation="for-loop").build(model_parts=[model])
        scheds = LRSchedulersContainer.Config(warmup_steps=2).build(optimizers=optims,
                                                                     training_steps=10)
        train_state, loader = TrainState(), Loader()
        manager = CheckpointManager.Config(
            enable=True, folder=folder, interval=1, keep_latest_k=2, async_mode=async_mode,
            last_save_model_only=True, export_dtype="bfloat16", **config).build(
            dataloader=loader, model_parts=[model], optimizers=optims, lr_schedulers=scheds,
            states={"train_state": train_state}, sd_adapter=sd_adapter, base_folder=str(OUT))
        return model, optims, scheds, train_state, loader, manager

    def snapshot(model, optims, scheds, train_state, loader):
        return {**full_state(model, optims.optimizers[0]), "lr_scheduler": scheds.state_dict(),
                "train_state": train_state.state_dict(), "loader": loader.state_dict()}

    def one_step(model, optims, scheds, train_state, loader) -> float:
        train_state.step += 1
        loss = train_step(model, optims, train_state.step)
        scheds.step()
        train_state.ntokens_seen += 16 * 2
        loader.pos += 1
        return loss

    for async_mode in ("disabled", "async"):
        folder = f"titan-{async_mode}"
        # The first job: steps 1-3, a checkpoint after each; keep_latest_k=2 purges step-1.
        model, optims, scheds, ts, loader, manager = job(0, folder, async_mode)
        for _ in range(3):
            one_step(model, optims, scheds, ts, loader)
            assert manager.save(ts.step), ts.step
        manager.maybe_wait_for_saving()
        ref = snapshot(model, optims, scheds, ts, loader)
        manager.close()  # joins the purge thread
        dist.barrier()
        kept = listing(OUT / folder)
        check_saved(OUT / folder / "step-3")
        if async_mode == "disabled":
            assert kept == ["step-2", "step-3"], kept
        else:
            # The purge right after an async save may not see step-3's folder yet (the
            # background save makes it), then it keeps step-1 too: timing, not compared.
            assert {"step-2", "step-3"} <= set(kept) <= {"step-1", "step-2", "step-3"}, kept
        del manager

        # A restarted job (other initial values, one step of its own): load() with no step
        # finds step-3 by itself and restores everything.
        model, optims, scheds, ts, loader, manager = job(1, folder, async_mode)
        one_step(model, optims, scheds, ts, loader)
        assert manager._find_load_step() == 3, manager._find_load_step()
        assert manager.load(), "load() found no checkpoint"
        got = snapshot(model, optims, scheds, ts, loader)
        assert ts.step == 3, ts.step
        if RANK == 0:
            assert_equal(got, ref, f"titan {async_mode} resumed")
        else:
            assert_equal(got["loader"], ref["loader"], f"titan {async_mode} loader")
        loss4 = one_step(model, optims, scheds, ts, loader)
        # The last step: a model-only export in bfloat16.
        assert manager.save(ts.step, last_step=True)
        exported = {k: v.full_tensor().to(torch.bfloat16) for k, v in model.state_dict().items()}
        manager.close()
        dist.barrier()
        kept = [k for k in listing(OUT / folder) if k != "step-1"]
        check_saved(OUT / folder / "step-4")
        assert kept == ["step-2", "step-3", "step-4"], kept  # the last save purges nothing
        # Read the export back through torch DCP's own load, into plain bf16 tensors.
        import torch.distributed.checkpoint as dcp

        back = {k: torch.zeros_like(v) for k, v in exported.items()}
        dcp.load(back, checkpoint_id=str(OUT / folder / "step-4"))
        assert_equal(back, exported, f"titan {async_mode} export")

        flatten(got, f"{async_mode}/resumed", result)
        result[f"{async_mode}/kept"] = kept
        result[f"{async_mode}/loss_step4"] = loss4
        flatten(back, f"{async_mode}/export", result)
        del manager

    # The last save in HuggingFace safetensors (torch's HuggingFaceStorageWriter into sharded/,
    # then torch's own consolidation over those shards, on every rank), and a new job's first
    # load from that export (HuggingFaceStorageReader).
    adapter = _titan_hf_adapter()
    model, optims, scheds, ts, loader, manager = job(0, "titan-hf", "disabled", adapter,
                                                     last_save_in_hf=True)
    one_step(model, optims, scheds, ts, loader)
    assert manager.save(ts.step, last_step=True)
    exported = {k: v.full_tensor().to(torch.bfloat16) for k, v in model.state_dict().items()}
    manager.close()
    dist.barrier()
    hf_dir = OUT / "titan-hf" / "step-1"
    files = listing(hf_dir)
    assert files == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                     "model.safetensors.index.json", "sharded"], files
    del manager
    model, optims, scheds, ts, loader, manager = job(
        1, "titan-hf-resume", "disabled", adapter, initial_load_path=str(hf_dir),
        initial_load_in_hf=True)
    assert manager.load(), "load() did not read the HuggingFace export"
    got = {k: v.full_tensor() for k, v in model.state_dict().items()}
    assert_equal(got, {k: v.float() for k, v in exported.items()}, "titan hf loaded")
    manager.close()
    import hashlib

    result["hf/files"] = files
    result["hf/bytes"] = {f: hashlib.sha256((hf_dir / f).read_bytes()).hexdigest()
                          for f in files if f != "sharded"}
    flatten(got, "hf/loaded", result)
    return result


def _titan_hf_adapter():
    """A torchtitan state dict adapter: HF names "model.<name>", the first Linear in file 1,
    the others in file 2."""
    from torch.distributed.checkpoint import HuggingFaceStorageReader
    from torchtitan.protocols.state_dict_adapter import BaseStateDictAdapter

    class Adapter(BaseStateDictAdapter):
        def __init__(self):
            self.hf_assets_path = None
            self.fqn_to_index_mapping = {f"model.{i}.{p}": 1 if i == 0 else 2
                                         for i in (0, 2, 4) for p in ("weight", "bias")}

        def to_hf(self, state_dict):
            return {f"model.{k}": v for k, v in state_dict.items()}

        def from_hf(self, hf_state_dict):
            return {k[len("model."):]: v for k, v in hf_state_dict.items()}

        def get_hf_storage_reader(self, path, from_quantized=False):
            return HuggingFaceStorageReader(path)

    return Adapter()


# ---------------------------------------------------------------------------------------------
# accelerate: its FSDP2 SHARDED_STATE_DICT helpers (dist_cp.save/load with FileSystemWriter/
# Reader and the default planners, {"model": ...} and {"optimizer": ...}), then
# merge_fsdp_weights (format_utils._load_state_dict, no_dist, _EmptyStateDictLoadPlanner).

class _Accelerator:
    """The few attributes of an Accelerator that accelerate's fsdp_utils reads."""

    num_processes = 2
    is_fsdp2 = True

    def __init__(self):
        self.process_index = RANK
        self.is_main_process = RANK == 0

    def wait_for_everyone(self):
        dist.barrier()


def flow_accelerate() -> dict:
    if framework("accelerate") is None:
        return None
    from accelerate.utils import FullyShardedDataParallelPlugin, merge_fsdp_weights
    from accelerate.utils.fsdp_utils import (load_fsdp_model, load_fsdp_optimizer,
                                             save_fsdp_model, save_fsdp_optimizer)
    from safetensors.torch import load_file

    from accelerate.state import PartialState

    init_gloo()
    PartialState()  # accelerate's logging and merge_fsdp_weights read it (joins our group)
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, state_dict_type="SHARDED_STATE_DICT")
    acc = _Accelerator()
    ckpt = OUT / "accelerate-ckpt"

    model = shard(make_model(0))
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    for step in range(1, 4):
        train_step(model, optim, step)
    save_fsdp_model(plugin, acc, model, ckpt)
    save_fsdp_optimizer(plugin, acc, optim, model, ckpt)
    ref = full_state(model, optim)
    dist.barrier()
    saved = listing(ckpt)
    assert saved == ["optimizer_0", "pytorch_model_fsdp_0"], saved
    for name in saved:
        check_saved(ckpt / name)

    model = shard(make_model(1))
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    train_step(model, optim, 1)
    load_fsdp_model(plugin, acc, model, ckpt)
    load_fsdp_optimizer(plugin, acc, optim, model, ckpt)
    got = full_state(model, optim)
    if RANK == 0:
        assert_equal(got, ref, "accelerate resumed")
    loss4 = train_step(model, optim, 4)

    merged_dir = OUT / "accelerate-merged"
    merge_fsdp_weights(str(ckpt / "pytorch_model_fsdp_0"), str(merged_dir))
    result = {"loss_step4": loss4}
    flatten(got, "resumed", result)
    if RANK == 0:
        merged = load_file(str(merged_dir / "model.safetensors"))
        assert_equal(merged, ref["model"], "accelerate merged")
        flatten(merged, "merged", result)
    return result


# ---------------------------------------------------------------------------------------------
# Lightning Fabric: ModelParallelStrategy (FSDP2 via parallelize_fn), fabric.save/fabric.load
# (dcp.save/dcp.load(checkpoint_id=dir), the optimizer loaded separately, meta.pt beside).

def flow_fabric() -> dict:
    if framework("lightning.fabric") is None:
        return None
    from lightning.fabric import Fabric
    from lightning.fabric.strategies import ModelParallelStrategy

    def parallelize(model, mesh):
        return shard(model, mesh["data_parallel"])

    fabric = Fabric(accelerator="cpu", devices=2, strategy=ModelParallelStrategy(
        parallelize_fn=parallelize, data_parallel_size=2, tensor_parallel_size=1))
    fabric.launch()
    ckpt = OUT / "fabric-ckpt"

    def job(seed: int):
        model = fabric.setup(make_model(seed))
        optim = fabric.setup_optimizers(
            torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1))
        return model, optim

    model, optim = job(0)
    for step in range(1, 4):
        train_step(model, optim, step, backward=fabric.backward)
    fabric.save(ckpt, {"model": model, "optimizer": optim, "step": 3,
                       "progress": {"epoch": 1, "batches": [1, 2, 3]}})
    ref = full_state(model, optim)
    fabric.barrier()
    check_saved(ckpt)

    model, optim = job(1)
    train_step(model, optim, 1, backward=fabric.backward)
    state = {"model": model, "optimizer": optim, "step": 0}
    rest = fabric.load(ckpt, state)
    assert state["step"] == 3 and rest == {"progress": {"epoch": 1, "batches": [1, 2, 3]}}, \
        (state["step"], rest)
    got = full_state(model, optim)
    if RANK == 0:
        assert_equal(got, ref, "fabric resumed")
    loss4 = train_step(model, optim, 4, backward=fabric.backward)
    result = {"loss_step4": loss4, "step": state["step"], "rest": rest}
    flatten(got, "resumed", result)
    return result


# ---------------------------------------------------------------------------------------------
# torchtune: CheckpointClient with async checkpointing (DistributedCheckpointer: async_save and
# save with FileSystemWriter(thread_count=16, single_file_per_rank=False, sync_files=False),
# load with FileSystemReader; dist_epoch_N folders found by their .metadata).

def flow_torchtune() -> dict:
    if framework("torchtune") is None:
        return None
    from omegaconf import OmegaConf
    from torchtune.training.checkpointing import DistributedCheckpointer
    from torchtune.training.checkpointing._checkpoint_client import (CheckpointClient,
                                                                      TrainingProgress)

    init_gloo()
    out = OUT / "torchtune"
    cfg = OmegaConf.create({"device": "cpu", "resume_from_checkpoint": True,
                            "enable_async_checkpointing": True, "checkpointer": {}})

    def client() -> CheckpointClient:
        c = CheckpointClient(cfg)
        # The recipe's user checkpointer (a HF/Meta/torchtune one) only names the folders
        # here: its DistributedCheckpointer is what saves and resumes with async checkpointing.
        c._checkpointer = DistributedCheckpointer(checkpoint_dir=str(out), output_dir=str(out))
        return c

    def progress(epoch: int) -> TrainingProgress:
        return TrainingProgress(seed=7, epochs_run=epoch + 1, total_epochs=10,
                                max_steps_per_epoch=1, dataloader_state_dict={"pos": epoch})

    # The async saves run their collectives on the default group (process_group=None) while
    # training goes on: on GPUs training's are NCCL's, here FSDP2 gets a gloo group of its own.
    from torch.distributed.device_mesh import DeviceMesh

    mesh = DeviceMesh.from_group(dist.new_group(backend="gloo"), device_type="cpu")
    model = shard(make_model(0), mesh)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    saver = client()
    refs = {}
    for epoch in range(3):  # intermediate checkpoints, saved asynchronously
        train_step(model, optim, epoch + 1)
        refs[epoch] = full_state(model, optim)  # before the save: no collective beside it
        saver.save_checkpoint(model, optim, progress(epoch), epoch)
    dcp_saver = saver._get_dcp_checkpointer()
    dcp_saver._checkpoint_future.result()
    # and one synchronous save, as DistributedCheckpointer.save_checkpoint(save_async=False)
    train_step(model, optim, 4)
    sd = {"model": model.state_dict(), "optimizer": optim.state_dict(),
          **progress(3).state_dict()}
    dcp_saver.save_checkpoint(sd, epoch=3, save_async=False)
    refs[3] = full_state(model, optim)
    dist.barrier()
    folders = listing(out)
    assert folders == ["dist_epoch_0", "dist_epoch_1", "dist_epoch_2", "dist_epoch_3"], folders
    for name in folders:
        check_saved(out / name)

    result = {"folders": folders}
    # Resume: the latest folder with a .metadata (the synchronous one), then an async one.
    for want_epoch, path in ((3, None), (2, out / "dist_epoch_2")):
        model = shard(make_model(1), mesh)
        optim = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
        train_step(model, optim, 1)
        loader = client()
        if path is None:
            loaded = loader.load_distributed_checkpoint(model, optim)
        else:  # the same recipe steps, with the path given
            dcp_loader = loader._get_dcp_checkpointer()
            from torchtune.training.checkpointing._checkpoint_client import set_state_dict
            loaded = dcp_loader.load_checkpoint(
                {"model": model.state_dict(), "optimizer": optim.state_dict(),
                 "seed": 0, "epochs_run": 0, "total_epochs": 0, "max_steps_per_epoch": 0},
                checkpoint_path=str(path))
            set_state_dict(model, optim, model_state_dict=loaded["model"],
                           optim_state_dict=loaded["optimizer"])
        assert loaded["epochs_run"] == want_epoch + 1 and loaded["seed"] == 7, \
            {k: loaded[k] for k in ("epochs_run", "seed")}
        got = full_state(model, optim)
        if RANK == 0:
            assert_equal(got, refs[want_epoch], f"torchtune epoch {want_epoch} resumed")
        tag = f"epoch{want_epoch}"
        result[f"{tag}/loss_next"] = train_step(model, optim, 10 + want_epoch)
        result[f"{tag}/progress"] = {k: loaded[k] for k in ("seed", "epochs_run",
                                                            "total_epochs",
                                                            "max_steps_per_epoch")}
        flatten(got, f"{tag}/resumed", result)
    return result


FLOWS = {"titan": flow_titan, "accelerate": flow_accelerate, "fabric": flow_fabric,
         "torchtune": flow_torchtune,
         # in a module of its own; it uses this one's helpers
         "transformers": lambda: __import__("fw_transformers").flow_transformers(
             sys.modules[__name__])}


def main() -> None:
    if FLOW not in FLOWS:
        sys.exit(f"unknown flow {FLOW!r}: one of {', '.join(FLOWS)}")
    OUT.mkdir(parents=True, exist_ok=True)
    begin = time.monotonic()
    result = FLOWS[FLOW]()
    if result is None:  # skipped, said why
        return
    if RANK == 0:
        torch.save(result, OUT / f"result-{FLOW}.pt")
    dist.barrier()
    print(f"{FLOW}: ok ({MODE}, rank {RANK}, {time.monotonic() - begin:.1f} s)", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
