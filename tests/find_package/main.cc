// Saves and loads a small tensor through an installed dcp; exits 0 when the bytes match.
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "dcp/checkpoint.h"
#include "dcp/state_dict.h"
#include "dcp/status.h"

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
    if (!described) {
      std::fprintf(stderr, "dcp find_package consumer: read_metadata/verify disagree\n");
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
