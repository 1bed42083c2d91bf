"""hyperdcp.install() and what frameworks see of a hyperdcp checkpoint, in one process: torch's
entry points replaced everywhere, torch's own tools reading hyperdcp checkpoints, the probe
that frameworks look for, and what hyperdcp hands to torch instead of refusing it."""

import importlib
import logging
import os
import subprocess
import sys
import textwrap
import types

import pytest
import torch
import torch.distributed.checkpoint as torch_dcp
from torch.distributed.checkpoint import format_utils, state_dict_loader, state_dict_saver

import hyperdcp as dcp
from hyperdcp import _install


@pytest.fixture
def installed():
    dcp.install()
    try:
        yield
    finally:
        dcp.uninstall()


def _state():
    torch.manual_seed(0)
    return {"model": {"w": torch.randn(6, 4), "b": torch.randn(4).to(torch.bfloat16)},
            "optim": {"state": {0: {"step": torch.tensor(3.0)}}, "param_groups": [{"lr": 0.1}]},
            "step": 7, "tag": "run-1"}


def _assert_same(got, want):
    assert type(got) is type(want) or (isinstance(got, dict) and isinstance(want, dict)), (
        got, want)
    if isinstance(want, dict):
        assert set(map(str, got)) == set(map(str, want)), (got.keys(), want.keys())
        by_str = {str(k): v for k, v in got.items()}
        for k, v in want.items():
            _assert_same(by_str[str(k)], v)
    elif isinstance(want, torch.Tensor):
        assert got.dtype == want.dtype and torch.equal(got, want), (got, want)
    else:
        assert got == want, (got, want)


def test_install_replaces_torch_entry_points_everywhere_and_uninstall_restores():
    originals = {n: getattr(torch_dcp, n) for n in ("save", "load", "async_save")}
    early = types.ModuleType("framework_that_imported_early")
    early.save, early.load, early.async_save = (originals["save"], originals["load"],
                                                originals["async_save"])
    early.unrelated = len
    sys.modules[early.__name__] = early
    try:
        dcp.install()
        dcp.install()  # a second call changes nothing
        assert torch_dcp.save is dcp.save and torch_dcp.load is dcp.load
        assert torch_dcp.async_save is dcp.async_save
        assert state_dict_saver.save is dcp.save and state_dict_loader.load is dcp.load
        assert early.save is dcp.save and early.load is dcp.load and early.unrelated is len
        assert early.async_save is dcp.async_save
        assert state_dict_saver.save_state_dict is not originals["save"]
        # Frameworks written later see hyperdcp's through torch's modules.
        assert importlib.import_module("torch.distributed.checkpoint").save is dcp.save
        dcp.uninstall()
        for name, fn in originals.items():
            assert getattr(torch_dcp, name) is fn and getattr(early, name) is fn
        assert state_dict_saver.save is originals["save"]
        assert "read_metadata" in torch_dcp.FileSystemReader.__dict__
        assert torch_dcp.FileSystemReader.read_metadata.__module__.startswith("torch")
    finally:
        dcp.uninstall()
        del sys.modules[early.__name__]


def test_a_checkpoint_carries_the_probe_frameworks_look_for(tmp_path):
    """torchtitan and torchtune find checkpoints by `.metadata`; without install(), torch's
    own reader fails naming hyperdcp and how to read it."""
    dcp.save(_state(), tmp_path / "ck")
    probe = tmp_path / "ck" / ".metadata"
    assert probe.is_file()
    from hyperdcp._formats import PROBE_PREFIX
    assert probe.read_bytes().startswith(PROBE_PREFIX)
    with pytest.raises(ModuleNotFoundError) as e:
        torch_dcp.FileSystemReader(tmp_path / "ck").read_metadata()
    assert "hyperdcp checkpoint" in str(e.value) and "install()" in str(e.value)
    assert "to_torch_dcp" in str(e.value)


