// StateDict, save, load and async save for Python. Tensors arrive as raw host pointers: the
// Python side (dcp/_checkpoint.py) keeps their owners alive for the duration of the call.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bindings.h"
#include "dcp/async.h"
#include "dcp/checkpoint.h"
#include "dcp/convert.h"
#include "dcp/state_dict.h"

namespace py = pybind11;

namespace dcp::python {
namespace {

Shape ToShape(const std::vector<int64_t>& v, std::string_view what, std::string_view fqn) {
  if (v.size() > static_cast<size_t>(kMaxDims)) {
    throw Error(InvalidArgument("'" + std::string(fqn) + "': " + std::string(what) + " has " +
                                std::to_string(v.size()) + " dimensions, more than " +
                                std::to_string(kMaxDims)));
  }
  Shape s;
  for (int64_t x : v) s.push_back(x);
  return s;
}

void AddTensor(StateDict& sd, const std::string& fqn, uintptr_t data, const std::string& dtype,
               const std::vector<int64_t>& shape, const std::vector<int64_t>& global_shape,
               const std::vector<int64_t>& offsets) {
  std::optional<DType> t = ParseDType(dtype);
  if (!t) throw Error(InvalidArgument("'" + fqn + "': unknown dtype " + dtype));
  TensorView view(reinterpret_cast<void*>(data), *t, ToShape(shape, "shape", fqn));
  sd.add(fqn, view,
         Chunk{ToShape(global_shape, "global shape", fqn), ToShape(offsets, "offsets", fqn)});
}

// Owns an AsyncSaver whose destruction waits, with the GIL released, for the persisting
// thread (which takes the GIL to communicate).
class Saver {
 public:
  explicit Saver(AsyncSaverOptions opts = {}) : opts_(opts) {}
  AsyncSave Save(const StateDict& sd, const std::string& dir, std::shared_ptr<Comm> comm,
                 bool use_collectives, uint64_t step, const std::string& incremental_base) {
    SaveOptions opts;
    opts.comm = std::move(comm);
    opts.use_collectives = use_collectives;
    opts.step = step;
    opts.incremental_base = incremental_base;
    py::gil_scoped_release release;
    if (!saver_) saver_ = std::make_unique<AsyncSaver>(opts_);
    return saver_->Save(sd, dir, opts);
  }
  // In place of Save on a rank whose preparation failed: its peers' saves fail naming it.
  AsyncSave Fail(const std::string& dir, std::shared_ptr<Comm> comm, bool use_collectives,
                 const std::string& code, const std::string& message) {
    SaveOptions opts;
    opts.comm = std::move(comm);
    opts.use_collectives = use_collectives;
    StatusCode c = StatusCode::kInvalidArgument;
    for (int i = 1; i <= static_cast<int>(StatusCode::kInternal); ++i) {
      if (StatusCodeName(static_cast<StatusCode>(i)) == code) c = static_cast<StatusCode>(i);
    }
    py::gil_scoped_release release;
    if (!saver_) saver_ = std::make_unique<AsyncSaver>(opts_);
    return saver_->Fail(dir, Status(c, message), opts);
  }
  void Prepare(const StateDict& sd, std::shared_ptr<Comm> comm) {
    SaveOptions opts;
    opts.comm = std::move(comm);
    py::gil_scoped_release release;
    if (!saver_) saver_ = std::make_unique<AsyncSaver>(opts_);
    saver_->Prepare(sd, opts);
  }
  void Close() {
    py::gil_scoped_release release;
    saver_.reset();
  }
  ~Saver() { Close(); }

