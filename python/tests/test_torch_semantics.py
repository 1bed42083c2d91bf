"""torch.distributed.checkpoint's meaning, in one process, checked side by side with torch.

Each case that torch DCP handles is run through both libraries with the same state dict and
template; the loaded results must agree (except where hyperdcp does better by design: typed
values and dict keys).
"""

import io
import os
import random
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as torch_dcp

import hyperdcp as dcp


def both(tmp_path, state, template_fn):
    """(hyperdcp's loaded template, torch DCP's loaded template) for one saved state."""
    dcp.save(state, tmp_path / "ours")
    torch_dcp.save(state, checkpoint_id=tmp_path / "theirs", no_dist=True)
    ours, theirs = template_fn(), template_fn()
    dcp.load(ours, tmp_path / "ours")
    torch_dcp.load(theirs, checkpoint_id=tmp_path / "theirs", no_dist=True)
    return ours, theirs


def test_lists_of_values_replace_shorter_and_empty_templates(tmp_path):
    state = {"betas": [0.9, 0.999], "pos": [3, [4, 5]], "groups": [{"lr": 0.1}],
             "mixed": [torch.ones(2), 7], "empty": []}

    def template():
        return {"betas": [], "pos": [0], "groups": [{"lr": 0.0}], "mixed": [torch.zeros(2), 0],
                "empty": [1, 2]}

    ours, theirs = both(tmp_path, state, template)
    for got in (ours, theirs):
        assert got["betas"] == [0.9, 0.999] and got["pos"] == [3, [4, 5]]
        assert got["groups"] == [{"lr": 0.1}] and got["empty"] == []
        assert torch.equal(got["mixed"][0], torch.ones(2)) and got["mixed"][1] == 7


VALUES = {
    "int": 2**70, "float": 0.1, "nan": float("nan"), "inf": float("inf"), "ninf": -float("inf"),
    "bool": True, "str": "é\x00", "none": None, "bytes": b"\x00\xff", "barr": bytearray(b"ab"),
    "tuple": (1, (2.5, "x"), None), "list_of_tuples": [(1, 2), (3,)], "set": {3, 1, 2},
    "frozenset": frozenset({"a"}), "complex": 1 + 2j, "size": torch.Size([2, 3]),
    "dtype": torch.bfloat16, "device": torch.device("cpu"),
    "bytesio": io.BytesIO(b"loss history"), "np_scalar": np.float32(1.5),
    "np_int": np.int64(-3), "np_array_in_tuple": (np.arange(4, dtype=np.uint32), 5),
    "random_state": random.Random(1).getstate(), "np_rng": np.random.RandomState(2).get_state(),
    # A dict is walked (as torch does); inside a tuple it is part of one value, keys and all.
    "nested": ({"a": [1, {"b": (2, b"c")}], 5: "int key", (1, 2): "tuple key"},),
}


def same(a, b) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, float) and a != a:
        return b != b
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, io.BytesIO):
        return a.getvalue() == b.getvalue() and a.tell() == b.tell()
    return a == b


@pytest.mark.parametrize("name", sorted(VALUES))
def test_values_come_back_with_their_types(tmp_path, name):
    value = VALUES[name]
    dcp.save({"v": value}, tmp_path / "ck")
    got = {"v": None}
    dcp.load(got, tmp_path / "ck")
    assert same(got["v"], value), (got["v"], value)


def test_generator_and_rng_states_restore_the_same_streams(tmp_path):
    g = torch.Generator().manual_seed(5)
    gen = np.random.default_rng(3)
    state = {"torch_rng": g.get_state(), "py_rng": random.getstate(),
             "np_rng": np.random.get_state(), "np_gen": gen.bit_generator.state}
    dcp.save(state, tmp_path / "ck")
    want = (torch.rand(3, generator=g), random.random(), np.random.rand(), gen.random())
    # numpy's Generator state is a dict (walked, as torch does): a fresh one is the template.
    got = {"torch_rng": torch.zeros_like(state["torch_rng"]), "py_rng": None, "np_rng": None,
           "np_gen": np.random.default_rng(0).bit_generator.state}
    dcp.load(got, tmp_path / "ck")
    gen2 = np.random.default_rng(0)
    gen2.bit_generator.state = got["np_gen"]
    assert gen2.random() == want[3]
    g2 = torch.Generator()
    g2.set_state(got["torch_rng"])
    random.setstate(got["py_rng"])
    np.random.set_state(got["np_rng"])
    assert torch.equal(torch.rand(3, generator=g2), want[0])
    assert random.random() == want[1] and np.random.rand() == want[2]


