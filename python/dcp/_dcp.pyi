"""Type stub of the extension module dcp._dcp (python/src/*.cc)."""

from typing import Any, Dict, List, Optional, Sequence, Tuple

class DcpError(Exception):
    code: str  # "INVALID_ARGUMENT", "NOT_FOUND", "DATA_LOSS", ...

class Comm:
    @property
    def rank(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def backend(self) -> str: ...
    timeout_seconds: float

def local_comm() -> Comm: ...
def python_comm(impl: Any, rank: int, size: int) -> Comm: ...
def mpi_comm(fortran_handle: int) -> Comm: ...  # only when has_mpi
has_mpi: bool
def agree_on_status(comm: Comm, error: Optional[str]) -> None: ...

class StateDict:
    def __init__(self) -> None: ...
    def add_tensor(self, fqn: str, data_ptr: int, dtype: str, shape: Sequence[int],
                   global_shape: Sequence[int], offsets: Sequence[int]) -> None: ...
    def add_bytes(self, fqn: str, data: bytes = ...) -> None: ...
    def bytes_of(self, fqn: str) -> Optional[bytes]: ...
    def __len__(self) -> int: ...

class SaveResult:
    bytes_written: int
    items_written: int
    files_written: int
    unique_bytes: int
    plan_cache_hit: bool
    plan_seconds: float
    write_seconds: float
    commit_seconds: float
    total_seconds: float

class LoadResult:
    bytes_read: int
    files_opened: int
    chunks_read: int
    entries_loaded: int
    entries_skipped: int
    shared_shards: int
    shards_read_for_others: int
    shared_chunks: int
    broadcasts: int
    batches: int
    bytes_sent: int
    bytes_received: int
    groups_created: int
    metadata_seconds: float
    plan_seconds: float
    exchange_seconds: float
    shared_seconds: float
    private_seconds: float
    read_seconds: float
    total_seconds: float

def save(state_dict: StateDict, dir: str, comm: Comm, use_collectives: bool) -> SaveResult: ...
def load(state_dict: StateDict, dir: str, comm: Comm, broadcast: bool, allow_partial: bool,
         strip_prefix: str, add_prefix: str) -> LoadResult: ...

class StagingStats:
    bytes_staged: int
    bytes_allocated: int
    reused: bool
    wait_seconds: float
    copy_seconds: float
    blocked_seconds: float

class AsyncSave:
    def done(self) -> bool: ...
    def wait(self, timeout_s: Optional[float] = None) -> bool: ...
    def get(self) -> SaveResult: ...
    @property
    def staging(self) -> StagingStats: ...
    @property
    def dir(self) -> str: ...

class AsyncSaver:
    def __init__(self) -> None: ...
    def save(self, state_dict: StateDict, dir: str, comm: Comm,
             use_collectives: bool) -> AsyncSave: ...
    def close(self) -> None: ...

def read_metadata(dir: str) -> Dict[str, Any]: ...