def test_torch_tools_read_hyperdcp_checkpoints_when_installed(tmp_path, installed):
    """dcp_to_torch_save (what accelerate's merge-weights and Lightning's consolidation do),
    _load_state_dict_from_keys and a plain FileSystemReader load, through torch's planners."""
    from hyperdcp._delegate import torch_function

    state = _state()
    torch_dcp.save(state, checkpoint_id=tmp_path / "ck")  # hyperdcp, through torch's name
    assert (tmp_path / "ck" / "dcp.metadata").exists()
    torch_function("save")(state, checkpoint_id=tmp_path / "theirs", no_dist=True)
    for d in ("ck", "theirs"):  # side by side with the same checkpoint in torch's format
        format_utils.dcp_to_torch_save(tmp_path / d, tmp_path / f"{d}.pt")
    whole = torch.load(tmp_path / "ck.pt", weights_only=False)
    _assert_same(whole, torch.load(tmp_path / "theirs.pt", weights_only=False))
    _assert_same(whole["model"], state["model"])
    assert whole["step"] == 7 and whole["tag"] == "run-1"
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys
    got = _load_state_dict_from_keys({"model.w"}, checkpoint_id=tmp_path / "ck")
    assert torch.equal(got["model"]["w"], state["model"]["w"])
    # torch's reader with a planner subclass: torch plans, hyperdcp reads (a box of a tensor).
    reader = torch_dcp.FileSystemReader(tmp_path / "ck")
    md = reader.read_metadata()
    assert md.state_dict_metadata["model.w"].size == torch.Size([6, 4])

    class Planner(torch_dcp.DefaultLoadPlanner):
        pass

    template = {"model": {"w": torch.zeros(6, 4), "b": torch.zeros(4, dtype=torch.float32)},
                "step": 0}
    torch_dcp.load(template, storage_reader=reader, planner=Planner())
    assert torch.equal(template["model"]["w"], state["model"]["w"]) and template["step"] == 7
    assert torch.equal(template["model"]["b"], state["model"]["b"].float())  # cast as torch


def test_torch_format_checkpoints_still_load(tmp_path, installed, caplog):
    """A job switched to hyperdcp resumes from the checkpoints torch wrote; a save over one
    replaces it (the probe takes `.metadata`), and overwrite=False refuses one as torch does."""
    state = _state()
    torch_dcp.save(state, storage_writer=torch_dcp.FileSystemWriter(tmp_path / "old"),
                   planner=type("P", (torch_dcp.DefaultSavePlanner,), {})())  # torch writes
    assert not (tmp_path / "old" / "dcp.metadata").exists()
    template = {"model": {"w": torch.zeros(6, 4), "b": torch.zeros(4, dtype=torch.bfloat16)},
                "step": 0, "tag": ""}
    with caplog.at_level(logging.WARNING, logger="hyperdcp"):
        torch_dcp.load(template, checkpoint_id=tmp_path / "old")
    assert "torch DCP's format" in caplog.text
    assert torch.equal(template["model"]["w"], state["model"]["w"]) and template["step"] == 7
    with pytest.raises(dcp.DcpError, match="overwrite=False"):
        torch_dcp.save(state, storage_writer=torch_dcp.FileSystemWriter(tmp_path / "old",
                                                                         overwrite=False))
    state["step"] = 8
    torch_dcp.save(state, checkpoint_id=tmp_path / "old")  # now hyperdcp's
    assert (tmp_path / "old" / "dcp.metadata").exists()
    template["step"] = 0
    dcp.load(template, tmp_path / "old")
    assert template["step"] == 8


