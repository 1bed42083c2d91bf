// Options of the checkpoint manager's memory tier (dcp/manager.h, ManagerOptions).
#pragma once

#include <cstdint>
#include <string>

namespace dcp {

// The memory tier (docs/memory-tier.md): recent steps kept in each
// host's memory and on partner hosts, drained to the root now and then, restored from what
// survives onto any layout.
struct MemoryTierOptions {
  // The base directory on every host, in memory (tmpfs). A root's tier on a host is
  // DIR/<key of the root>/<host name>/step_.../ (ordinary dcp checkpoint directories holding
  // the files of that host's ranks, those replicated to it, and the metadata).
  std::string dir = "/dev/shm/dcp-tier";
  // Partner hosts that receive a copy of each host's files (the next ones in host name order).
  int replicas = 1;
  // Steps each host keeps in memory, the one being saved included (at least 1).
  int64_t keep_last = 2;
  // Bytes of tier data per host (own files and replicas); a step whose files would exceed it
  // is not put in memory (a warning; it is saved to the root instead). 0: no limit.
  uint64_t max_bytes = 0;
  // A step that is a multiple of it is also written to the root (drained from memory, in the
  // background); 0: only by Persist() and at the manager's end.
  int64_t persist_every = 1;
  // Drain the newest step to the root when the manager ends, if it is not there yet.
  bool persist_at_exit = true;
  // Replication pace per rank (bytes per second); 0: unpaced.
  uint64_t replication_bytes_per_second = 0;
};

}  // namespace dcp
