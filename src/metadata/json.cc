// The views of a Metadata that `dcp inspect` prints (declared in dcp/metadata.h).
#include <algorithm>
#include <cstdio>
#include <iterator>
#include <nlohmann/json.hpp>

#include "dcp/format.h"
#include "dcp/metadata.h"
#include "metadata/metadata.h"

namespace dcp {
namespace {

nlohmann::json ShapeToJson(const Shape& s) {
  nlohmann::json out = nlohmann::json::array();
  for (int64_t d : s) out.push_back(d);
  return out;
}

uint64_t TotalFileBytes(const Metadata& md) {
  uint64_t n = 0;
  for (const auto& f : md.files) n += f.size;
  return n;
}

uint64_t TensorBytes(const TensorMeta& t) {
  uint64_t n = 0;
  for (const auto& c : t.chunks) n += c.byte_length;
  return n;
}

// The file for an index, as "../<base>/<name>" when it lies in a base's directory; the decoder
// guarantees the index is in range, but a Metadata built in memory may not have gone through it.
std::string FileName(const Metadata& md, uint32_t file) {
  if (file >= md.files.size()) return "<missing file>";
  const FileInfo& f = md.files[file];
  return f.base.empty() ? f.name : "../" + f.base + "/" + f.name;
}

// The name of file `file` as files[] lists it (its directory, when a base's, is a key of its own).
std::string FileEntryName(const Metadata& md, uint32_t file) {
  return file < md.files.size() ? md.files[file].name : "<missing file>";
}

nlohmann::json ToJson(const Metadata& md) {
  nlohmann::json files = nlohmann::json::array();
  uint64_t referenced = 0;
  for (const auto& f : md.files) {
    nlohmann::json file = {{"name", f.name}, {"size", f.size}};
    if (!f.base.empty()) {
      file["base"] = f.base;
      referenced += f.size;
    }
    files.push_back(std::move(file));
  }

  nlohmann::json tensors = nlohmann::json::array();
  for (const auto& t : md.tensors) {
    nlohmann::json chunks = nlohmann::json::array();
    for (const auto& c : t.chunks) {
      nlohmann::json chunk = {
          {"offsets", ShapeToJson(c.box.offsets)}, {"lengths", ShapeToJson(c.box.lengths)},
          {"file", FileEntryName(md, c.file)},     {"byte_offset", c.byte_offset},
          {"byte_length", c.byte_length},          {"xxh3", Hex16(c.xxh3)}};
      if (c.file < md.files.size() && !md.files[c.file].base.empty()) {
        chunk["base"] = md.files[c.file].base;
      }
      if (!c.block_xxh3.empty()) {
        nlohmann::json blocks = nlohmann::json::array();
        for (uint64_t h : c.block_xxh3) blocks.push_back(Hex16(h));
        chunk["block_xxh3"] = std::move(blocks);
      }
      chunks.push_back(std::move(chunk));
    }
    nlohmann::json tensor = {{"fqn", t.fqn},
                             {"dtype", std::string(DTypeName(t.dtype))},
                             {"shape", ShapeToJson(t.global_shape)},
                             {"chunks", std::move(chunks)}};
    if (!t.path.empty()) tensor["path"] = t.path;
    tensors.push_back(std::move(tensor));
  }

  nlohmann::json bytes = nlohmann::json::array();
  for (const auto& b : md.bytes) {
    nlohmann::json entry = {{"fqn", b.fqn},
                            {"file", FileEntryName(md, b.file)},
                            {"byte_offset", b.byte_offset},
                            {"byte_length", b.byte_length},
                            {"xxh3", Hex16(b.xxh3)}};
    if (!b.path.empty()) entry["path"] = b.path;
    if (b.file < md.files.size() && !md.files[b.file].base.empty()) {
      entry["base"] = md.files[b.file].base;
    }
    bytes.push_back(std::move(entry));
  }

  return {{"format_version", metadata::VersionFor(md)},
          {"save_id", Hex16(md.save_id)},
          {"world_size", md.world_size},
          {"block_size", md.block_size},
          {"files", std::move(files)},
          {"tensors", std::move(tensors)},
          {"bytes", std::move(bytes)},
          {"totals",
           {{"tensors", md.tensors.size()},
            {"chunks", md.TotalChunks()},
            {"bytes_entries", md.bytes.size()},
            {"files", md.files.size()},
            {"data_bytes", md.TotalDataBytes()},
            {"file_bytes", TotalFileBytes(md)},
            {"referenced_file_bytes", referenced}}}};
}

}  // namespace

std::string MetadataToJson(const Metadata& md, int indent) {
  // Paths are opaque bytes: anything not UTF-8 is replaced rather than thrown on.
  return ToJson(md).dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string MetadataSummary(const Metadata& md, bool list_chunks) {
  // Names are padded to a common width (capped, so one long name does not push every line).
  size_t width = 0;
  for (const auto& t : md.tensors) width = std::max(width, t.fqn.size());
  for (const auto& b : md.bytes) width = std::max(width, b.fqn.size());
  width = std::min<size_t>(width, 60);
  auto padded = [width](const std::string& s) {
    return s.size() >= width ? s : s + std::string(width - s.size(), ' ');
  };

  // A HuggingFace source has no save id, format version or checksums: say what it is instead.
  std::string out =
      !md.has_checksums
          ? std::string("HuggingFace source: no checksums, sizes checked\n")
          : "save " + Hex16(md.save_id) + ", format version " +
                std::to_string(metadata::VersionFor(md)) + ", written by " +
                std::to_string(md.world_size) + (md.world_size == 1 ? " rank" : " ranks") +
                (md.block_size ? ", checksums per " + HumanBytes(md.block_size) + " block\n"
                               : std::string("\n"));
  if (!md.tensors.empty()) out += "tensors:\n";
  for (const auto& t : md.tensors) {
    const size_t n = t.chunks.size();
    out += "  " + padded(t.fqn) + "  " + std::string(DTypeName(t.dtype)) + " " +
           t.global_shape.ToString() + "  " + std::to_string(n) +
           (n == 1 ? " chunk  " : " chunks  ") + HumanBytes(TensorBytes(t)) +
           (t.path.empty() ? "" : "  path " + t.path) + "\n";
    if (!list_chunks) continue;
    for (const auto& c : t.chunks) {
      out += "    " + c.box.ToString() + "  " + FileName(md, c.file) + " @" +
             std::to_string(c.byte_offset) + " +" + std::to_string(c.byte_length) + "  xxh3 " +
             Hex16(c.xxh3) + "\n";
    }
  }
  if (!md.bytes.empty()) out += "bytes entries:\n";
  for (const auto& b : md.bytes) {
    out += "  " + padded(b.fqn) + "  " + HumanBytes(b.byte_length);
    if (!b.path.empty()) out += "  path " + b.path;
    if (list_chunks) {
      out += "  " + FileName(md, b.file) + " @" + std::to_string(b.byte_offset) + " +" +
             std::to_string(b.byte_length) + "  xxh3 " + Hex16(b.xxh3);
    }
    out += "\n";
  }
  out += "totals: " + std::to_string(md.tensors.size()) + " tensors, " +
         std::to_string(md.TotalChunks()) + " chunks, " + std::to_string(md.bytes.size()) +
         " bytes entries, " + std::to_string(md.files.size()) + " files, " +
         HumanBytes(md.TotalDataBytes()) + " of data in " + HumanBytes(TotalFileBytes(md)) +
         " of files\n";
  // An incremental checkpoint: what it leaves in its bases' directories.
  std::vector<std::string> bases;
  uint64_t files = 0, bytes = 0;
  for (const auto& f : md.files) {
    if (f.base.empty()) continue;
    ++files;
    bytes += f.size;
    if (std::find(bases.begin(), bases.end(), f.base) == bases.end()) bases.push_back(f.base);
  }
  if (files > 0) {
    std::sort(bases.begin(), bases.end());
    std::string names;
    for (const auto& b : bases) names += (names.empty() ? "" : ", ") + b;
    out += "references: " + std::to_string(files) + (files == 1 ? " file" : " files") + " (" +
           HumanBytes(bytes) + ") in the base " +
           (bases.size() == 1 ? "directory " : "directories ") + names + "\n";
  }
  return out;
}

}  // namespace dcp