def test_delegated_save_over_a_hyperdcp_checkpoint_wins(tmp_path, installed):
    """A writer hyperdcp does not serve: torch writes its format, and the older hyperdcp
    checkpoint in that directory no longer answers loads."""
    dcp.save({"t": torch.zeros(3), "step": 1}, tmp_path / "ck")
    torch_dcp.save({"t": torch.ones(3), "step": 2},
                   storage_writer=torch_dcp.FsspecWriter(str(tmp_path / "ck")))
    assert not (tmp_path / "ck" / "dcp.metadata").exists()
    got = {"t": torch.zeros(3), "step": 0}
    dcp.load(got, tmp_path / "ck")
    assert torch.equal(got["t"], torch.ones(3)) and got["step"] == 2


def test_async_stagers_and_checkpointer_types(tmp_path, installed, caplog):
    """torchtitan's async modes: a DefaultStager with asynchronous staging gets torch's
    AsyncSaveResponse, the PROCESS type is served on hyperdcp's thread, and a stager hyperdcp
    does not serve goes to torch."""
    from torch.distributed.checkpoint.staging import (BlockingAsyncStager, DefaultStager,
                                                      StagingOptions)
    from torch.distributed.checkpoint.state_dict_saver import (AsyncCheckpointerType,
                                                               AsyncSaveResponse)

    state = _state()
    stager = DefaultStager(StagingOptions(False, False, True, False))
    r = torch_dcp.async_save(state, checkpoint_id=tmp_path / "a", async_stager=stager,
                             async_checkpointer_type=AsyncCheckpointerType.PROCESS)
    assert isinstance(r, AsyncSaveResponse)
    r.staging_completion.result()
    assert r.upload_completion.result().bytes_written > 0
    stager.close()
    f = torch_dcp.async_save(state, checkpoint_id=tmp_path / "b",
                             async_stager=DefaultStager(StagingOptions(False, False, False,
                                                                       False)))
    assert isinstance(f, dcp.SaveFuture) and f.result().bytes_written > 0
    with caplog.at_level(logging.WARNING, logger="hyperdcp"):
        torch_dcp.async_save(state, checkpoint_id=tmp_path / "c",
                             async_stager=BlockingAsyncStager()).result()
    # torch's async_save staged it; its upload calls torch's save, which is hyperdcp's now.
    assert "BlockingAsyncStager is not one hyperdcp serves" in caplog.text
    for d in "abc":
        got = dcp.load_all(tmp_path / d) if d != "c" else None
        template = {"model": {"w": torch.zeros(6, 4), "b": torch.zeros(4, dtype=torch.bfloat16)},
                    "step": 0}
        dcp.load(template, tmp_path / d, allow_partial=True)
        assert torch.equal(template["model"]["w"], state["model"]["w"]), d
        if got is not None:
            _assert_same(got["model"], state["model"])


def test_unknown_url_schemes_are_one_clear_error(tmp_path):
    """A scheme neither hyperdcp nor torch's fsspec storage serves here (torch would write a
    local directory named "gs:"); one fsspec serves goes to torch (hyperdcp._delegate)."""
    from hyperdcp._torch_args import _fsspec_serves

    urls = ["nosuchscheme://bucket/ck"] + [f"{s}://bucket/ck" for s in ("gs", "az")
                                            if not _fsspec_serves(s)]
    for url in urls:
        with pytest.raises(dcp.DcpError, match="URL scheme") as e:
            dcp.save({"t": torch.ones(1)}, url)
        assert e.value.code == "INVALID_ARGUMENT"
        assert url.split(":")[0] in str(e.value)
    assert not any(p.name.endswith(":") for p in tmp_path.parent.iterdir())
    dcp.save({"t": torch.ones(1)}, f"file://{tmp_path}/ck")
    assert (tmp_path / "ck" / "dcp.metadata").exists()


