"""One process, no process group: a world of one."""

import json
import struct
import subprocess

import numpy as np
import pytest
import torch

import hyperdcp as dcp


def nested_state(salt: float = 0.0) -> dict:
    return {
        "model": {
            "w": (torch.arange(12, dtype=torch.float32).reshape(3, 4) + salt).to(torch.bfloat16),
            "b": torch.full((5,), 2.0 + salt),
            "step": torch.tensor(3.0 + salt),  # 0-d
        },
        "np": np.arange(6, dtype=np.int32).reshape(2, 3) + int(salt),
        "layers": [torch.ones(2) * salt, {"scale": 0.5 + salt}],
        "meta": {"epoch": 4, "name": "run", "betas": (0.9, 0.999), "none": None, "ok": True},
    }


def assert_state_equal(got: dict, want: dict) -> None:
    for k, w in want.items():
        g = got[k]
        if isinstance(w, dict):
            assert isinstance(g, dict) and g.keys() == w.keys(), k
            assert_state_equal(g, w)
        elif isinstance(w, (list, tuple)):
            assert type(g) is type(w) and len(g) == len(w), k
            assert_state_equal(dict(enumerate(g)), dict(enumerate(w)))
        elif isinstance(w, torch.Tensor):
            assert g.dtype == w.dtype and torch.equal(g, w), k
        elif isinstance(w, np.ndarray):
            assert g.dtype == w.dtype and np.array_equal(g, w), k
        else:
            assert type(g) is type(w) and g == w, k


def test_round_trip_fills_in_place_and_replaces_values(tmp_path):
    want = nested_state()
    r = dcp.save(want, tmp_path / "ck")
    assert r.bytes_written > 0 and r.files_written >= 1
    got = nested_state(salt=9.0)
    got["meta"] = {"epoch": 0, "name": "", "betas": (0, 0), "none": 1, "ok": False}
    w_before = got["model"]["w"]
    r = dcp.load(got, tmp_path / "ck")
    assert r.entries_loaded == 11  # a tuple of values is one value, as torch stores it
    assert got["model"]["w"] is w_before  # filled in place
    assert_state_equal(got, want)


def test_non_contiguous_tensors_are_saved_and_written_back(tmp_path):
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    dcp.save({"t": base.t(), "a": np.asfortranarray(base.numpy())}, tmp_path / "ck")
    dst = torch.zeros(4, 6)
    view = dst.t()  # (6, 4), not contiguous: loaded through one copy, written back
    arr = np.asfortranarray(np.zeros((4, 6), np.float32))
    dcp.load({"t": view, "a": arr}, tmp_path / "ck")
    assert not view.is_contiguous() and torch.equal(view, base.t())
    assert np.array_equal(arr, base.numpy())


def test_declared_chunks_assemble_one_tensor(tmp_path):
    full = torch.arange(20, dtype=torch.int64).reshape(4, 5)
    # A chunk that does not cover its tensor cannot be saved alone.
    with pytest.raises(dcp.DcpError, match="'x'"):
        dcp.save({"x": dcp.TensorChunk(full[:3].clone(), (4, 5), (0, 0))}, tmp_path / "bad")
    dcp.save({"x": dcp.TensorChunk(full, (4, 5), (0, 0))}, tmp_path / "ck")
    top = torch.zeros(2, 5, dtype=torch.int64)
    dcp.load({"x": dcp.TensorChunk(top, (4, 5), (2, 0))}, tmp_path / "ck")
    assert torch.equal(top, full[2:])


def test_read_metadata(tmp_path):
    dcp.save(nested_state(), tmp_path / "ck")
    md = dcp.read_metadata(tmp_path / "ck")
    assert md.world_size == 1
    w = md.tensors["model.w"]
    assert (w.dtype, w.shape, w.torch_dtype) == ("BF16", (3, 4), torch.bfloat16)
    assert w.chunks == (((0, 0), (3, 4)),)
    assert md.tensors["model.step"].shape == ()
    assert set(md.bytes) == {"layers.1.scale", "meta.epoch", "meta.name", "meta.betas",
                             "meta.none", "meta.ok"}