def test_dict_keys_keep_their_types_where_torch_turns_them_into_str(tmp_path):
    state = {"counts": {1: torch.ones(1), 2: 5}}
    ours, theirs = both(tmp_path, state, lambda: {"counts": {1: torch.zeros(1), 2: 0}})
    assert list(ours["counts"]) == [1, 2] and ours["counts"][2] == 5
    assert torch.equal(ours["counts"][1], torch.ones(1))
    assert theirs["counts"][2] == 5 or theirs["counts"].get("2") == 5  # torch's, either way


def test_sets_are_stored_the_same_whatever_the_hash_seed(tmp_path):
    code = ("import hyperdcp._values as v, sys; "
            "sys.stdout.buffer.write(v.encode('s', {'alpha', 'beta', 'gamma', 'delta'}))")
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, check=True,
                           env=dict(os.environ, PYTHONHASHSEED=str(seed))).stdout
            for seed in (1, 2, 3)}
    assert len(outs) == 1


def test_unknown_objects_are_refused_unless_pickling_is_allowed(tmp_path):
    class Custom:
        def __eq__(self, other):
            return isinstance(other, Custom)

    with pytest.raises(dcp.DcpError, match=r"'run\.obj' holds a value of type .*Custom"):
        dcp.save({"run": {"obj": Custom()}}, tmp_path / "no")
    assert not (tmp_path / "no").exists()
    # Module-level class so pickle can find it.
    dcp.save({"obj": Fraction(1, 3)}, tmp_path / "ck", allow_pickle=True)
    with pytest.raises(dcp.DcpError, match="allow_pickle=True"):
        dcp.load({"obj": None}, tmp_path / "ck")
    got = {"obj": None}
    dcp.load(got, tmp_path / "ck", allow_pickle=True)
    assert got["obj"] == Fraction(1, 3)


from fractions import Fraction  # noqa: E402  (used above, pickled by reference)


def test_values_written_before_typed_values_still_load(tmp_path):
    sd = dcp._dcp.StateDict()
    sd.add_bytes("step", b"7")
    sd.add_bytes("betas", b"[0.9, 0.99]")
    dcp._dcp.save(sd, str(tmp_path / "ck"), dcp._dcp.local_comm(), True, 0)
    got = {"step": 0, "betas": None}
    dcp.load(got, tmp_path / "ck")
    assert got == {"step": 7, "betas": [0.9, 0.99]}


class Wrapper:
    """torchtitan's style: a Stateful around get_state_dict / set_state_dict."""

    def __init__(self, model, optim):
        self.model, self.optim = model, optim

    def state_dict(self):
        from torch.distributed.checkpoint.state_dict import get_state_dict

        m, o = get_state_dict(self.model, self.optim)
        return {"model": m, "optim": o}

    def load_state_dict(self, sd):
        from torch.distributed.checkpoint.state_dict import set_state_dict

        set_state_dict(self.model, self.optim, model_state_dict=sd["model"],
                       optim_state_dict=sd["optim"])


