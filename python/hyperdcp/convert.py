"""Converting between hyperdcp and torch.distributed.checkpoint, in one process.

    python -m hyperdcp.convert to-torch SRC DST     # hyperdcp -> torch DCP (values included)
    python -m hyperdcp.convert from-torch SRC DST   # torch DCP -> hyperdcp

Every tensor is read whole into memory. `--allow-pickle`: values hyperdcp stores only
pickled (to-torch: loading them; from-torch: saving those torch unpickled) -- trust decisions.
"""

import argparse
import sys
from typing import List, Optional


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hyperdcp.convert",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("direction", choices=["to-torch", "from-torch"])
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--allow-pickle", action="store_true")
    args = ap.parse_args(argv)

    import hyperdcp

    try:
        if args.direction == "to-torch":
            hyperdcp.to_torch_dcp(args.src, args.dst, allow_pickle=args.allow_pickle)
        else:
            hyperdcp.from_torch_dcp(args.src, args.dst, allow_pickle=args.allow_pickle)
    except hyperdcp.DcpError as e:
        print(f"hyperdcp.convert: {e}", file=sys.stderr)
        return 1
    print(f"{args.src} -> {args.dst}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