def test_the_launcher_runs_an_unchanged_torch_dcp_script(tmp_path):
    """python -m hyperdcp.run script.py args: the script imports torch DCP itself."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import sys
        import torch
        from torch.distributed.checkpoint import save   # bound before any call
        import torch.distributed.checkpoint as dcp
        save({"t": torch.arange(4.0)}, checkpoint_id=sys.argv[1])
        got = {"t": torch.zeros(4)}
        dcp.load(got, checkpoint_id=sys.argv[1])
        assert torch.equal(got["t"], torch.arange(4.0))
        print("script ran as", __name__)
    """))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "-m", "hyperdcp.run", str(script), str(tmp_path / "ck")],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "script ran as __main__" in p.stdout
    assert (tmp_path / "ck" / "dcp.metadata").exists()
    p = subprocess.run([sys.executable, "-m", "hyperdcp.run"], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 2 and "usage" in p.stderr


def test_a_fresh_optimizer_as_a_stateful_template_loads_its_state(tmp_path):
    """torch loads nothing into an optimizer that has not stepped yet (no state to use as a
    template); hyperdcp creates its state first, so it is loaded, never an empty success."""
    torch.manual_seed(0)
    net = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(net.parameters(), lr=0.01, weight_decay=0.1)
    net(torch.randn(2, 4)).sum().backward()
    opt.step()
    dcp.save({"model": net, "optim": opt}, tmp_path / "ck")
    net2 = torch.nn.Linear(4, 3)
    opt2 = torch.optim.AdamW(net2.parameters(), lr=0.01, weight_decay=0.1)
    assert not opt2.state
    dcp.load({"model": net2, "optim": opt2}, tmp_path / "ck")
    want, got = opt.state_dict()["state"], opt2.state_dict()["state"]
    assert set(got) == set(want) == {0, 1}
    for i in want:
        for k, v in want[i].items():
            assert torch.equal(got[i][k], v), (i, k)
    for a, b in zip(net.parameters(), net2.parameters()):
        assert torch.equal(a, b)
    # A checkpoint without optimizer state leaves a fresh optimizer as it was.
    fresh = torch.optim.AdamW(torch.nn.Linear(4, 3).parameters())
    dcp.save({"optim": fresh}, tmp_path / "no-state")
    dcp.load({"optim": fresh}, tmp_path / "no-state")
    assert not fresh.state


def test_what_torch_serves_stays_torchs(tmp_path, installed):
    """A torch checkpoint on a URL only torch's fsspec storage reaches loads through torch;
    to_torch_dcp writes torch's format even while installed."""
    from hyperdcp._delegate import torch_function

    state = {"t": torch.arange(4.0), "step": 2}
    torch_function("save")(state, checkpoint_id="memory://hyperdcp-test/ck", no_dist=True)
    back = {"t": torch.zeros(4), "step": 0}
    dcp.load(back, checkpoint_id="memory://hyperdcp-test/ck", no_dist=True)
    assert torch.equal(back["t"], state["t"]) and back["step"] == 2
    dcp.save(state, tmp_path / "ours")
    dcp.to_torch_dcp(tmp_path / "ours", tmp_path / "theirs")
    assert not (tmp_path / "theirs" / "dcp.metadata").exists()
    assert not (tmp_path / "theirs" / ".metadata").read_bytes().startswith(b"\x80\x02chyperdcp")


def test_install_is_all_or_nothing_and_skips_odd_modules():
    """A module whose namespace cannot be read is left alone; install() completes."""
    class Odd(types.ModuleType):
        def __getattribute__(self, name):
            if name == "__dict__":
                raise RuntimeError("lazy module")
            return super().__getattribute__(name)

    sys.modules["odd_lazy_module"] = Odd("odd_lazy_module")
    try:
        dcp.install()
        assert torch_dcp.save is dcp.save
        assert _install.installed()
        assert torch_dcp.FileSystemReader.read_metadata.__module__.startswith("hyperdcp")
    finally:
        dcp.uninstall()
        del sys.modules["odd_lazy_module"]


def test_reserved_per_rank_names_are_refused(tmp_path):
    with pytest.raises(dcp.DcpError, match="__dcp_rank_"):
        dcp.save({"x.__dcp_rank_0": 1}, tmp_path / "ck")