def make_training(seed: int):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    optim = torch.optim.AdamW(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.SequentialLR(
        optim, [torch.optim.lr_scheduler.LinearLR(optim, 0.5, total_iters=2),
                torch.optim.lr_scheduler.ExponentialLR(optim, 0.9)], milestones=[2])
    return model, optim, sched


def train(model, optim, sched, steps):
    for i in range(steps):
        loss = model(torch.full((3, 4), float(i))).square().mean()
        loss.backward()
        optim.step()
        sched.step()
        optim.zero_grad()


@pytest.mark.parametrize("wrapped", [False, True])
def test_stateful_module_optimizer_scheduler_resume_bit_exactly(tmp_path, wrapped):
    model, optim, sched = make_training(0)
    train(model, optim, sched, 3)
    state = ({"app": Wrapper(model, optim)} if wrapped else {"model": model, "optim": optim})
    state["sched"] = sched
    state["step"] = 3
    dcp.save(state, checkpoint_id=tmp_path / "ck")
    train(model, optim, sched, 2)  # the reference continues
    want = [p.detach().clone() for p in model.parameters()]
    want_lr = sched.get_last_lr()

    m2, o2, s2 = make_training(1)  # different weights, fresh optimizer and scheduler
    train(m2, o2, s2, 1)  # optimizer state exists, so the template has its tensors
    state2 = ({"app": Wrapper(m2, o2)} if wrapped else {"model": m2, "optim": o2})
    state2["sched"] = s2
    state2["step"] = 0
    dcp.load(state2, checkpoint_id=tmp_path / "ck")
    assert state2["step"] == 3 and state2["sched"] is s2  # Stateful objects stay in place
    train(m2, o2, s2, 2)
    for a, b in zip(m2.parameters(), want):
        assert torch.equal(a, b)
    assert s2.get_last_lr() == want_lr


def test_shared_template_containers_are_not_written_through(tmp_path):
    shared = {"x": 0}
    dcp.save({"a": {"x": 1, "t": torch.ones(1)}, "b": {"x": 2, "t": torch.ones(1)}},
             tmp_path / "ck")
    template = {"a": shared, "b": shared}
    shared["t"] = torch.zeros(1)
    dcp.load(template, tmp_path / "ck")
    assert template["a"]["x"] == 1 and template["b"]["x"] == 2 and shared["x"] == 0


def test_in_place_loads_bump_autograd_version(tmp_path):
    w = torch.nn.Parameter(torch.ones(3))
    dcp.save({"w": w}, tmp_path / "ck")
    y = (w * w).sum()  # saves w for backward
    before = w._version
    dcp.load({"w": w.detach()}, tmp_path / "ck")  # as module.state_dict() gives it
    assert w._version > before
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()


def test_torch_keywords_and_positional_checkpoint_id(tmp_path):
    state = {"t": torch.arange(3.0), "step": 1}
    dcp.save(state, tmp_path / "a")
    dcp.save(state, checkpoint_id=tmp_path / "b")
    dcp.save(state, storage_writer=dcp.FileSystemWriter(tmp_path / "c"),
             planner=dcp.DefaultSavePlanner())
    for d in "abc":
        got = {"t": torch.zeros(3), "step": 0}
        dcp.load(got, storage_reader=dcp.FileSystemReader(tmp_path / d),
                 planner=dcp.DefaultLoadPlanner())
        assert torch.equal(got["t"], state["t"]) and got["step"] == 1
    partial = {"t": torch.zeros(3), "missing": 5}
    dcp.load(partial, checkpoint_id=tmp_path / "a",
             planner=dcp.DefaultLoadPlanner(allow_partial_load=True))
    assert partial["missing"] == 5
    # What hyperdcp does not serve goes to torch: its fsspec writer writes torch's format,
    # which loads back (through torch); a planner subclass reads hyperdcp's format through
    # torch's planner.
    dcp.save(state, storage_writer=torch_dcp.FsspecWriter(str(tmp_path / "d")))
    assert not (tmp_path / "d" / "dcp.metadata").exists()

    class MyPlanner(torch_dcp.DefaultLoadPlanner):
        pass

    for d in "ad":
        got = {"t": torch.zeros(3), "step": 0}
        dcp.load(got, tmp_path / d, planner=MyPlanner())
        assert torch.equal(got["t"], state["t"]) and got["step"] == 1, d
    with pytest.raises(dcp.DcpError, match="checkpoint_id"):
        dcp.save(state)


def test_overwrite_false_refuses_a_committed_checkpoint(tmp_path):
    dcp.save({"t": torch.ones(2)}, tmp_path / "ck")
    before = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "ck").iterdir()}
    for kwargs in ({"overwrite": False},
                   {"storage_writer": dcp.FileSystemWriter(tmp_path / "ck", overwrite=False)}):
        args = (tmp_path / "ck",) if "overwrite" in kwargs else ()
        with pytest.raises(dcp.DcpError, match="overwrite=False") as e:
            dcp.save({"t": torch.zeros(2)}, *args, **kwargs)
        assert e.value.code == "FAILED_PRECONDITION"
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "ck").iterdir()} == before
    # An incomplete one (no committed metadata) is no checkpoint: the save goes ahead.
    (tmp_path / "partial").mkdir()
    (tmp_path / "partial" / "r0.safetensors").write_bytes(b"junk")
    dcp.save({"t": torch.ones(2)}, tmp_path / "partial", overwrite=False)


def test_async_save_returns_a_future(tmp_path):
    import concurrent.futures

    seen = []
    f = dcp.async_save({"t": torch.ones(4)}, checkpoint_id=tmp_path / "ck")
    assert isinstance(f, concurrent.futures.Future)
    f.add_done_callback(lambda fut: seen.append(fut.result().bytes_written))
    r = f.result(timeout=float("inf"))
    assert f.done() and f.exception() is None and r.bytes_written > 0
    assert f.blocked_seconds > 0 and f.staging.bytes_staged >= 16
    concurrent.futures.wait([f])
    assert seen == [r.bytes_written]
    (tmp_path / "file").write_text("x")
    bad = dcp.async_save({"t": torch.ones(1)}, tmp_path / "file" / "ck")
    assert isinstance(bad.exception(timeout=None), dcp.DcpError)


