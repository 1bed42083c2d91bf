"""Type stub of the extension module hyperdcp._dcp (python/src/*.cc)."""

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
def mpi_comm(fortran_handle: int, plugin_path: str) -> Comm: ...  # loads _dcp_mpi.so once
def all_gather(comm: Comm, mine: bytes) -> List[bytes]: ...
__version__: str

class StateDict:
    def __init__(self) -> None: ...
    def add_tensor(self, fqn: str, data_ptr: int, dtype: str, shape: Sequence[int],
                   global_shape: Sequence[int], offsets: Sequence[int]) -> None: ...
    def add_bytes(self, fqn: str, data: bytes = ...) -> None: ...
    def bytes_of(self, fqn: str) -> Optional[bytes]: ...
    def set_paths(self, fqns: List[str], paths: List[bytes]) -> None: ...
    def __len__(self) -> int: ...

class SaveResult:
    bytes_written: int
    items_written: int
    files_written: int
    chunks_referenced: int
    bytes_referenced: int
    unique_bytes: int
    plan_cache_hit: bool
    file_recycled: bool
    plan_seconds: float
    write_seconds: float
    commit_seconds: float
    total_seconds: float
    call_seconds: float  # set by hyperdcp's save: the whole call as the caller waited
    python_seconds: float  # the Python side's share of call_seconds

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
    peak_broadcast_buffer_bytes: int  # broadcast buffers held at once (max_broadcast_buffer_bytes)
    warnings: List[str]  # values saved per rank of which this rank got another rank's
    metadata_seconds: float
    plan_seconds: float
    exchange_seconds: float
    shared_seconds: float
    private_seconds: float
    read_seconds: float
    total_seconds: float
    call_seconds: float  # set by hyperdcp's load: the whole call as the caller waited
    python_seconds: float  # the Python side's share of call_seconds
    step: int  # manager loads: the step loaded
    fell_back: str  # manager loads: why newer steps were passed over
    damaged_copies: List[str]  # memory tier: every damaged copy found, "host H: step N, FILE: why"
    from_memory: bool  # manager loads with a memory tier: from the hosts' memory
    files_from_peers: int  # data files copied to this rank's host from a partner's memory
    # before the load (what its ranks read themselves: bytes entries); chunks read on another
    # host and broadcast count in bytes_received
    files_from_storage: int  # ... and from the root (files no tier held)

def save(state_dict: StateDict, dir: str, comm: Comm, use_collectives: bool,
         step: int = 0, incremental_base: str = "") -> SaveResult: ...
def load(state_dict: StateDict, dir: str, comm: Comm, broadcast: bool, allow_partial: bool,
         strip_prefix: str, add_prefix: str, verify_checksums: bool = True,
         max_open_files: int = 8, broadcast_cached: bool = False,
         max_broadcast_buffer_bytes: int = 256 << 20) -> LoadResult: ...
def unlock(path: str) -> List[str]: ...

def object_store_requests() -> int: ...

class HfSaveResult:
    files_written: int
    bytes_written: int
    total_bytes: int
    tensors: int
    total_seconds: float
    call_seconds: float  # set by hyperdcp's save: the whole call as the caller waited
    python_seconds: float  # the Python side's share of call_seconds

def save_torch_hf(state_dict: StateDict, dir: str, comm: Comm,
                  fqn_to_index: List[Tuple[str, int]], save_distributed: bool,
                  consolidate_into: str) -> HfSaveResult: ...

class StagingStats:
    bytes_staged: int
    bytes_allocated: int
    reused: bool
    allocations: int
    pool_bytes: int
    pool_allocations: int
    threads: int
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
    def __init__(self, max_staging_bytes: int = 0, staging_threads: int = 0,
                 persist_nice: int = 10) -> None: ...
    def save(self, state_dict: StateDict, dir: str, comm: Comm,
             use_collectives: bool, step: int = 0, incremental_base: str = "") -> AsyncSave: ...
    def fail(self, dir: str, comm: Comm, use_collectives: bool, code: str,
             message: str) -> AsyncSave: ...
    def prepare(self, state_dict: StateDict, comm: Comm) -> None: ...
    def close(self) -> None: ...

class MemoryTierOptions:
    dir: str
    replicas: int
    keep_last: int
    max_bytes: int
    persist_every: int
    persist_at_exit: bool
    replication_bytes_per_second: int
    def __init__(self) -> None: ...

class CheckpointManager:
    def __init__(self, root: str, keep_last: Optional[int], keep_every: Optional[int],
                 comm: Comm, recycle_files: bool, allow_partial: bool, verify_checksums: bool,
                 max_open_files: int, max_staging_bytes: int, staging_threads: int,
                 persist_nice: int, memory_tier: Optional[MemoryTierOptions],
                 lock_lease_seconds: float, break_lock: bool, incremental: bool = False,
                 full_every: int = 10) -> None: ...
    def save(self, step: int, state_dict: StateDict) -> SaveResult: ...
    def async_save(self, step: int, state_dict: StateDict) -> None: ...
    def prepare_async_save(self, state_dict: StateDict) -> None: ...
    def wait(self) -> None: ...
    def latest_step(self) -> Optional[int]: ...
    def steps(self) -> List[int]: ...
    def memory_steps(self) -> List[int]: ...
    def persist(self) -> None: ...
    def load(self, state_dict: StateDict, step: Optional[int]) -> LoadResult: ...
    def keep(self, step: int) -> None: ...
    def prune(self, dry_run: bool) -> List[int]: ...
    def step_dir(self, step: int) -> str: ...
    def close(self) -> None: ...

def steps_to_remove(steps: List[int], latest: Optional[int], keep_last: Optional[int],
                    keep_every: Optional[int], keeps: List[int]) -> List[int]: ...

def read_metadata(dir: str) -> Dict[str, Any]: ...

class TensorSignatures:  # a reused preparation's one-pass check (python/src/reuse_bindings.cc)
    def __init__(self, kinds: List[type], specs: List[Any], ptrs: List[int],
                 data_ptr_fn: int) -> None: ...
    def match(self, leaves: List[Any]) -> Optional[List[Any]]: ...
