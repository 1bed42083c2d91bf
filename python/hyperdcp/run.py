"""python -m hyperdcp.run [-m module | script] args...: runs a training program with
torch.distributed.checkpoint served by hyperdcp (hyperdcp.install() first), without editing
it. As torchrun's program: torchrun --nproc_per_node 8 -m hyperdcp.run train.py --config ..."""

import os
import runpy
import sys

from ._install import install

USAGE = "usage: python -m hyperdcp.run [-m module | script] [args...]"


def main(argv: "list[str]") -> None:
    if not argv or argv[0] in ("-h", "--help") or (argv[0] == "-m" and len(argv) < 2):
        print(USAGE, file=sys.stderr if not argv or argv[0] == "-m" else sys.stdout)
        sys.exit(0 if argv and argv[0] in ("-h", "--help") else 2)
    install()
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        # As `python script`: the script's directory first, where `python -m` put the current one.
        sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
        runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