def test_round_trip_back_to_torch_dcp(tmp_path):
    model, optim, sched = make_training(0)
    train(model, optim, sched, 2)
    state = {"model": model.state_dict(), "optim": optim.state_dict(), "step": 2,
             "extra": {"betas": (0.9, 0.99), "hist": io.BytesIO(b"h")}}
    dcp.save(state, tmp_path / "ours")
    dcp.to_torch_dcp(tmp_path / "ours", tmp_path / "torch")
    m2, o2, s2 = make_training(1)
    train(m2, o2, s2, 1)
    got = {"model": m2.state_dict(), "optim": o2.state_dict(), "step": 0,
           "extra": {"betas": None, "hist": None}}
    torch_dcp.load(got, checkpoint_id=tmp_path / "torch", no_dist=True)
    for k, v in state["model"].items():
        assert torch.equal(got["model"][k], v)
    assert got["step"] == 2 and got["extra"]["betas"] == (0.9, 0.99)
    assert got["extra"]["hist"].getvalue() == b"h"
    o2.load_state_dict(got["optim"])
    assert o2.state_dict()["state"][0]["step"] == optim.state_dict()["state"][0]["step"]
    # The same through the command line.
    out = subprocess.run([sys.executable, "-m", "hyperdcp.convert", "to-torch",
                          str(tmp_path / "ours"), str(tmp_path / "torch2")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    again = {"step": 0}
    torch_dcp.load(again, checkpoint_id=tmp_path / "torch2", no_dist=True)
    assert again["step"] == 2


def test_set_timeout_takes_none_and_inf():
    dcp.set_timeout(None)
    dcp.set_timeout(float("inf"))
    dcp.set_timeout(600)
    with pytest.raises(dcp.DcpError, match="positive"):
        dcp.set_timeout(0)


def test_version_and_package_metadata():
    from importlib.metadata import metadata, version

    assert dcp.__version__ == version("hyperdcp")
    md = metadata("hyperdcp")
    assert "Apache" in (md.get("License") or "") + " ".join(md.get_all("Classifier") or [])
    assert "import hyperdcp as dcp" in md.get_payload() or "import hyperdcp as dcp" in str(md)


def test_loads_cast_to_the_template_dtype_as_torch_does(tmp_path):
    state = {"w": torch.arange(4.0) / 3, "b": torch.ones(2, dtype=torch.bfloat16) * 1.5,
             "i": torch.arange(3), "same": torch.ones(2)}

    def template():
        return {"w": torch.zeros(4, dtype=torch.bfloat16), "b": torch.zeros(2),
                "i": torch.zeros(3, dtype=torch.float32), "same": torch.zeros(2)}

    ours, theirs = both(tmp_path, state, template)
    for k in state:
        assert ours[k].dtype == theirs[k].dtype and torch.equal(ours[k], theirs[k]), k


def test_repeated_calls_reuse_preparation_without_keeping_tensors(tmp_path):
    import gc
    import weakref

    from hyperdcp import _prepare

    model = torch.nn.Linear(8, 4)
    for step in range(3):  # the same tensors, changed in place: the preparation is reused
        with torch.no_grad():
            model.weight.fill_(float(step))
        dcp.save({"model": model.state_dict(), "step": step}, tmp_path / f"s{step}")
    assert any(k[0] is False for k in _prepare._CACHE)
    got = {"model": torch.nn.Linear(8, 4).state_dict(), "step": -1}
    dcp.load(got, tmp_path / "s2")
    assert torch.equal(got["model"]["weight"], torch.full((4, 8), 2.0)) and got["step"] == 2
    # New tensors (other memory) under the same names: prepared anew, saved right.
    model.weight = torch.nn.Parameter(torch.full((4, 8), 7.0))
    dcp.save({"model": model.state_dict(), "step": 3}, tmp_path / "s3")
    dcp.load(got, tmp_path / "s3")
    assert torch.equal(got["model"]["weight"], torch.full((4, 8), 7.0))
    # The cache holds no tensor: a model that is gone is freed.
    ref = weakref.ref(model.weight)
    del model
    gc.collect()
    assert ref() is None


@pytest.mark.parametrize("check", ["native", "torch-guards", "attributes"])
def test_a_reused_preparation_notices_every_change_of_a_tensor(tmp_path, monkeypatch, check):
    """Each change that keeps the names (and often the address) must be seen: the engine
    would otherwise read stale memory or the wrong bytes. Checked on each path: the engine's
    one-pass check with torch's guards (where this torch gives both), the guards after a
    Python pass, and the attribute-by-attribute fallback."""
    from hyperdcp import _prepare

    if check != "attributes":
        assert _prepare._tensor_guards() is not None, "this torch's TensorGuards misbehave"
    else:
        monkeypatch.setattr(_prepare, "_GUARDS", None)
    if check == "native":
        assert _prepare._data_ptr_fn() is not None, "this torch gives no data pointer to C"
    else:
        monkeypatch.setattr(_prepare, "_DATA_PTR_FN", None)

    def fresh():
        return torch.arange(16.0).reshape(4, 4)

    changes = {
        "new memory": lambda t: setattr(t, "data", torch.full((4, 4), 5.0)),
        "same memory, other shape": lambda t: t.data.resize_(2, 4),
        "same memory, other dtype": lambda t: setattr(t, "data", t.data.view(torch.int32)),
        "same memory, transposed": lambda t: setattr(t, "data", t.data.t()),
        "same memory, a negative view": lambda t: setattr(t, "data", torch._neg_view(t.data)),
        "same memory, a nested tensor": "nested",
        "a Parameter in its place": None,
    }
    for i, (what, change) in enumerate(changes.items()):
        _prepare._CACHE.clear()
        t = fresh()
        state = {"w": t, "n": 1, "b": torch.ones(3)}
        dcp.save(state, tmp_path / f"a{i}")  # prepared and cached
        if change is None:
            state["w"] = torch.nn.Parameter(t.clone().mul_(2), requires_grad=False)
        elif change == "nested":  # a view of t's buffer: refused, never a crash or stale data
            state["w"] = torch.nested.as_nested_tensor(t)
            assert state["w"].data_ptr() == t.data_ptr()
            with pytest.raises(dcp.DcpError, match="'w': a nested tensor cannot be saved"):
                dcp.save(state, tmp_path / f"b{i}")
            continue
        else:
            change(t)
        want = state["w"].detach().clone()
        dcp.save(state, tmp_path / f"b{i}")
        got = dcp.load_all(tmp_path / f"b{i}")
        assert got["w"].dtype == want.dtype and torch.equal(got["w"], want), what
        assert torch.equal(got["b"], torch.ones(3)) and got["n"] == 1, what
    # A sparse tensor in a dense one's place (no data pointer): refused naming it.
    _prepare._CACHE.clear()
    t = fresh()
    dcp.save({"w": t, "n": 1}, tmp_path / "s1")
    with pytest.raises(dcp.DcpError, match="'w'"):
        dcp.save({"w": t.to_sparse(), "n": 1}, tmp_path / "s2")
    # A conjugate view of the same complex memory reads differently.
    _prepare._CACHE.clear()
    z = torch.complex(torch.arange(4.0), torch.ones(4))
    dcp.save({"z": z}, tmp_path / "z1")
    dcp.save({"z": z.conj()}, tmp_path / "z2")
    assert torch.equal(dcp.load_all(tmp_path / "z2")["z"], z.conj().resolve_conj())
    # Another class over the same memory (a DTensor's local tensor in its place would keep
    # the DTensor's global shape): not the same entry either.
    t = fresh()
    sigs = _prepare.Signatures([t], [(t, None)])
    assert (sigs.native is not None) == (check == "native")
    assert sigs.match([t]) == [t]
    assert sigs.match([torch.nn.Parameter(t, requires_grad=False)]) is None
    # One tensor under two names (tied weights) is reused too.
    sigs = _prepare.Signatures([t, t], [(t, None), (t, None)])
    assert sigs.match([t, t]) == [t, t]


def test_flattening_keeps_torch_order_and_names_around_tensor_runs():
    from collections import OrderedDict

    from hyperdcp._chunks import is_tensor_type, is_torch_tensor
    from hyperdcp._flatten import flatten

    t = [torch.full((1,), float(i)) for i in range(6)]
    state = {"a": OrderedDict([("x", t[0]), ("y", 3), ("z", t[1])]), "b": t[2], 7: t[3],
             "c": {"d": t[4], "e": [1, 2], "f": t[5]}}
    flat = flatten(state, is_tensor_type, is_torch_tensor)
    assert list(flat.leaves) == ["a.x", "a.y", "a.z", "b", "7", "c.d", "c.e", "c.f"]
    assert [id(x) for x in flat.tensors] == [id(x) for x in t]
    assert flat.values == ["a.y", "c.e"]
    assert flat.paths["a.z"] == ("a", "z") and flat.paths["7"] == (7,)
    assert flat.kinds["c.f"] == "dd" and flat.kinds["b"] == "d"
    # A dict subclass iterating in its own order: names still go with their own values.
    class Reversed(dict):
        def __iter__(self):
            return reversed(list(super().__iter__()))

    flat = flatten({"m": Reversed(a=t[0], b=t[1])}, is_tensor_type, is_torch_tensor)
    assert flat.leaves["m.a"] is t[0] and flat.leaves["m.b"] is t[1]
    with pytest.raises(dcp.DcpError, match=r"both named 'a\.x'.*\('a', 'x'\).*\('a\.x',\)"):
        flatten({"a": {"x": t[0]}, "a.x": t[1]}, is_tensor_type, is_torch_tensor)
    with pytest.raises(dcp.DcpError, match=r"both named 'a\.x'"):
        flatten({"a.x": t[1], "a": {"x": t[0], "y": t[2]}}, is_tensor_type, is_torch_tensor)


def test_async_saver_options_reach_the_engine(tmp_path):
    try:
        dcp.set_async_options(max_staging_bytes=1 << 20, staging_threads=1, persist_nice=0)
        with pytest.raises(dcp.DcpError) as e:
            dcp.async_save({"t": torch.ones(1 << 20)}, tmp_path / "big").result()
        assert e.value.code == "INVALID_ARGUMENT" and "1048576" in str(e.value), str(e.value)
        f = dcp.async_save({"t": torch.ones(16)}, tmp_path / "small")
        assert f.result().bytes_written > 0 and f.staging.threads == 1
    finally:
        dcp.set_async_options()


def test_meta_device_templates_are_allocated_and_returned(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 3))
    x = torch.randn(2, 4)
    dcp.save({"model": model.state_dict(), "step": 9}, tmp_path / "ck")
    with torch.device("meta"):
        fresh = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 3))
    sd = {"model": fresh.state_dict(), "step": 0}
    dcp.load(sd, tmp_path / "ck")
    assert all(t.device.type == "cpu" for t in sd["model"].values()) and sd["step"] == 9
    fresh.load_state_dict(sd["model"], assign=True)
    assert torch.equal(fresh(x), model(x))


