"""The Python examples of README.md and docs/python.md, run as written (a small model, loader
and RNG state in place of the user's, a temporary directory in place of /ckpt), and the
README's one-line switch for frameworks."""

import re
from pathlib import Path

import torch

import textwrap
import time

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def python_blocks(section: str):
    text = README.read_text()
    part = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", part, re.S)


class Transformer(torch.nn.Module):
    def __init__(self, config):
        super().__init__()
        self.proj = torch.nn.Linear(config["dim"], config["dim"])


class Position:
    """A data loader's Stateful position."""

    def __init__(self):
        self.position = 0

    def state_dict(self):
        return {"position": self.position}

    def load_state_dict(self, sd):
        self.position = sd["position"]


def test_the_python_page_examples_run(tmp_path):
    """docs/python.md's examples in order, in one scope: the training loop saves steps 0 and
    100, and the model built on meta loads its weights from step 100."""
    blocks = [textwrap.dedent(b) for b in
              re.findall(r"```python\n(.*?)```", (ROOT / "docs/python.md").read_text(), re.S)]
    assert len(blocks) == 3, blocks
    config = {"dim": 8}
    model = Transformer(config)
    optimizer = torch.optim.AdamW(model.parameters())
    model.proj(torch.ones(2, 8)).sum().backward()
    optimizer.step()
    trained = {k: v.clone() for k, v in model.state_dict().items()}
    logged = []
    scope = {"model": model, "optimizer": optimizer,
             "scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 10), "rank": 0,
             "loader": Position(), "rng": Position(), "resuming": False, "start": 0,
             "steps": 101, "train_step": lambda: None, "log": logged.append,
             "Transformer": Transformer, "config": config, "torch": torch}
    for block in blocks:
        exec(block.replace("/ckpt", str(tmp_path)), scope)
        if "future" in scope:
            scope["future"].result()
    assert (tmp_path / "step_0").is_dir() and (tmp_path / "step_100").is_dir()
    for _ in range(600):  # a done-callback may run just after result() returned
        if len(logged) == 2:
            break
        time.sleep(0.05)
    assert len(logged) == 2 and logged[-1] > 0  # the callbacks saw the bytes written
    loaded = scope["model"]
    assert loaded is not model and not loaded.proj.weight.is_meta
    for k, v in loaded.state_dict().items():
        assert torch.equal(v, trained[k]), k


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
