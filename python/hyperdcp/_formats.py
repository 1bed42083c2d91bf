"""Which format a checkpoint directory holds: hyperdcp's (dcp.metadata, and the `.metadata`
probe its commit writes) or torch DCP's (`.metadata` written by torch). No torch needed."""

import os

COMMITTED = "dcp.metadata"
PROBE = ".metadata"
# The start of the probe a commit writes (src/checkpoint/torch_probe.cc): a pickle naming a
# module whose name tells how to read the checkpoint.
PROBE_PREFIX = b"\x80\x02chyperdcp checkpoint:"


def _local(directory: str) -> bool:
    return "://" not in directory


def holds_torch_format(directory: "str | os.PathLike") -> bool:
    """Whether a local directory holds a checkpoint in torch's format that is newer than any
    hyperdcp checkpoint there (torch's save replaces `.metadata` with its own)."""
    directory = os.fspath(directory)
    if not _local(directory):
        return False
    probe = os.path.join(directory, PROBE)
    try:
        with open(probe, "rb") as f:
            if f.read(len(PROBE_PREFIX)) == PROBE_PREFIX:
                return False
        torch_time = os.stat(probe).st_mtime_ns
    except OSError:
        return False
    try:
        return torch_time >= os.stat(os.path.join(directory, COMMITTED)).st_mtime_ns
    except OSError:
        return True  # no hyperdcp checkpoint beside it


def holds_hyperdcp_format(directory: "str | os.PathLike") -> bool:
    """Whether a directory (local, or an s3:// prefix) holds a hyperdcp checkpoint newer than
    any torch checkpoint there; another URL (torch's fsspec storage) never does."""
    directory = os.fspath(directory)
    if directory.startswith("s3://"):  # the engine reads it there
        from . import _dcp

        try:
            _dcp.read_metadata(directory)
            return True
        except _dcp.DcpError:
            return False
    if not _local(directory):
        return False
    return os.path.exists(os.path.join(directory, COMMITTED)) and \
        not holds_torch_format(directory)
