"""Where `python -m hyperdcp.bench` writes, and how each phase starts there the same way for
both libraries: a local directory (deleted and synced before saves, dropped from the page
cache before cold loads, read before warm ones), or an s3:// prefix (every object deleted
before saves; there is no cache, so warm = cold), with torch DCP's writer and reader for it
(FileSystemWriter/Reader, or FsspecWriter/Reader through s3fs)."""

import ctypes
import mmap
import os
import shutil
import time
from typing import Any, List

import torch.distributed as dist
import torch.distributed.checkpoint as torch_dcp

_CHUNK = 16 << 20


def scratch_for(path: str) -> "LocalScratch | S3Scratch":
    return S3Scratch(path) if path.startswith("s3://") else LocalScratch(path)


class LocalScratch:
    def __init__(self, path: str) -> None:
        self.root = os.path.abspath(path)
        self.ckpt = os.path.join(self.root, "ckpt")
        if dist.get_rank() == 0:
            os.makedirs(self.root, exist_ok=True)

    def fresh(self, pause: float) -> None:
        """Deletes the checkpoint and syncs (rank 0), then pauses: the same start for every
        save."""
        dist.barrier()
        if dist.get_rank() == 0:
            shutil.rmtree(self.ckpt, ignore_errors=True)
            os.sync()
        dist.barrier()
        time.sleep(pause)

    def cold(self) -> float:
        """Drops the checkpoint from the page cache (rank 0, every file); its residency
        afterwards."""
        dist.barrier()
        frac = 0.0
        if dist.get_rank() == 0:
            drop_cache(self.ckpt)
            frac = resident_fraction(self.ckpt)
        dist.barrier()
        return frac

    def warm(self) -> None:
        dist.barrier()
        if dist.get_rank() == 0:
            read_all(self.ckpt)

    def notes(self) -> List[str]:
        if in_memory_fs(self.root):
            return [f"{self.root} is on an in-memory file system: cold loads are not cold"]
        return []

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def torch_writer(self) -> Any:
        return torch_dcp.FileSystemWriter(self.ckpt)

    def torch_reader(self) -> Any:
        return torch_dcp.FileSystemReader(self.ckpt)


class S3Scratch:
    """An s3:// prefix, configured from the environment as the AWS tools (and hyperdcp) are;
    torch DCP reaches it through fsspec's s3fs, its documented path to object storage."""

    def __init__(self, path: str) -> None:
        try:
            import s3fs  # torch DCP's S3 path: needed only here
        except ImportError as e:
            raise SystemExit(f"--dir {path}: torch DCP reaches S3 through fsspec's s3fs, "
                             "which is not installed (pip install s3fs)") from e

        self.root = path.rstrip("/")
        self.ckpt = self.root + "/ckpt"
        self.fs = s3fs.S3FileSystem(skip_instance_cache=True)

    def fresh(self, pause: float) -> None:
        dist.barrier()
        if dist.get_rank() == 0:
            self._delete(self.ckpt)
        dist.barrier()
        time.sleep(pause)

    def cold(self) -> float:
        return 0.0  # nothing between the store and the reader keeps the bytes

    def warm(self) -> None:
        dist.barrier()

    def notes(self) -> List[str]:
        return [f"{self.root} is object storage: no page cache, so warm loads are cold"]

    def remove(self) -> None:
        self._delete(self.root)

    def _delete(self, prefix: str) -> None:
        self.fs.invalidate_cache()
        if self.fs.exists(prefix):
            self.fs.rm(prefix, recursive=True)
        self.fs.invalidate_cache()

    def torch_writer(self) -> Any:
        return torch_dcp.FsspecWriter(self.ckpt)

    def torch_reader(self) -> Any:
        return torch_dcp.FsspecReader(self.ckpt)


def files_under(path: str) -> List[str]:
    out = []
    for root, _, names in os.walk(path):
        out.extend(os.path.join(root, n) for n in names)
    return sorted(out)


def drop_cache(path: str) -> None:
    """Writes back and drops every file of `path` from the page cache (as `dcp bench`)."""
    for f in files_under(path):
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                       ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]


def resident_fraction(path: str) -> float:
    """How much of the files under `path` sits in the page cache now (mincore over a
    read-only mapping, which reads nothing)."""
    page = mmap.PAGESIZE
    total = resident = 0
    for f in files_under(path):
        size = os.path.getsize(f)
        if size == 0:
            continue
        fd = os.open(f, os.O_RDONLY)
        try:
            addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            if addr in (None, ctypes.c_void_p(-1).value):
                raise OSError(ctypes.get_errno(), f"mmap {f}")
            try:
                n = (size + page - 1) // page
                vec = (ctypes.c_ubyte * n)()
                if _libc.mincore(addr, size, vec) != 0:
                    raise OSError(ctypes.get_errno(), f"mincore {f}")
                resident += sum(b & 1 for b in bytes(vec))
                total += n
            finally:
                _libc.munmap(addr, size)
        finally:
            os.close(fd)
    return resident / total if total else 0.0


def read_all(path: str) -> None:
    buf = bytearray(_CHUNK)
    for f in files_under(path):
        with open(f, "rb", buffering=0) as fh:
            while fh.readinto(buf):
                pass


def in_memory_fs(path: str) -> bool:
    best, fstype = "", ""
    with open("/proc/mounts") as fh:
        for line in fh:
            parts = line.split()
            mnt = parts[1]
            if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                best, fstype = mnt, parts[2]
    return fstype in ("tmpfs", "ramfs")


