"""Every rank: save DTensors in layout "a", load them in layout "b"; then an async save whose
source tensors are overwritten as soon as it returns; then `dcp verify` on rank 0.

Also a torch.distributed.checkpoint of the same state, converted with dcp.from_torch_dcp.

Args: DIR [load-only] -- with load-only, only load DIR/sync, DIR/async and DIR/converted
(another world size than the one that saved them).
"""

import os
import subprocess
import sys

import torch
import torch.distributed as dist

import hyperdcp as dcp
import layouts


def main() -> None:
    root = sys.argv[1]
    load_only = len(sys.argv) > 2 and sys.argv[2] == "load-only"
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    sync_dir, async_dir = os.path.join(root, "sync"), os.path.join(root, "async")

    if not load_only:
        r = dcp.save(layouts.state("a"), sync_dir)
        assert r.files_written >= 1, r

        # Async: the tensors may change as soon as async_save returns.
        src = layouts.state("a", salt=1)
        h = dcp.async_save(src, async_dir)
        for t in src["model"].values():
            t.to_local().fill_(12345)
        src["extra"]["step"] = -1
        assert h.staging.blocked_seconds >= 0
        h.result(timeout=120)
        assert h.done()
        # A torch.distributed.checkpoint of the same state, converted by rank 0.
        import torch.distributed.checkpoint as torch_dcp
        torch_dcp.save(layouts.state("a", salt=2), checkpoint_id=os.path.join(root, "torch"))
        if rank == 0:
            dcp.from_torch_dcp(os.path.join(root, "torch"), os.path.join(root, "converted"))
        dist.barrier()
        if rank == 0:
            dcli = os.path.join(os.path.dirname(sys.executable), "dcp")
            for d in (sync_dir, async_dir):
                out = subprocess.run([dcli, "verify", d], capture_output=True, text=True,
                                     timeout=60)
                assert out.returncode == 0, out.stderr
                assert out.stdout.startswith("OK"), out.stdout

    converted = os.path.join(root, "converted")
    for d, salt in ((sync_dir, 0), (async_dir, 1), (converted, 2)):
        for broadcast in (True, False):
            sd = layouts.empty_state("b")
            r = dcp.load(sd, d, broadcast=broadcast)
            layouts.check(sd, salt)
    md = dcp.read_metadata(sync_dir)
    assert md.tensors["model.uneven"].shape == (10, 5)
    assert md.tensors["model.tiny"].torch_dtype == torch.bfloat16
    assert md.world_size == 4 and "extra.step" in md.bytes
    dist.barrier()
    print(f"rank {rank}: ok")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