 private:
  AsyncSaverOptions opts_;
  std::unique_ptr<AsyncSaver> saver_;
};

template <typename T>
std::string Repr(const char* name, const T& fields) {
  std::string s = std::string(name) + "(";
  for (size_t i = 0; i < fields.size(); ++i) {
    s += (i ? ", " : "") + fields[i];
  }
  return s + ")";
}

}  // namespace

void BindCheckpoint(py::module_& m) {
  py::class_<StateDict>(m, "StateDict",
                        "Entries over caller memory; the caller keeps it alive while in use.")
      .def(py::init<>())
      .def("add_tensor", &AddTensor, py::arg("fqn"), py::arg("data_ptr"), py::arg("dtype"),
           py::arg("shape"), py::arg("global_shape"), py::arg("offsets"),
           "One chunk of `fqn`: row-major host memory at data_ptr holding `shape` elements "
           "at `offsets` of a tensor of `global_shape`; dtype as in safetensors (\"BF16\").")
      .def(
          "add_bytes",
          [](StateDict& sd, const std::string& fqn, const py::bytes& b) {
            sd.add_bytes(fqn, std::string_view(b));
          },
          py::arg("fqn"), py::arg("data") = py::bytes())
      .def(
          "bytes_of",
          [](const StateDict& sd, const std::string& fqn) -> std::optional<py::bytes> {
            const StateEntry* e = sd.find(fqn);
            if (!e || e->kind != StateEntry::Kind::kBytes) return std::nullopt;
            return py::bytes(reinterpret_cast<const char*>(e->bytes.data()), e->bytes.size());
          },
          py::arg("fqn"), "A bytes entry's payload (after load: the saved one), or None.")
      .def(
          "set_paths",
          [](StateDict& sd, const std::vector<std::string>& fqns,
             const std::vector<py::bytes>& paths) {
            if (fqns.size() != paths.size()) {
              throw Error(InvalidArgument("set_paths: as many paths as names are needed"));
            }
            for (size_t i = 0; i < fqns.size(); ++i) sd.set_path(fqns[i], std::string(paths[i]));
          },
          py::arg("fqns"), py::arg("paths"),
          "Records each entry's nesting path (opaque bytes) for the metadata.")
      .def("__len__", &StateDict::size);

  py::class_<SaveResult>(m, "SaveResult", py::dynamic_attr(), "What a save did on this rank.")
      .def_readonly("bytes_written", &SaveResult::bytes_written)
      .def_readonly("items_written", &SaveResult::items_written)
      .def_readonly("files_written", &SaveResult::files_written)
      .def_readonly("chunks_referenced", &SaveResult::chunks_referenced)
      .def_readonly("bytes_referenced", &SaveResult::bytes_referenced)
      .def_readonly("unique_bytes", &SaveResult::unique_bytes)
      .def_readonly("plan_cache_hit", &SaveResult::plan_cache_hit)
      .def_readonly("file_recycled", &SaveResult::file_recycled)
      .def_readonly("plan_seconds", &SaveResult::plan_seconds)
      .def_readonly("write_seconds", &SaveResult::write_seconds)
      .def_readonly("commit_seconds", &SaveResult::commit_seconds)
      .def_readonly("total_seconds", &SaveResult::total_seconds)
      .def("__repr__", [](const SaveResult& r) {
        return Repr("SaveResult",
                    std::vector<std::string>{"bytes_written=" + std::to_string(r.bytes_written),
                                             "files_written=" + std::to_string(r.files_written),
                                             "total_seconds=" + std::to_string(r.total_seconds)});
      });

  py::class_<LoadResult>(m, "LoadResult", py::dynamic_attr(), "What a load did on this rank.")
      .def_readonly("bytes_read", &LoadResult::bytes_read)
      .def_readonly("files_opened", &LoadResult::files_opened)
      .def_readonly("warnings", &LoadResult::warnings)
      .def_readonly("chunks_read", &LoadResult::chunks_read)
      .def_readonly("entries_loaded", &LoadResult::entries_loaded)
      .def_readonly("entries_skipped", &LoadResult::entries_skipped)
      .def_readonly("shared_shards", &LoadResult::shared_shards)
      .def_readonly("shards_read_for_others", &LoadResult::shards_read_for_others)
      .def_readonly("shared_chunks", &LoadResult::shared_chunks)
      .def_readonly("broadcasts", &LoadResult::broadcasts)
      .def_readonly("batches", &LoadResult::batches)
      .def_readonly("bytes_sent", &LoadResult::bytes_sent)
      .def_readonly("bytes_received", &LoadResult::bytes_received)
      .def_readonly("peak_broadcast_buffer_bytes", &LoadResult::peak_broadcast_buffer_bytes)
      .def_readonly("groups_created", &LoadResult::groups_created)
      .def_readonly("metadata_seconds", &LoadResult::metadata_seconds)
      .def_readonly("plan_seconds", &LoadResult::plan_seconds)
      .def_readonly("exchange_seconds", &LoadResult::exchange_seconds)
      .def_readonly("shared_seconds", &LoadResult::shared_seconds)
      .def_readonly("private_seconds", &LoadResult::private_seconds)
      .def_readonly("read_seconds", &LoadResult::read_seconds)
      .def_readonly("total_seconds", &LoadResult::total_seconds)
      .def_readonly("step", &LoadResult::step)
      .def_readonly("fell_back", &LoadResult::fell_back)
      .def_readonly("damaged_copies", &LoadResult::damaged_copies)
      .def_readonly("from_memory", &LoadResult::from_memory)
      .def_readonly("files_from_peers", &LoadResult::files_from_peers)
      .def_readonly("files_from_storage", &LoadResult::files_from_storage)
      .def("__repr__", [](const LoadResult& r) {
        return Repr("LoadResult",
                    std::vector<std::string>{"bytes_read=" + std::to_string(r.bytes_read),
                                             "entries_loaded=" + std::to_string(r.entries_loaded),
                                             "broadcasts=" + std::to_string(r.broadcasts),
                                             "total_seconds=" + std::to_string(r.total_seconds)});
      });

  m.def(
      "save",
      [](const StateDict& sd, const std::string& dir, std::shared_ptr<Comm> comm,
         bool use_collectives, uint64_t step, const std::string& incremental_base) {
        SaveOptions opts;
        opts.comm = std::move(comm);
        opts.use_collectives = use_collectives;
        opts.step = step;
        opts.incremental_base = incremental_base;
        py::gil_scoped_release release;
        return save(sd, dir, opts);
      },
      py::arg("state_dict"), py::arg("dir"), py::arg("comm"), py::arg("use_collectives"),
      py::arg("step") = 0, py::arg("incremental_base") = "");

  py::class_<TorchHfSaveResult>(m, "HfSaveResult", py::dynamic_attr(),
                                "What a save in torch's HuggingFace layout did on this rank.")
      .def_readonly("files_written", &TorchHfSaveResult::files)
      .def_readonly("bytes_written", &TorchHfSaveResult::bytes)
      .def_readonly("total_bytes", &TorchHfSaveResult::total_bytes)
      .def_readonly("tensors", &TorchHfSaveResult::tensors)
      .def_readonly("total_seconds", &TorchHfSaveResult::seconds)
      .def("__repr__", [](const TorchHfSaveResult& r) {
        return Repr("HfSaveResult",
                    std::vector<std::string>{"files_written=" + std::to_string(r.files),
                                             "bytes_written=" + std::to_string(r.bytes),
                                             "total_seconds=" + std::to_string(r.seconds)});
      });

  m.def("object_store_requests", &object_store_requests,
        "Requests this process's object-store client has sent so far.");

  m.def(
      "save_torch_hf",
      [](const StateDict& sd, const std::string& dir, std::shared_ptr<Comm> comm,
         std::vector<std::pair<std::string, int>> fqn_to_index, bool save_distributed,
         std::string consolidate_into) {
        TorchHfSaveOptions opts;
        opts.comm = std::move(comm);
        opts.fqn_to_index = std::move(fqn_to_index);
        opts.save_distributed = save_distributed;
        opts.consolidate_into = std::move(consolidate_into);
        py::gil_scoped_release release;
        return save_torch_hf(sd, dir, opts);
      },
      py::arg("state_dict"), py::arg("dir"), py::arg("comm"), py::arg("fqn_to_index"),
      py::arg("save_distributed"), py::arg("consolidate_into"));

  m.def(
      "load",
      [](StateDict& sd, const std::string& dir, std::shared_ptr<Comm> comm, bool broadcast,
         bool allow_partial, std::string strip_prefix, std::string add_prefix,
         bool verify_checksums, int max_open_files, bool broadcast_cached,
         uint64_t max_broadcast_buffer_bytes) {
        LoadOptions opts;
        opts.broadcast_cached = broadcast_cached;
        opts.verify_checksums = verify_checksums;
        opts.max_open_files = max_open_files;
        opts.max_broadcast_buffer_bytes = max_broadcast_buffer_bytes;
        opts.comm = std::move(comm);
        opts.broadcast = broadcast;
        opts.allow_partial = allow_partial;
        opts.strip_prefix = std::move(strip_prefix);
        opts.add_prefix = std::move(add_prefix);
        py::gil_scoped_release release;
        return load(sd, dir, opts);
      },
      py::arg("state_dict"), py::arg("dir"), py::arg("comm"), py::arg("broadcast"),
      py::arg("allow_partial"), py::arg("strip_prefix"), py::arg("add_prefix"),
      py::arg("verify_checksums") = true, py::arg("max_open_files") = 8,
      py::arg("broadcast_cached") = false,
      py::arg("max_broadcast_buffer_bytes") = LoadOptions{}.max_broadcast_buffer_bytes);

  py::class_<StagingStats>(m, "StagingStats")
      .def_readonly("bytes_staged", &StagingStats::bytes_staged)
      .def_readonly("bytes_allocated", &StagingStats::bytes_allocated)
      .def_readonly("reused", &StagingStats::reused)
      .def_readonly("allocations", &StagingStats::allocations)
      .def_readonly("pool_bytes", &StagingStats::pool_bytes)
      .def_readonly("pool_allocations", &StagingStats::pool_allocations)
      .def_readonly("threads", &StagingStats::threads)
      .def_readonly("wait_seconds", &StagingStats::wait_seconds)
      .def_readonly("copy_seconds", &StagingStats::copy_seconds)
      .def_readonly("blocked_seconds", &StagingStats::blocked_seconds);

  py::class_<AsyncSave>(m, "AsyncSave", "The engine's handle of one asynchronous save.")
      .def("done", &AsyncSave::Poll)
      .def(
          "wait",
          [](const AsyncSave& h, std::optional<double> timeout_s) {
            py::gil_scoped_release release;
            if (!timeout_s) {
              h.Wait();
              return true;
            }
            return h.Wait(std::chrono::milliseconds(static_cast<int64_t>(*timeout_s * 1000)));
          },
          py::arg("timeout_s") = py::none(), "True once the save finished.")
      .def(
          "get",
          [](const AsyncSave& h) {
            py::gil_scoped_release release;
            return h.Get();
          },
          "Waits; the SaveResult, or raises the save's DcpError.")
      .def_property_readonly("staging", &AsyncSave::staging)
      .def_property_readonly("dir", &AsyncSave::dir);

  py::class_<Saver>(m, "AsyncSaver", "Owns the staging pool and the persisting thread.")
      .def(
          py::init([](uint64_t max_staging_bytes, int staging_threads, int persist_nice) {
            return std::make_unique<Saver>(AsyncSaverOptions{.max_staging_bytes = max_staging_bytes,
                                                             .staging_threads = staging_threads,
                                                             .persist_nice = persist_nice});
          }),
          py::arg("max_staging_bytes") = 0, py::arg("staging_threads") = 0,
          py::arg("persist_nice") = 10)
      .def("save", &Saver::Save, py::arg("state_dict"), py::arg("dir"), py::arg("comm"),
           py::arg("use_collectives"), py::arg("step") = 0, py::arg("incremental_base") = "")
      .def("fail", &Saver::Fail, py::arg("dir"), py::arg("comm"), py::arg("use_collectives"),
           py::arg("code"), py::arg("message"),
           "In place of save on a rank whose preparation failed: every rank's save fails with "
           "this rank's error instead of waiting for it.")
      .def("prepare", &Saver::Prepare, py::arg("state_dict"), py::arg("comm"),
           "Allocates and pre-faults staging memory for the state dict, ahead of the first save.")
      .def("close", &Saver::Close, "Waits for pending saves, then stops the thread.");
}

}  // namespace dcp::python
