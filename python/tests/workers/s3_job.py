"""Jobs the S3 tests run in processes of their own (their environment names the endpoint):
  save DIR VALUE MIB   save {"w": MIB MiB of VALUE, "step": VALUE} (the killed-save test)
  roundtrip DIR [PAUSE]  save and load back a multipart-sized state, bit-exact (PAUSE seconds
                         between the two)
  error DIR            a save that must fail: prints the error's text"""

import sys
import time

import torch

import hyperdcp as dcp


def state(value: int, mib: int):
    return {"w": torch.full((mib << 18,), float(value)), "step": value,
            "small": torch.arange(1000, dtype=torch.int64) * value}


def main() -> None:
    what, directory = sys.argv[1], sys.argv[2]
    if what == "save":
        value, mib = int(sys.argv[3]), int(sys.argv[4])
        print("saving", flush=True)
        dcp.save(state(value, mib), directory, no_dist=True)
        print("saved", flush=True)
    elif what == "roundtrip":
        src = state(7, 40)
        dcp.save(src, directory, no_dist=True)
        if len(sys.argv) > 3:
            time.sleep(float(sys.argv[3]))
        got = {"w": torch.zeros(40 << 18), "step": 0, "small": torch.zeros(1000, dtype=torch.int64)}
        dcp.load(got, directory, no_dist=True)
        assert got["step"] == 7 and torch.equal(got["w"], src["w"]), "mismatch"
        assert torch.equal(got["small"], src["small"])
        print("roundtrip ok")
    elif what == "error":
        try:
            dcp.save(state(1, 1), directory, no_dist=True)
        except dcp.DcpError as e:
            print("error:", e)
            return
        raise SystemExit("the save did not fail")


if __name__ == "__main__":
    main()
