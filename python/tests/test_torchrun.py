"""Multi-process tests: real torchrun jobs on gloo (CPU)."""


def test_reshard_4_ranks_then_2_ranks(torchrun, tmp_path):
    out = torchrun(4, "reshard.py", tmp_path)
    assert out.count(": ok") == 4, out
    out = torchrun(2, "reshard.py", tmp_path, "load-only")
    assert out.count(": ok") == 2, out