def test_partial_load_and_prefixes(tmp_path):
    dcp.save({"model": {"w": torch.ones(3)}, "step": 5}, tmp_path / "ck")
    sd = {"w": torch.zeros(3), "extra": torch.zeros(2), "note": "kept"}
    with pytest.raises(dcp.DcpError, match="extra"):
        dcp.load(sd, tmp_path / "ck", strip_prefix="model.")
    r = dcp.load(sd, tmp_path / "ck", strip_prefix="model.", allow_partial=True)
    assert torch.equal(sd["w"], torch.ones(3)) and sd["note"] == "kept"
    assert r.entries_skipped == 2
    sd = {"net": {"w": torch.zeros(3)}}
    dcp.load(sd, tmp_path / "ck", strip_prefix="model.", add_prefix="net.", allow_partial=True)
    assert torch.equal(sd["net"]["w"], torch.ones(3))


def test_async_save_stages_before_returning(tmp_path):
    src = {"t": torch.arange(1000, dtype=torch.float32), "step": 1}
    h = dcp.async_save(src, tmp_path / "ck")
    src["t"].fill_(-1)  # allowed at once
    src["step"] = 2
    r = h.result(timeout=60)
    assert h.done() and r.bytes_written > 0
    dst = {"t": torch.zeros(1000), "step": 0}
    dcp.load(dst, tmp_path / "ck")
    assert torch.equal(dst["t"], torch.arange(1000, dtype=torch.float32)) and dst["step"] == 1


def test_prepare_async_save_allocates_ahead_of_the_first_save(tmp_path):
    src = {"t": torch.arange(1 << 16, dtype=torch.float32), "u": torch.ones(3, 5), "step": 1}
    dcp.prepare_async_save(src)
    h = dcp.async_save(src, tmp_path / "ck")
    # The prepared buffer (or a larger idle one an earlier test left) was taken: no new memory.
    assert h.staging.reused and h.staging.bytes_allocated == 0
    src["t"].fill_(-1)
    h.result(timeout=60)
    dst = {"t": torch.zeros(1 << 16), "u": torch.zeros(3, 5), "step": 0}
    dcp.load(dst, tmp_path / "ck")
    assert torch.equal(dst["t"], torch.arange(1 << 16, dtype=torch.float32))
    assert torch.equal(dst["u"], torch.ones(3, 5)) and dst["step"] == 1
    # A larger state dict than was prepared still saves (it allocates).
    big = {"t": torch.arange(1 << 20, dtype=torch.float32)}
    dcp.async_save(big, tmp_path / "big").result(timeout=60)
    back = {"t": torch.zeros(1 << 20)}
    dcp.load(back, tmp_path / "big")
    assert torch.equal(back["t"], big["t"])


def test_async_save_error_is_raised_by_result(tmp_path):
    (tmp_path / "file").write_text("not a directory")
    h = dcp.async_save({"t": torch.ones(2)}, tmp_path / "file" / "ck")
    with pytest.raises(dcp.DcpError):
        h.result(timeout=60)


@pytest.mark.parametrize("bad, needle", [
    ({"a.b": torch.ones(1), "a": {"b": torch.ones(1)}}, "both named 'a.b'"),
    ({"x": object()}, "'x' holds a value of type object"),
    ({"x": {1: torch.ones(1), "1": torch.ones(1)}}, "both named 'x.1'"),
    ({"x": torch.sparse_coo_tensor([[0]], [1.0], (2,))}, "sparse"),
])
def test_bad_state_dicts_raise_before_io(tmp_path, bad, needle):
    with pytest.raises(dcp.DcpError, match=needle) as e:
        dcp.save(bad, tmp_path / "ck")
    assert e.value.code == "INVALID_ARGUMENT"
    assert not (tmp_path / "ck").exists()


def test_engine_errors_are_dcp_errors(tmp_path):
    with pytest.raises(dcp.DcpError, match="no committed metadata") as e:
        dcp.load({"t": torch.zeros(1)}, tmp_path)
    assert e.value.code == "FAILED_PRECONDITION"


def test_values_never_unpickled(tmp_path):
    dcp.save({"v": "__import__('os').system('false')", "d": 1.25}, tmp_path / "ck")
    sd = {"v": None, "d": 0.0}
    dcp.load(sd, tmp_path / "ck")
    assert sd == {"v": "__import__('os').system('false')", "d": 1.25}


def write_safetensors(path, tensors: dict) -> None:
    """A safetensors file by its spec (8-byte header size, JSON header, data)."""
    header, data = {}, b""
    for name, arr in tensors.items():
        raw = arr.tobytes()
        header[name] = {"dtype": "F32", "shape": list(arr.shape),
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(h)) + h + data)


