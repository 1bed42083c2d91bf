"""Training frameworks' own checkpoint code on hyperdcp, through hyperdcp.install().

Each flow of workers/fw_flows.py (torchtitan's CheckpointManager, accelerate's FSDP helpers and
merge_fsdp_weights, Lightning Fabric's ModelParallelStrategy, torchtune's DistributedCheckpointer)
runs twice under torchrun on 2 ranks: on torch DCP as it is, and with `hyperdcp.install()` before
the framework is imported. Both runs must succeed (each checks its own bit-exact resume) and
write the same results: the same keys, the tensors equal bit for bit, the values equal.

A framework that is not installed skips its test; run.sh installs them (see its framework step).
"""

import pytest
import torch

# flow, the module it needs, the pip commands that bring it (run.sh's framework step)
FLOWS = [
    ("titan", "torchtitan", "pip install --no-deps torchtitan==0.3.0 && "
                            "pip install tyro einops spmd_types==0.2.3"),
    ("accelerate", "accelerate", "pip install accelerate"),
    ("fabric", "lightning.fabric", "pip install lightning"),
    ("torchtune", "torchtune", "pip install --no-deps torchtune==0.6.1 torchao==0.15.0 && "
                               "pip install datasets omegaconf sentencepiece tiktoken tokenizers"),
    ("transformers", "transformers.distributed.checkpoint", "pip install transformers"),
]


def differences(got, want, path: str = "") -> list:
    """Where two results differ: tensors by dtype, shape and bits, the rest by ==."""
    if isinstance(want, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            return [f"{path}: {type(got).__name__} where torch DCP has a tensor"]
        if got.dtype != want.dtype or got.shape != want.shape:
            return [f"{path}: {got.dtype}{tuple(got.shape)} != {want.dtype}{tuple(want.shape)}"]
        return [] if torch.equal(got, want) else [f"{path}: tensor values differ"]
    if isinstance(want, dict):
        if not isinstance(got, dict) or got.keys() != want.keys():
            keys = set(got) if isinstance(got, dict) else set()
            return [f"{path}: keys only in hyperdcp's {sorted(map(str, keys - set(want)))}, "
                    f"only in torch's {sorted(map(str, set(want) - keys))}"]
        return [d for k in want for d in differences(got[k], want[k], f"{path}/{k}")]
    if isinstance(want, (list, tuple)):
        if type(got) is not type(want) or len(got) != len(want):
            return [f"{path}: {got!r} != {want!r}"]
        return [d for i, (g, w) in enumerate(zip(got, want))
                for d in differences(g, w, f"{path}[{i}]")]
    return [] if got == want else [f"{path}: {got!r} != {want!r}"]


@pytest.mark.parametrize("flow, module, pip", FLOWS, ids=[f[0] for f in FLOWS])
def test_framework_checkpoints_on_hyperdcp_as_on_torch_dcp(torchrun, tmp_path, flow, module,
                                                           pip):
    pytest.importorskip(module, reason=f"{module} is not installed ({pip})")
    out = {}
    for mode in ("torch", "hyperdcp"):
        # A failing run fails the test with every rank's whole output (the torchrun fixture).
        try:
            out[mode] = torchrun(2, "fw_flows.py", flow, mode, tmp_path / mode, timeout=300)
        except pytest.fail.Exception as e:
            # torch DCP's own run (hyperdcp not imported) once aborted at interpreter exit
            # ("terminate called without an active exception") after both ranks had finished
            # their flow and rank 0 had written the result: that run is the reference only.
            said = str(e)
            if not (mode == "torch" and said.count(f"{flow}: ok") == 2
                    and "terminate called without an active exception" in said
                    and (tmp_path / mode / f"result-{flow}.pt").exists()):
                raise
            out[mode] = said
        assert out[mode].count(f"{flow}: ok") == 2, f"{mode} run of {flow}:\n{out[mode]}"

    theirs = torch.load(tmp_path / "torch" / f"result-{flow}.pt", weights_only=True)
    ours = torch.load(tmp_path / "hyperdcp" / f"result-{flow}.pt", weights_only=True)
    assert theirs, f"torch DCP's run of {flow} wrote an empty result:\n{out['torch']}"
    diff = differences(ours, theirs)
    assert not diff, (f"{flow}: hyperdcp's results differ from torch DCP's in "
                      f"{len(diff)} place(s):\n" + "\n".join(diff[:40]) +
                      f"\n--- the hyperdcp run's output:\n{out['hyperdcp']}")
