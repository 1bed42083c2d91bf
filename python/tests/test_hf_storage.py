"""torch's HuggingFaceStorageWriter/Reader served by the engine: the files torch writes, byte
for byte where torch's are deterministic, read by torch and read from torch."""

import json
import struct

import pytest


def _split(path):
    data = path.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    return json.loads(data[8:8 + n]), data[8 + n:]


def test_the_files_torchs_writer_writes(torchrun, tmp_path):
    out = torchrun(2, "hf_writer.py", tmp_path)
    assert out.count(": ok") == 2, out
    torch_dir, ours = tmp_path / "torch", tmp_path / "hyper"
    names = sorted(p.name for p in torch_dir.iterdir())
    assert names == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                     "model.safetensors.index.json", "sharded"]
    assert sorted(p.name for p in ours.iterdir()) == names
    # Consolidated files and index: torch writes them with Python's json, deterministically.
    for name in names[:3]:
        assert (ours / name).read_bytes() == (torch_dir / name).read_bytes(), name
    # Shards: the safetensors package orders `__metadata__` by a random hash, so compare parsed.
    shards = sorted(p.name for p in (torch_dir / "sharded").iterdir())
    assert sorted(p.name for p in (ours / "sharded").iterdir()) == shards
    for name in shards:
        theirs_h, theirs_d = _split(torch_dir / "sharded" / name)
        ours_h, ours_d = _split(ours / "sharded" / name)
        assert ours_h == theirs_h and ours_d == theirs_d, name
    # Replicated tensors without a mapping: the same writers as torch's dedup, the same order.
    torch_dir, ours = tmp_path / "torch-replicated", tmp_path / "hyper-replicated"
    for name in ("model-00001-of-00001.safetensors", "model.safetensors.index.json"):
        assert (ours / name).read_bytes() == (torch_dir / name).read_bytes(), name
    shards = sorted(p.name for p in (torch_dir / "sharded").iterdir())
    assert sorted(p.name for p in (ours / "sharded").iterdir()) == shards
    for name in shards:
        assert _split(ours / "sharded" / name) == _split(torch_dir / "sharded" / name), name
    one = sorted(p.name for p in (tmp_path / "one").iterdir())
    assert one == ["model-00001-of-00001.safetensors", "model.safetensors.index.json"]


def test_a_hf_save_refuses_values_naming_them(tmp_path):
    import torch
    from torch.distributed.checkpoint import HuggingFaceStorageWriter

    import hyperdcp

    with pytest.raises(hyperdcp.DcpError, match="'step' is not a tensor"):
        hyperdcp.save({"w": torch.ones(2), "step": 3}, no_dist=True,
                      storage_writer=HuggingFaceStorageWriter(str(tmp_path / "hf")))


def test_reshards_between_meshes_and_libraries(torchrun, tmp_path):
    out = torchrun(4, "hf_reshard.py", tmp_path)
    assert out.count(": ok") == 4, out
