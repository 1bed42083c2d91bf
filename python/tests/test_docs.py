"""The README's Python quick start, run as written (a small model in place of the user's, a
temporary directory in place of /ckpt), and its one-line switch for frameworks."""

import re
from pathlib import Path

import torch

README = Path(__file__).resolve().parents[2] / "README.md"


def python_blocks(section: str):
    text = README.read_text()
    part = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", part, re.S)


def test_the_readme_quick_start_runs(tmp_path):
    blocks = python_blocks("Python quick start")
    assert len(blocks) == 2, blocks
    model = torch.nn.Linear(8, 4)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(2, 8)).sum().backward()
    optimizer.step()
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    scope = {"model": model, "optimizer": optimizer, "step": 100}
    exec(blocks[0].replace("/ckpt", str(tmp_path)), scope)
    assert (tmp_path / "step_100").is_dir() and (tmp_path / "step_101").is_dir()
    for k, v in model.state_dict().items():
        assert torch.equal(v, saved[k]), k
    try:
        exec(blocks[1], {})
        import torch.distributed.checkpoint as torch_dcp

        assert torch_dcp.save.__module__.startswith("hyperdcp")
    finally:
        import hyperdcp

        hyperdcp.uninstall()
