#include "checkpoint/torch_probe.h"

#include <cstdio>

namespace dcp::checkpoint {

// Pickle protocol 2: PROTO 2, GLOBAL "<module>\n<name>\n", STOP. The module name may hold any
// character but a newline; dots are left out, since an import splits the name at them.
std::string_view TorchProbeBytes() {
  static constexpr std::string_view kBytes =
      "\x80\x02"
      "c"
      "hyperdcp checkpoint: this directory is in hyperdcp's format, not torch DCP's; read it "
      "with the hyperdcp package (import hyperdcp as dcp), or call hyperdcp's install() first "
      "so that torch's readers serve it, or convert it with hyperdcp's to_torch_dcp\n"
      "checkpoint\n"
      ".";
  return kBytes;
}

Status WriteTorchProbe(storage::FileSystem& fs, const std::string& dir,
                       const std::string& tmp_suffix) {
  const std::string path = storage::JoinPath(dir, std::string(kTorchProbeName));
  // One already there is kept on a file system (reading it costs less than a write, a sync and
  // a rename); on an object store the write is one request, fewer than checking first.
  if (!fs.IsObjectStore()) {
    auto size = fs.FileSize(path);
    if (size.ok() && *size == TorchProbeBytes().size()) {
      auto old = storage::ReadWholeFile(fs, path);
      if (old.ok() && *old == TorchProbeBytes()) return OkStatus();
    }
  }
  return fs.WriteAtomic(path, TorchProbeBytes(), tmp_suffix)
      .Annotate(std::string(kTorchProbeName) + ": ");
}

void PublishTorchProbe(storage::FileSystem& fs, const std::string& dir,
                       const std::string& tmp_suffix) {
  if (Status st = WriteTorchProbe(fs, dir, tmp_suffix); !st.ok()) {
    std::fprintf(stderr,
                 "dcp: checkpoint %s is committed, but its %s for frameworks' probes "
                 "could not be written: %s\n",
                 dir.c_str(), std::string(kTorchProbeName).c_str(), st.message().c_str());
  }
}

}  // namespace dcp::checkpoint