def test_meta_dtensor_templates(tmp_path):
    """A DTensor on meta (a sharded model built on meta) gets a DTensor on the CPU."""
    code = f"""
import torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor
import hyperdcp as dcp
dist.init_process_group("gloo", init_method="file://{tmp_path}/store", rank=0, world_size=1)
mesh = init_device_mesh("cpu", (1,))
w = torch.arange(12.0).reshape(3, 4)
dcp.save({{"w": distribute_tensor(w, mesh, [Shard(0)])}}, "{tmp_path}/ck")
meta = distribute_tensor(torch.empty(3, 4, device="meta"), mesh, [Shard(0)])
sd = {{"w": meta}}
dcp.load(sd, "{tmp_path}/ck")
assert isinstance(sd["w"], DTensor) and sd["w"].to_local().device.type == "cpu"
assert sd["w"].placements == meta.placements and torch.equal(sd["w"].full_tensor(), w)
print("ok")
dist.destroy_process_group()
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_a_reused_preparation_notices_a_dtensor_of_another_layout(tmp_path):
    """The same local tensor under a DTensor of another placement or global shape is another
    entry: a reused preparation would save it under the old layout. Also a sparse tensor in a
    dense one's place (it has no data pointer) is prepared anew and refused, never a crash."""
    code = f"""
import torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard
import hyperdcp as dcp
from hyperdcp import _prepare
dist.init_process_group("gloo", init_method="file://{tmp_path}/store", rank=0, world_size=1)
mesh = init_device_mesh("cpu", (1,))
assert _prepare._data_ptr_fn() is not None
local = torch.arange(12.0).reshape(3, 4)
def dtensor(placement, shape):
    return DTensor.from_local(local, mesh, [placement], run_check=False, shape=shape,
                              stride=torch.empty(shape, device="meta").stride())
first_b = torch.ones(2)  # kept alive: a new tensor must not take its address
dcp.save({{"w": dtensor(Shard(0), torch.Size((3, 4))), "b": first_b}}, "{tmp_path}/a")
(cached,) = [c for c in _prepare._CACHE.values() if c.signatures is not None]
assert cached.signatures.native is not None
same = dtensor(Shard(0), torch.Size((3, 4)))
b = torch.ones(2)
assert cached.signatures.match([same, b]) is None  # another b: other memory
_prepare._CACHE.clear()
dcp.save({{"w": same, "b": b}}, "{tmp_path}/a2")
(cached,) = [c for c in _prepare._CACHE.values() if c.signatures is not None]
assert cached.signatures.match([dtensor(Shard(0), torch.Size((3, 4))), b]) is not None
assert cached.signatures.match([dtensor(Replicate(), torch.Size((3, 4))), b]) is None
# A global shape this one rank cannot hold: refused, which only a new preparation sees
# (the reused one would have saved the old shape).
try:
    dcp.save({{"w": dtensor(Shard(0), torch.Size((6, 4))), "b": b}}, "{tmp_path}/b")
    raise AssertionError("saved under the previous layout")
except dcp.DcpError as e:
    assert "not one box" in str(e), e
# A sparse tensor where a dense one was (the same class): torch's data pointer function
# throws for it inside the engine's check, which then falls back to a new preparation.
dense = torch.eye(3)
dcp.save({{"w": dense, "b": b}}, "{tmp_path}/d")
(cached,) = [c for c in _prepare._CACHE.values()
             if c.signatures is not None and len(c.signatures.kinds) == 2 and
             c.signatures.kinds[0] is torch.Tensor]
assert cached.signatures.match([dense.to_sparse(), b]) is None
try:
    dcp.save({{"w": dense.to_sparse(), "b": b}}, "{tmp_path}/e")
    raise AssertionError("a sparse tensor was saved")
except dcp.DcpError as e:
    assert "'w'" in str(e), e
print("ok")
dist.destroy_process_group()
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


@pytest.mark.parametrize("dtype", [torch.complex32, torch.complex64, torch.complex128])
def test_complex_tensors_across_a_reshard(tmp_path, dtype):
    full = (torch.arange(24, dtype=torch.float64).reshape(4, 6) * (1 + 2j)).to(dtype)
    dcp.save({"z": full.clone()}, tmp_path / "ck")
    cols = torch.zeros(4, 3, dtype=dtype)  # a box of other shape: the load reshards
    dcp.load({"z": dcp.TensorChunk(cols, (4, 6), (0, 3))}, tmp_path / "ck")
    # Compared as raw bytes: torch has no equal() for complex32.
    assert torch.equal(cols.view(torch.uint8), full[:, 3:].contiguous().view(torch.uint8))
    md = dcp.read_metadata(tmp_path / "ck")
    assert md.tensors["z"].torch_dtype == dtype
    if dtype != torch.complex32:  # torch DCP side by side (its own complex32 support aside)
        ours, theirs = both(tmp_path / "side", {"z": full}, lambda: {"z": torch.zeros_like(full)})
        assert torch.equal(ours["z"], theirs["z"])


def test_a_reused_preparation_follows_a_new_nesting_of_the_same_tensors(tmp_path):
    """The same tensors under the same names, nested otherwise: not the cached preparation
    (its stored paths would open the second checkpoint with the first one's nesting)."""
    w, v = torch.ones(2), torch.zeros(3)
    for _ in range(2):  # the second round reuses each one's own preparation
        dcp.save({"model": {"net1.weight": w, "b": v}}, tmp_path / "a")
        dcp.save({"model": {"net1": {"weight": w}, "b": v}}, tmp_path / "b")
        assert sorted(dcp.load_all(tmp_path / "a")["model"]) == ["b", "net1.weight"]
        got = dcp.load_all(tmp_path / "b")["model"]
        assert sorted(got) == ["b", "net1"] and torch.equal(got["net1"]["weight"], w)


def test_load_all_opens_a_checkpoint_with_its_exact_nesting(tmp_path):
    a = {"model": {"net1.weight": torch.ones(2)}, "step": 3}
    b = {"model": {"net1": {"weight": torch.full((2,), 2.0)}}, "step": 4}
    dcp.save(a, tmp_path / "a")
    dcp.save(b, tmp_path / "b")  # the same names as a, other nesting
    got_a, got_b = dcp.load_all(tmp_path / "a"), dcp.load_all(tmp_path / "b")
    assert list(got_a["model"]) == ["net1.weight"] and torch.equal(got_a["model"]["net1.weight"],
                                                                   torch.ones(2))
    assert torch.equal(got_b["model"]["net1"]["weight"], torch.full((2,), 2.0))
    assert got_a["step"] == 3 and got_b["step"] == 4

    rich = {"x": (torch.zeros(1), torch.ones(1)), "groups": [{"lr": 0.1}, torch.arange(3)],
            "counts": {1: torch.ones(1), (2, "b"): 5}, "betas": [0.9, 0.99],
            "rng": random.Random(0).getstate(), "w": torch.arange(6.0).reshape(2, 3)}
    dcp.save(rich, tmp_path / "rich")
    got = dcp.load_all(tmp_path / "rich")
    assert type(got["x"]) is tuple and torch.equal(got["x"][1], torch.ones(1))
    assert got["groups"][0] == {"lr": 0.1} and torch.equal(got["groups"][1], torch.arange(3))
    assert list(got["counts"]) == [1, (2, "b")] and got["counts"][(2, "b")] == 5
    assert got["betas"] == [0.9, 0.99] and got["rng"] == rich["rng"]
    assert torch.equal(got["w"], rich["w"])
    md = dcp.read_metadata(tmp_path / "rich")
    assert md.paths["counts.1"] == ("counts", 1) and md.paths["x.0"] == ("x", 0)
    # Only some entries: by top-level key, by name, by name prefix.
    assert set(dcp.load_all(tmp_path / "rich", keys=["w", "betas"])) == {"w", "betas"}
    assert list(dcp.load_all(tmp_path / "rich", keys=["groups.0.lr"])["groups"]) == [{"lr": 0.1}]
    with pytest.raises(dcp.DcpError, match="no entry matches"):
        dcp.load_all(tmp_path / "rich", keys=["nothing"])


def test_load_all_of_a_checkpoint_without_paths(tmp_path):
    sd = dcp._dcp.StateDict()  # the engine's own save records no paths (as C++ callers)
    t = torch.arange(4.0)
    sd.add_tensor("model.w", t.data_ptr(), "F32", [4], [4], [0])
    sd.add_bytes("step", b"7")
    blob = (7).to_bytes(8, "little") + b"\xe2\x28"  # neither JSON nor UTF-8 (`dcp demo`'s kind)
    sd.add_bytes("train.step", blob)
    dcp._dcp.save(sd, str(tmp_path / "ck"), dcp._dcp.local_comm(), True, 0)
    got = dcp.load_all(tmp_path / "ck")
    assert set(got) == {"model.w", "step", "train.step"} and got["step"] == 7
    assert got["train.step"] == blob  # opaque bytes come back as they were written
    assert torch.equal(got["model.w"], t)


def test_load_all_matches_torch_load_state_dict_from_keys(tmp_path):
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

    state = {"model": {"layer": {"w": torch.arange(4.0), "b": torch.ones(2)}}, "step": 5}
    dcp.save(state, tmp_path / "ours")
    torch_dcp.save(state, checkpoint_id=tmp_path / "theirs", no_dist=True)
    ours = dcp.load_all(tmp_path / "ours")
    theirs = _load_state_dict_from_keys(checkpoint_id=tmp_path / "theirs")
    assert ours.keys() == theirs.keys() and ours["step"] == theirs["step"]
    for k in ("w", "b"):
        assert torch.equal(ours["model"]["layer"][k], theirs["model"]["layer"][k])


def test_hostile_paths_and_values_are_one_clear_error():
    """A damaged or hostile checkpoint never makes load_all allocate what it does not hold
    (a list index of 30,000,000 in a stored path) nor fail with a bare RecursionError."""
    from hyperdcp import _paths, _values

    entries = [([("d", "a"), ("l", 0)], 1), ([("d", "a"), ("l", 30_000_000)], 2)]
    with pytest.raises(dcp.DcpError, match="position 30000000 of a list") as e:
        _paths.nest(entries, 2)
    assert e.value.code == "INVALID_ARGUMENT"
    assert _paths.nest(entries[:1], 2) == {"a": [1]}
    # Selected entries of a larger checkpoint, and lists of empty containers, are no damage.
    assert _paths.nest([([("d", "a"), ("l", 3)], 1)], 4) == {"a": [None, None, None, 1]}
    deep = b"[" * 100_000 + b"]" * 100_000
    for data in (deep, _values._MAGIC + deep):
        with pytest.raises(dcp.DcpError, match="'x'"):
            _values.decode("x", data)
    with pytest.raises(dcp.DcpError, match="'x': stored path is malformed"):
        _paths.decode("x", deep)