def test_checkpoint_written_by_cpp_loads_in_python(tmp_path, dcp_cli):
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    write_safetensors(tmp_path / "model.safetensors", {"w": w, "b": np.ones(2, np.float32)})
    subprocess.run([dcp_cli, "convert", str(tmp_path / "model.safetensors"),
                    str(tmp_path / "ck")], check=True, timeout=60)
    sd = {"w": torch.zeros(3, 4), "b": np.zeros(2, np.float32)}
    dcp.load(sd, tmp_path / "ck")
    assert torch.equal(sd["w"], torch.from_numpy(w)) and np.array_equal(sd["b"], np.ones(2))


def test_checkpoint_written_by_python_verifies_in_cpp(tmp_path, dcp_cli):
    dcp.save(nested_state(), tmp_path / "ck")
    out = subprocess.run([dcp_cli, "verify", str(tmp_path / "ck")], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.startswith("OK"), out.stderr
    data = next(p for p in (tmp_path / "ck").iterdir() if p.suffix == ".safetensors")
    blob = bytearray(data.read_bytes())
    blob[-1] ^= 0xFF  # corrupt one byte of tensor data
    data.write_bytes(bytes(blob))
    out = subprocess.run([dcp_cli, "verify", str(tmp_path / "ck")], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 1, out.stdout
    with pytest.raises(dcp.DcpError) as e:
        dcp.load(nested_state(), tmp_path / "ck")
    assert e.value.code == "DATA_LOSS"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; none visible")
def test_cuda_tensors_are_staged_through_host(tmp_path):
    src = {"t": torch.arange(10, dtype=torch.float16, device="cuda")}
    dcp.save(src, tmp_path / "ck")
    dst = {"t": torch.zeros(10, dtype=torch.float16, device="cuda")}
    dcp.load(dst, tmp_path / "ck")
    assert dst["t"].is_cuda and torch.equal(dst["t"], src["t"])
    h = dcp.async_save(src, tmp_path / "ck2")
    src["t"].fill_(0)
    h.result(timeout=60)
    dcp.load(dst, tmp_path / "ck2")
    assert torch.equal(dst["t"].cpu(), torch.arange(10, dtype=torch.float16))


def test_torch_dcp_checkpoint_converts(tmp_path):
    import torch.distributed.checkpoint as torch_dcp

    want = {"model": {"w": torch.arange(6.0).reshape(2, 3),
                      "b": torch.ones(2, dtype=torch.bfloat16)},
            "optim": {"param_groups": [{"lr": 0.1, "betas": (0.9, 0.99), "params": ["w"]}]},
            "step": 7}
    torch_dcp.save(want, checkpoint_id=tmp_path / "torch", no_dist=True)
    dcp.from_torch_dcp(tmp_path / "torch", tmp_path / "dcp")
    got = {"model": {"w": torch.zeros(2, 3), "b": torch.zeros(2, dtype=torch.bfloat16)},
           "optim": {"param_groups": [{"lr": 0.0, "betas": (0, 0), "params": [""]}]},
           "step": 0}
    dcp.load(got, tmp_path / "dcp")
    assert_state_equal(got, want)


def test_saves_without_collectives_take_the_newest_step(tmp_path):
    # Each rank writes its own metadata file, named by the step: the newest step wins.
    ckpt = tmp_path / "ckpt"
    dcp.save({"w": torch.full((3, 4), 1.0)}, ckpt, use_collectives=False, step=1)
    dcp.save({"w": torch.full((3, 4), 2.0)}, ckpt, use_collectives=False, step=2)
    out = {"w": torch.zeros(3, 4)}
    dcp.load(out, ckpt)
    assert torch.equal(out["w"], torch.full((3, 4), 2.0))
    assert any(p.name.startswith("dcp.metadata.step2.rank0") for p in ckpt.iterdir())


def test_a_failed_preparation_is_told_to_other_ranks_with_a_status_code():
    """What a rank whose preparation failed tells the others: a DcpError's own code, and for
    anything else INVALID_ARGUMENT (SystemExit's `code` is an int: passed on, the engine call
    telling the other ranks would fail and leave them waiting)."""
    from hyperdcp._prepare import failure_text

    assert failure_text(SystemExit(143)) == ("INVALID_ARGUMENT", "SystemExit: 143")
    assert failure_text(KeyboardInterrupt()) == ("INVALID_ARGUMENT", "KeyboardInterrupt: ")
    assert failure_text(dcp.DcpError("x"))[0] == "INVALID_ARGUMENT"  # no code set
    e = dcp.DcpError("'w': gone")
    e.code = "NOT_FOUND"
    assert failure_text(e) == ("NOT_FOUND", "'w': gone")
