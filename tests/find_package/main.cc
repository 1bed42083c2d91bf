// Saves and loads a small tensor through an installed dcp; exits 0 when the bytes match.
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "dcp/async.h"
#include "dcp/checkpoint.h"
#include "dcp/convert.h"
#include "dcp/format.h"
#include "dcp/manager.h"
#include "dcp/state_dict.h"
#include "dcp/status.h"
#ifdef DCP_WITH_MPI
#include "dcp/mpi_comm.h"  // compiles against the installed headers and MPI
#endif

int main() {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("dcp_find_package_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  int rc = 1;
  try {
    std::vector<float> saved(3 * 5);
    for (size_t i = 0; i < saved.size(); ++i) saved[i] = 0.5f * static_cast<float>(i) - 3.0f;
    dcp::StateDict out;
    out.add("w", dcp::TensorView(saved.data(), dcp::DType::kF32, dcp::Shape{3, 5}));
    dcp::save(out, (dir / "ckpt").string());

    std::vector<float> loaded(saved.size(), -1.0f);
    dcp::StateDict in;
    in.add("w", dcp::TensorView(loaded.data(), dcp::DType::kF32, dcp::Shape{3, 5}));
    dcp::load(in, (dir / "ckpt").string());

    // The inspection calls of the public API: metadata without loading, and verify.
    const dcp::Metadata md = dcp::read_metadata((dir / "ckpt").string());
    const dcp::VerifyResult v = dcp::verify((dir / "ckpt").string());
    const bool described = md.tensors.size() == 1 && md.tensors[0].fqn == "w" &&
                           md.tensors[0].global_shape == dcp::Shape{3, 5} &&
                           v.bytes_checked == saved.size() * sizeof(float);
    // One call into each other public header's library code: async save, the manager,
    // conversion to HuggingFace, formatting.
    dcp::AsyncSaver saver;
    saver.Save(out, (dir / "async").string()).Get();
    dcp::CheckpointManager manager((dir / "root").string(), dcp::RetentionPolicy{});
    manager.Save(7, out);
    const dcp::DcpToHfResult hf =
        dcp::convert_dcp_to_hf((dir / "ckpt").string(), (dir / "hf").string());
    const bool others = manager.latest_step() == 7 && hf.total_tensors == 1 &&
                        dcp::HumanBytes(1536) == "1.5 KiB" && dcp::ParseByteSize("2KiB").ok() &&
                        *dcp::ParseByteSize("2KiB") == 2048;
    if (!described) {
      std::fprintf(stderr, "dcp find_package consumer: read_metadata/verify disagree\n");
    } else if (!others) {
      std::fprintf(stderr, "dcp find_package consumer: async/manager/convert/format disagree\n");
    } else if (std::memcmp(saved.data(), loaded.data(), saved.size() * sizeof(float)) == 0) {
      std::printf("dcp find_package consumer: ok\n");
      rc = 0;
    } else {
      std::fprintf(stderr, "dcp find_package consumer: loaded bytes differ\n");
    }
  } catch (const dcp::Error& e) {
    std::fprintf(stderr, "dcp find_package consumer: %s\n", e.what());
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
  return rc;
}
