// Copying a committed checkpoint into a sibling of a base checkpoint, incrementally: a stored
// chunk whose recorded checksums equal the base's chunk of the same fqn, dtype and box becomes
// a reference to the base's bytes (docs/format.md, section 9), and each data file keeps only
// the other chunks. Nothing is hashed to decide: both checkpoints recorded their checksums.
// The memory tier's drain into an incremental root uses it (ManagerOptions::incremental).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/incremental.h"
#include "dcp/status.h"
#include "metadata/metadata.h"
#include "storage/file_system.h"

namespace dcp::checkpoint {

// What the copy makes of one data file of the source.
struct FileCopy {
  enum class Kind {
    kWhole,   // nothing in it is referenced: copied as it is
    kSubset,  // a new safetensors file of the chunks not referenced
    kNone,    // every chunk referenced: not copied
  };
  Kind kind = Kind::kWhole;
  std::string name;
  // kSubset: the new file's safetensors header, then the kept chunks of the source (pointers
  // into the source metadata), their bytes one after another in this order.
  std::string header;
  std::vector<const metadata::StoredChunk*> kept;
};

struct IncrementalCopy {
  metadata::Metadata md;        // the copy's: the source's, its chunks moved or referenced
  std::vector<FileCopy> files;  // one per file of the source, in its order
  uint64_t bytes_referenced = 0;
  uint64_t chunks_referenced = 0;
};

// A pure function of its inputs: every rank plans the same copy. `src` must outlive the
// result (FileCopy::kept points into it). A file holding bytes entries is copied whole.
IncrementalCopy PlanIncrementalCopy(const metadata::Metadata& src, const BaseChunks& base);

// Writes the kSubset file `f` (one of plan.files) from the source file of its name in
// `src_dir` into `dst_dir`, durable on return. Every kept byte is checked against its recorded
// checksums on the way: a damaged source is kDataLoss naming it, never a copy.
Status WriteKeptChunks(const FileCopy& f, const metadata::Metadata& src,
                       storage::FileSystem& src_fs, const std::string& src_dir,
                       storage::FileSystem& dst_fs, const std::string& dst_dir);

}  // namespace dcp::checkpoint
