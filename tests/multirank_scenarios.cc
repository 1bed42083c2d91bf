#include "multirank_scenarios.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>

#include "async/async_saver.h"
#include "checkpoint/load.h"
#include "checkpoint/metadata_io.h"
#include "checkpoint/names.h"
#include "checkpoint/save.h"
#include "convert/convert.h"
#include "dcp/async.h"
#include "dcp/checkpoint.h"
#include "testfs/fault_file_system.h"
#include "workload/layout_spec.h"
#include "workload/model.h"
#include "workload/populate.h"

namespace dcp::testing {
namespace {

workload::ModelSpec SmallModel() {
  auto m = workload::MakeModel("qwen3-30b-a3b", 2, 1.0 / 16);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return *m;
}

workload::LayoutSpec Layout(const std::string& s) {
  auto l = workload::ParseLayout(s);
  EXPECT_TRUE(l.ok()) << l.status().ToString();
  return *l;
}

std::vector<uint64_t> GatherU64(Comm& comm, uint64_t v) {
  auto all = comm.AllGather(std::string(reinterpret_cast<const char*>(&v), sizeof v));
  EXPECT_TRUE(all.ok()) << all.status().ToString();
  std::vector<uint64_t> out;
  for (const auto& s : *all) {
    uint64_t x = 0;
    std::memcpy(&x, s.data(), sizeof x);
    out.push_back(x);
  }
  return out;
}

// Loads `ckpt` under `layout` on the first layout.WorldSize() ranks of `comm`.
void LoadAndCheck(const std::shared_ptr<Comm>& comm, const workload::ModelSpec& model,
                  const std::string& ckpt, const std::string& layout_text) {
  SCOPED_TRACE("load layout " + layout_text);
  auto layout = Layout(layout_text);
  const int w = layout.WorldSize();
  ASSERT_LE(w, comm->size());
  if (comm->rank() >= w) return;
  std::vector<int> members(w);
  for (int i = 0; i < w; ++i) members[i] = i;
  auto group = w == comm->size() ? Result<std::shared_ptr<Comm>>(comm) : comm->CreateGroup(members);
  ASSERT_TRUE(group.ok()) << group.status().ToString();
  auto dst = workload::MakeEmptyLike(model, layout, (*group)->rank());
  ASSERT_TRUE(dst.ok()) << dst.status().ToString();
  ASSERT_NO_THROW(load(dst->sd, ckpt, {.comm = *group}));
  Status v = workload::VerifyStateDict(dst->sd);
  EXPECT_TRUE(v.ok()) << v.ToString();
}

}  // namespace

void SaveThenReshard(const std::shared_ptr<Comm>& comm, const std::string& dir,
                     const std::string& save_layout, const std::vector<std::string>& load_layouts) {
  SCOPED_TRACE("save layout " + save_layout);
  const auto model = SmallModel();
  const auto layout = Layout(save_layout);
  ASSERT_EQ(layout.WorldSize(), comm->size());
  auto sd = workload::PopulateStateDict(model, layout, comm->rank());
  ASSERT_TRUE(sd.ok()) << sd.status().ToString();
  const std::string ckpt = dir + "/" + save_layout;

  checkpoint::ClearSavePlanCache();
  SaveResult first, second;
  ASSERT_NO_THROW(first = save(sd->sd, ckpt, {.comm = comm}));
  ASSERT_NO_THROW(second = save(sd->sd, ckpt, {.comm = comm}));
  EXPECT_FALSE(first.plan_cache_hit);
  EXPECT_TRUE(second.plan_cache_hit);

  // Zero redundant bytes: the ranks together wrote exactly the unique bytes.
  auto written = GatherU64(*comm, second.bytes_written);
  uint64_t total = 0;
  for (uint64_t b : written) total += b;
  auto md = checkpoint::ReadMetadata(storage::PosixFileSystem(), ckpt);
  ASSERT_TRUE(md.ok()) << md.status().ToString();
  EXPECT_EQ(total, md->TotalDataBytes());
  uint64_t tensor_bytes = 0, largest = 0;
  for (const auto& t : md->tensors) {
    for (const auto& c : t.chunks) {
      tensor_bytes += c.byte_length;
      largest = std::max(largest, c.byte_length);
    }
  }
  EXPECT_EQ(tensor_bytes, model.TotalBytes());
  EXPECT_EQ(second.unique_bytes, tensor_bytes);
  // Balance: the heaviest writer carries at most the lightest plus the largest chunk.
  auto [lo, hi] = std::minmax_element(written.begin(), written.end());
  EXPECT_LE(*hi, *lo + largest) << "writers unbalanced";

  for (const std::string& l : load_layouts) LoadAndCheck(comm, model, ckpt, l);
  // A world of one reads the whole checkpoint by itself.
  if (comm->rank() == 0) {
    auto whole = workload::MakeEmptyLike(model, Layout("dp1"), 0);
    ASSERT_TRUE(whole.ok());
    ASSERT_NO_THROW(load(whole->sd, ckpt));
    EXPECT_TRUE(workload::VerifyStateDict(whole->sd).ok());
  }
  ASSERT_TRUE(comm->Barrier().ok());
}

void SaveUnevenTensors(const std::shared_ptr<Comm>& comm, const std::string& dir) {
  // [10, 3] split in 4 along dim 0: 3, 3, 3, 1 rows; [3] split in 4: 1, 1, 1, 0 (empty).
  // Ranks r and r+half hold the same piece (replicas); each piece index is r % 4.
  const int n = comm->size(), r = comm->rank();
  const int parts = std::max(1, n / 2 * 2 == n ? n / 2 : n);
  const int piece = r % parts;
  auto rows = [&](int64_t extent) {
    int64_t size = (extent + parts - 1) / parts;
    int64_t lo = std::min(extent, piece * size);
    return std::pair<int64_t, int64_t>{lo, std::min(extent, lo + size) - lo};
  };
  auto [o1, l1] = rows(10);
  auto [o2, l2] = rows(3);
  std::vector<float> a(static_cast<size_t>(l1 * 3)), b(static_cast<size_t>(l2));
  for (int64_t i = 0; i < l1 * 3; ++i) a[i] = static_cast<float>(o1 * 3 + i);
  for (int64_t i = 0; i < l2; ++i) b[i] = static_cast<float>(100 + o2 + i);
  StateDict sd;
  sd.add("a", TensorView(a.data(), DType::kF32, {l1, 3}), Chunk{{10, 3}, {o1, 0}});
  sd.add("b", TensorView(b.data(), DType::kF32, {l2}), Chunk{{3}, {o2}});
  const std::string ckpt = dir + "/uneven";
  ASSERT_NO_THROW(save(sd, ckpt, {.comm = comm}));
  if (r == 0) {
    std::vector<float> wa(30), wb(3);
    StateDict whole;
    whole.add("a", TensorView(wa.data(), DType::kF32, {10, 3}));
    whole.add("b", TensorView(wb.data(), DType::kF32, {3}));
    ASSERT_NO_THROW(load(whole, ckpt));
    for (int i = 0; i < 30; ++i) EXPECT_EQ(wa[i], static_cast<float>(i));
    for (int i = 0; i < 3; ++i) EXPECT_EQ(wb[i], static_cast<float>(100 + i));
  }
  ASSERT_TRUE(comm->Barrier().ok());
}

void OneRankFailsToWrite(const std::shared_ptr<Comm>& comm, const std::string& dir, int failing) {
  const auto model = SmallModel();
  const auto layout = Layout("dp" + std::to_string(comm->size()));
  auto sd = workload::PopulateStateDict(model, layout, comm->rank());
  ASSERT_TRUE(sd.ok());
  const std::string ckpt = dir + "/failing";
  ASSERT_NO_THROW(save(sd->sd, ckpt, {.comm = comm}));
  auto before = checkpoint::ReadMetadata(storage::PosixFileSystem(), ckpt);
  ASSERT_TRUE(before.ok());
  ASSERT_TRUE(comm->Barrier().ok());

  // Op 0 is the directory creation, op 1 the data file's creation: fail each in turn.
  for (int64_t fail_at : {0, 1, 3}) {
    SCOPED_TRACE("failing at op " + std::to_string(fail_at));
    testfs::FaultFileSystem fs(storage::PosixFileSystem());
    if (comm->rank() == failing) fs.FailAt(fail_at);
    auto r = checkpoint::Save(sd->sd, ckpt, {.comm = comm}, fs);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("rank " + std::to_string(failing) + ":"), std::string::npos)
        << r.status().message();
    EXPECT_NE(r.status().message().find("injected failure"), std::string::npos)
        << r.status().message();
    auto after = checkpoint::ReadMetadata(storage::PosixFileSystem(), ckpt);
    ASSERT_TRUE(after.ok());
    EXPECT_EQ(after->save_id, before->save_id) << "a failed save committed metadata";
    ASSERT_TRUE(comm->Barrier().ok());
  }
  // The earlier checkpoint still loads, every byte right.
  auto dst = workload::MakeEmptyLike(model, layout, comm->rank());
  ASSERT_TRUE(dst.ok());
  ASSERT_NO_THROW(load(dst->sd, ckpt, {.comm = comm}));
  EXPECT_TRUE(workload::VerifyStateDict(dst->sd).ok());
}

void FileCoordinatorMatches(const std::shared_ptr<Comm>& comm, const std::string& dir) {
  const auto model = SmallModel();
  const int n = comm->size();
  const auto layout =
      Layout(n % 2 == 0 ? "tp2,dp" + std::to_string(n / 2) : "dp" + std::to_string(n));
  auto sd = workload::PopulateStateDict(model, layout, comm->rank());
  ASSERT_TRUE(sd.ok());
  const std::string a = dir + "/via-comm", b = dir + "/via-files";
  ASSERT_NO_THROW(save(sd->sd, a, {.comm = comm}));
  auto files = FileComm(dir + "/coordination", comm->rank(), n);
  ASSERT_NO_THROW(save(sd->sd, b, {.comm = files}));
  ASSERT_TRUE(comm->Barrier().ok());
  auto ma = checkpoint::ReadMetadata(storage::PosixFileSystem(), a);
  auto mb = checkpoint::ReadMetadata(storage::PosixFileSystem(), b);
  ASSERT_TRUE(ma.ok() && mb.ok());
  ASSERT_EQ(ma->tensors.size(), mb->tensors.size());
  for (size_t i = 0; i < ma->tensors.size(); ++i) {
    const auto& ta = ma->tensors[i];
    const auto& tb = mb->tensors[i];
    ASSERT_EQ(ta.fqn, tb.fqn);
    ASSERT_EQ(ta.chunks.size(), tb.chunks.size());
    for (size_t c = 0; c < ta.chunks.size(); ++c) {
      EXPECT_EQ(ta.chunks[c].box, tb.chunks[c].box);
      EXPECT_EQ(ta.chunks[c].xxh3, tb.chunks[c].xxh3);
      EXPECT_EQ(ta.chunks[c].byte_offset, tb.chunks[c].byte_offset);
      // Same writer: file names differ only in the save id.
      EXPECT_EQ(ma->files[ta.chunks[c].file].name.substr(21),
                mb->files[tb.chunks[c].file].name.substr(21));
    }
  }
  auto dst = workload::MakeEmptyLike(model, layout, comm->rank());
  ASSERT_TRUE(dst.ok());
  ASSERT_NO_THROW(load(dst->sd, b, {.comm = files}));
  EXPECT_TRUE(workload::VerifyStateDict(dst->sd).ok());
}

void RanksSeeDifferentDirectories(const std::shared_ptr<Comm>& comm, const std::string& dir) {
  const auto model = SmallModel();
  const int n = comm->size();
  auto sd = workload::PopulateStateDict(model, Layout("tp" + std::to_string(n)), comm->rank());
  ASSERT_TRUE(sd.ok());
  const std::string mine = dir + "/n" + std::to_string(comm->rank()) + "/ckpt";
  auto r = checkpoint::Save(sd->sd, mine, {.comm = comm}, storage::PosixFileSystem());
  ASSERT_FALSE(r.ok()) << "ranks saved into directories rank 0 cannot see";
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  const std::string& msg = r.status().message();
  std::string ranks;
  for (int i = 1; i < n; ++i) ranks += (i > 1 ? ", " : "") + std::to_string(i);
  EXPECT_NE(msg.find("rank(s) " + ranks + " do not see"), std::string::npos) << msg;
  EXPECT_NE(msg.find(dir + "/n1/ckpt/dcp.lock"), std::string::npos) << msg;
  auto all = comm->AllGather(msg);
  ASSERT_TRUE(all.ok());
  for (const auto& m : *all) EXPECT_EQ(m, msg) << "ranks disagree on the error";
  if (std::filesystem::exists(mine)) {
    for (const auto& e : std::filesystem::directory_iterator(mine)) {
      EXPECT_FALSE(checkpoint::IsDcpDataFileName(e.path().filename().string()))
          << "rank " << comm->rank() << " wrote " << e.path();
    }
  }
  ASSERT_TRUE(comm->Barrier().ok());
}

void SaveWithoutCollectives(const std::shared_ptr<Comm>& comm, const std::string& dir) {
  const auto model = SmallModel();
  const int n = comm->size();
  const auto layout = Layout("tp" + std::to_string(n));
  auto sd = workload::PopulateStateDict(model, layout, comm->rank());
  ASSERT_TRUE(sd.ok());
  const std::string ckpt = dir + "/independent";
  ASSERT_NO_THROW(save(sd->sd, ckpt, {.comm = comm, .use_collectives = false}));
  ASSERT_TRUE(comm->Barrier().ok());
  EXPECT_FALSE(std::filesystem::exists(ckpt + "/" + std::string(checkpoint::kMetadataName)));
  EXPECT_TRUE(std::filesystem::exists(ckpt + "/" + checkpoint::RankMetadataName(0, comm->rank())));
  if (comm->rank() == 0) {
    auto whole = workload::MakeEmptyLike(model, Layout("dp1"), 0);
    ASSERT_TRUE(whole.ok());
    ASSERT_NO_THROW(load(whole->sd, ckpt));
    EXPECT_TRUE(workload::VerifyStateDict(whole->sd).ok());
  }
  ASSERT_TRUE(comm->Barrier().ok());
}

}  // namespace dcp::testing

// ---- Async save ----

namespace dcp::testing {
namespace {

workload::LayoutSpec AsyncLayout(int n) {
  return Layout(n % 2 == 0 ? "tp2,dp" + std::to_string(n / 2) : "dp" + std::to_string(n));
}

// Overwrites every tensor chunk and bytes entry of `sd`, as a training step would.
void Scribble(StateDict& sd, uint8_t value) {
  for (size_t i = 0; i < sd.size(); ++i) {
    const StateEntry& e = sd.entries()[i];
    for (const TensorChunk& c : e.chunks) std::memset(c.view.data, value, c.view.NumBytes());
    if (e.kind == StateEntry::Kind::kBytes) sd.mutable_bytes(i).assign(3, std::byte{value});
  }
}

// One training-like step: some arithmetic, then the caller's own collectives on `comm`.
void TrainStep(Comm& comm, int step) {
  volatile double x = 0;
  for (int i = 0; i < 200000; ++i) x = x + 1e-9 * i;
  auto all = comm.AllGather("step " + std::to_string(step));
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  for (const std::string& s : *all) EXPECT_EQ(s, "step " + std::to_string(step));
  std::string b = comm.rank() == step % comm.size() ? "root " + std::to_string(step) : "";
  ASSERT_TRUE(comm.Broadcast(b, step % comm.size()).ok());
  EXPECT_EQ(b, "root " + std::to_string(step));
}

void LoadAndVerify(const std::shared_ptr<Comm>& comm, const workload::ModelSpec& model,
                   const workload::LayoutSpec& layout, const std::string& ckpt) {
  SCOPED_TRACE("checkpoint " + ckpt);
  auto dst = workload::MakeEmptyLike(model, layout, comm->rank());
  ASSERT_TRUE(dst.ok());
  ASSERT_NO_THROW(load(dst->sd, ckpt, {.comm = comm}));
  Status v = workload::VerifyStateDict(dst->sd);
  EXPECT_TRUE(v.ok()) << v.ToString();
}

}  // namespace

void AsyncSaveWhileTraining(const std::shared_ptr<Comm>& comm, const std::string& dir) {
  const auto model = SmallModel();
  const auto layout = AsyncLayout(comm->size());
  auto sd = workload::PopulateStateDict(model, layout, comm->rank());
  ASSERT_TRUE(sd.ok());
  // The pattern, to put back before each save (the steps in between overwrite it).
  auto pristine = workload::PopulateStateDict(model, layout, comm->rank());
  ASSERT_TRUE(pristine.ok());
  auto restore = [&] {
    const auto& dst = sd->sd.entries();
    const auto& src = pristine->sd.entries();
    for (size_t i = 0; i < dst.size(); ++i) {
      if (dst[i].kind == StateEntry::Kind::kBytes) sd->sd.mutable_bytes(i) = src[i].bytes;
      for (size_t c = 0; c < dst[i].chunks.size(); ++c) {
        std::memcpy(dst[i].chunks[c].view.data, src[i].chunks[c].view.data,
                    dst[i].chunks[c].view.NumBytes());
      }
    }
  };

  AsyncSaver saver;
  // Ahead of time, as a job would before its training loop: the pool and the saver's
  // communicator, so that even the first Save only copies.
  ASSERT_NO_THROW(saver.Prepare(sd->sd, {.comm = comm}));
  EXPECT_EQ(saver.pool_stats().allocations, 1u);
  std::vector<AsyncSave> handles;
  std::atomic<int> callbacks{0};
  int step = 0;
  for (int i = 0; i < 3; ++i) {
    restore();
    handles.push_back(saver.Save(sd->sd, dir + "/step_" + std::to_string(i), {.comm = comm},
                                 [&](const AsyncSave&) { ++callbacks; }));
    Scribble(sd->sd, static_cast<uint8_t>(0x5A + i));  // must not reach the checkpoint
    for (int k = 0; k < 4; ++k) TrainStep(*comm, step++);
  }
  for (size_t i = 0; i < handles.size(); ++i) {
    SCOPED_TRACE("save " + std::to_string(i));
    SaveResult r;
    ASSERT_NO_THROW(r = handles[i].Get());
    if (i > 0) {
      EXPECT_TRUE(r.plan_cache_hit);  // the first may hit a plan of an earlier test
    }
    const StagingStats& st = handles[i].staging();
    EXPECT_TRUE(st.reused) << "the prepared staging pool was reallocated";
    EXPECT_EQ(st.allocations, 0u);
    EXPECT_EQ(st.pool_allocations, 1u);
    EXPECT_GE(st.bytes_staged, sd->tensor_bytes);
  }
  saver.WaitAll();
  EXPECT_EQ(callbacks.load(), 3);
  EXPECT_EQ(saver.pool_stats().allocations, 1u);
  for (int i = 0; i < 3; ++i)
    LoadAndVerify(comm, model, layout, dir + "/step_" + std::to_string(i));
  ASSERT_TRUE(comm->Barrier().ok());
}

void AsyncSaveOneRankFails(const std::shared_ptr<Comm>& comm, const std::string& dir, int failing) {
  const auto model = SmallModel();
  const auto layout = AsyncLayout(comm->size());
  auto sd = workload::PopulateStateDict(model, layout, comm->rank());
  ASSERT_TRUE(sd.ok());
  const std::string ckpt = dir + "/failing";
  const std::string tag = "rank " + std::to_string(failing) + ":";
  AsyncSaver saver;
  ASSERT_NO_THROW(saver.Save(sd->sd, ckpt, {.comm = comm}).Get());
  auto before = checkpoint::ReadMetadata(storage::PosixFileSystem(), ckpt);
  ASSERT_TRUE(before.ok());
  ASSERT_TRUE(comm->Barrier().ok());

  {
    // Rank `failing` cannot create its data file.
    testfs::FaultFileSystem fs(storage::PosixFileSystem());
    if (comm->rank() == failing) fs.FailAt(1);
    AsyncSave h = async::SaveWithFileSystem(saver, sd->sd, ckpt, {.comm = comm}, {}, fs);
    TrainStep(*comm, 0);
    Status s = h.status();  // before `fs` goes away
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find(tag), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("injected failure"), std::string::npos) << s.message();
    EXPECT_THROW(h.Get(), Error);
  }
  auto after = checkpoint::ReadMetadata(storage::PosixFileSystem(), ckpt);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->save_id, before->save_id) << "a failed save committed metadata";
  ASSERT_TRUE(comm->Barrier().ok());
  LoadAndVerify(comm, model, layout, ckpt);

  {
    // Rank `failing` cannot stage: its own saver's cap is too small.
    AsyncSaver small({.max_staging_bytes = comm->rank() == failing ? 4096u : 0u});
    try {
      small.Prepare(sd->sd, {.comm = comm});
      ADD_FAILURE() << "Prepare did not fail";
    } catch (const Error& e) {  // on every rank, naming the failing one
      EXPECT_EQ(e.code(), StatusCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(tag), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("max_staging_bytes"), std::string::npos) << e.what();
    }
    AsyncSave h = small.Save(sd->sd, ckpt, {.comm = comm});
    TrainStep(*comm, 1);
    Status s = h.status();
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find(tag), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("max_staging_bytes"), std::string::npos) << s.message();
  }
  after = checkpoint::ReadMetadata(storage::PosixFileSystem(), ckpt);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->save_id, before->save_id);

  {
    // Rank `failing` has nothing to stage (its caller's preparation failed): Fail in place of
    // Save, and every handle reports that rank's error.
    AsyncSave h =
        comm->rank() == failing
            ? saver.Fail(ckpt, InvalidArgument("'w': refused by the caller"), {.comm = comm})
            : saver.Save(sd->sd, ckpt, {.comm = comm});
    Status s = h.status();
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
    EXPECT_NE(s.message().find(tag), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("'w': refused by the caller"), std::string::npos) << s.message();
  }
  after = checkpoint::ReadMetadata(storage::PosixFileSystem(), ckpt);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->save_id, before->save_id);

  // The saver whose save failed still saves.
  AsyncSave again = saver.Save(sd->sd, ckpt, {.comm = comm});
  ASSERT_NO_THROW(again.Get());
  EXPECT_TRUE(again.staging().reused);
  ASSERT_TRUE(comm->Barrier().ok());
  LoadAndVerify(comm, model, layout, ckpt);
}

void AsyncSaveThroughFileCoordinator(const std::shared_ptr<Comm>& comm, const std::string& dir) {
  const auto model = SmallModel();
  const auto layout = AsyncLayout(comm->size());
  auto sd = workload::PopulateStateDict(model, layout, comm->rank());
  ASSERT_TRUE(sd.ok());
  auto files = FileComm(dir + "/async-coordination", comm->rank(), comm->size());
  files->set_timeout(comm->timeout());
  const std::string ckpt = dir + "/async-via-files";
  AsyncSaver saver;
  AsyncSave h = saver.Save(sd->sd, ckpt, {.comm = files});
  Scribble(sd->sd, 0x33);
  TrainStep(*comm, 0);
  ASSERT_NO_THROW(h.Get());
  ASSERT_TRUE(comm->Barrier().ok());
  LoadAndVerify(comm, model, layout, ckpt);
}

}  // namespace dcp::testing

namespace dcp::testing {

namespace {

LoadResult LoadVerified(const std::shared_ptr<Comm>& comm, const workload::ModelSpec& model,
                        const workload::LayoutSpec& layout, const std::string& ckpt,
                        LoadOptions opts) {
  auto dst = workload::MakeEmptyLike(model, layout, comm->rank());
  EXPECT_TRUE(dst.ok());
  opts.comm = comm;
  LoadResult r;
  EXPECT_NO_THROW(r = load(dst->sd, ckpt, opts));
  Status v = workload::VerifyStateDict(dst->sd);
  EXPECT_TRUE(v.ok()) << v.ToString();
  return r;
}

uint64_t Sum(const std::vector<uint64_t>& v) {
  uint64_t s = 0;
  for (uint64_t x : v) s += x;
  return s;
}

}  // namespace

void BroadcastLoad(const std::shared_ptr<Comm>& comm, const std::string& dir,
                   const std::string& save_layout, const std::string& load_layout) {
  SCOPED_TRACE(save_layout + " -> " + load_layout);
  const auto model = SmallModel();
  auto sd = workload::PopulateStateDict(model, Layout(save_layout), comm->rank());
  ASSERT_TRUE(sd.ok());
  const std::string ckpt = dir + "/bcast-" + save_layout + "-" + load_layout;
  ASSERT_NO_THROW(save(sd->sd, ckpt, {.comm = comm}));
  const auto layout = Layout(load_layout);

  // One machine: broadcast within the host explicitly (by default ranks of one host read
  // through their shared page cache; see HostAwareBroadcast).
  LoadResult off = LoadVerified(comm, model, layout, ckpt, {.broadcast = false});
  LoadResult on = LoadVerified(comm, model, layout, ckpt,
                               {.broadcast_within_host = true, .broadcast_cached = true});
  LoadResult again = LoadVerified(comm, model, layout, ckpt,
                                  {.broadcast_within_host = true, .broadcast_cached = true});
  EXPECT_EQ(off.broadcasts, 0u);
  EXPECT_EQ(again.groups_created, 0u) << "groups were not reused by the second load";

  const uint64_t read_off = Sum(GatherU64(*comm, off.bytes_read));
  const uint64_t read_on = Sum(GatherU64(*comm, on.bytes_read));
  const uint64_t shared = Sum(GatherU64(*comm, on.shared_shards));
  const uint64_t broadcasts = Sum(GatherU64(*comm, on.broadcasts));
  const uint64_t chunks = Sum(GatherU64(*comm, on.shared_chunks));
  EXPECT_LE(read_on, read_off);
  EXPECT_EQ(Sum(GatherU64(*comm, on.bytes_sent)) > 0, shared > 0);
  if (shared + chunks > 0) {
    EXPECT_LT(read_on, read_off);
    EXPECT_LT(broadcasts, shared + chunks) << "shared shards and chunks went one per collective";
  }
  auto md = checkpoint::ReadMetadata(storage::PosixFileSystem(), ckpt);
  ASSERT_TRUE(md.ok());
  uint64_t tensor_bytes = 0, bytes_entries = 0;
  for (const auto& t : md->tensors) {
    for (const auto& c : t.chunks) tensor_bytes += c.byte_length;
  }
  for (const auto& b : md->bytes) bytes_entries += b.byte_length;
  // Issue 20 item 5: broadcast buffers stay within LoadOptions::max_broadcast_buffer_bytes, but for
  // a single buffer larger than it (unbatched here: one stored chunk per buffer; a backend
  // whose all-gathers are not in place packs slabs under Comm::kInPlaceBytes, alone when
  // one exceeds the budget).
  uint64_t largest_chunk = 0;
  for (const auto& t : md->tensors) {
    for (const auto& c : t.chunks) largest_chunk = std::max(largest_chunk, c.byte_length);
  }
  const uint64_t cap = 64 << 10;
  LoadResult capped = LoadVerified(comm, model, layout, ckpt,
                                   {.broadcast_batch_bytes = 0,
                                    .max_broadcast_buffer_bytes = cap,
                                    .broadcast_within_host = true,
                                    .broadcast_cached = true});
  uint64_t peak = 0;
  for (uint64_t p : GatherU64(*comm, capped.peak_broadcast_buffer_bytes)) peak = std::max(peak, p);
  EXPECT_LE(peak,
            std::max({cap, largest_chunk, comm->gathers_in_place() ? 0 : Comm::kInPlaceBytes}));
  if (save_layout == load_layout && save_layout.rfind("dp", 0) == 0) {
    // Pure replication: every unique tensor byte read from storage exactly once in total
    // (bytes entries are read by every rank itself).
    EXPECT_EQ(read_on, tensor_bytes + bytes_entries * comm->size());
  }
  ASSERT_TRUE(comm->Barrier().ok());
}

namespace {

// Saves `model` replicated on every rank of `comm` (dp<N>) to `ckpt`.
void SaveReplicated(const std::shared_ptr<Comm>& comm, const workload::ModelSpec& model,
                    const std::string& ckpt) {
  auto sd =
      workload::PopulateStateDict(model, Layout("dp" + std::to_string(comm->size())), comm->rank());
  ASSERT_TRUE(sd.ok()) << sd.status().ToString();
  ASSERT_NO_THROW(save(sd->sd, ckpt, {.comm = comm}));
}

}  // namespace

void BroadcastManyInFlight(const std::shared_ptr<Comm>& comm, const std::string& dir) {
  const auto model = SmallModel();
  const auto layout = Layout("dp" + std::to_string(comm->size()));
  const std::string ckpt = dir + "/inflight";
  ASSERT_NO_FATAL_FAILURE(SaveReplicated(comm, model, ckpt));
  // One group (every rank): a few all-gather rounds; with a small buffer budget, a backend
  // that packs small slabs (all but MPI) needs many more, which the in-flight limit then meets.
  const bool in_place = comm->gathers_in_place();
  for (uint64_t budget : {uint64_t{256} << 20, uint64_t{64} << 10}) {
    for (int limit : {1, 2, 8}) {
      SCOPED_TRACE("budget " + std::to_string(budget) + " in flight " + std::to_string(limit));
      LoadResult r = LoadVerified(comm, model, layout, ckpt,
                                  {.max_broadcasts_in_flight = limit,
                                   .max_broadcast_buffer_bytes = budget,
                                   .broadcast_within_host = true,
                                   .broadcast_cached = true});
      EXPECT_EQ(r.batches, 0u);
      EXPECT_GT(r.shared_shards, 100u);
      if (in_place || budget > (1 << 20)) {
        EXPECT_GE(r.broadcasts, 1u);
        EXPECT_LE(r.broadcasts, 4u) << "one group, four rounds";
      } else {
        EXPECT_GT(r.broadcasts, 8u);
        EXPECT_LE(r.peak_broadcast_buffer_bytes, uint64_t{1} << 20);  // one slab over the budget
      }
    }
  }
  // Budgets differ by rank (each rank's own memory): the rounds are cut alike everywhere all
  // the same (by the smallest), so the collectives match.
  LoadResult mixed = LoadVerified(
      comm, model, layout, ckpt,
      {.max_broadcast_buffer_bytes = comm->rank() == 0 ? uint64_t{64} << 10 : uint64_t{256} << 20,
       .broadcast_within_host = true,
       .broadcast_cached = true});
  const auto calls = GatherU64(*comm, mixed.broadcasts);
  EXPECT_EQ(*std::min_element(calls.begin(), calls.end()),
            *std::max_element(calls.begin(), calls.end()));
  ASSERT_TRUE(comm->Barrier().ok());
}

void BroadcastSlabs(const std::shared_ptr<Comm>& comm, const std::string& dir) {
  const auto model = SmallModel();
  // Saved tensor-parallel, loaded whole on every rank: with checksums on, slabs can end
  // between the stored tp pieces.
  auto saved =
      workload::PopulateStateDict(model, Layout("tp" + std::to_string(comm->size())), comm->rank());
  ASSERT_TRUE(saved.ok());
  const std::string ckpt = dir + "/slabs";
  ASSERT_NO_THROW(save(saved->sd, ckpt, {.comm = comm}));
  const auto layout = Layout("dp" + std::to_string(comm->size()));
  auto md = checkpoint::ReadMetadata(storage::PosixFileSystem(), ckpt);
  ASSERT_TRUE(md.ok());
  uint64_t unique = 0;
  for (const auto& t : md->tensors) {
    for (const auto& c : t.chunks) unique += c.byte_length;
  }
  for (const auto& b : md->bytes) unique += b.byte_length * comm->size();  // read by each rank
  for (bool verify : {true, false}) {
    SCOPED_TRACE(verify ? "checksums verified" : "checksums off");
    LoadResult whole = LoadVerified(comm, model, layout, ckpt,
                                    {.verify_checksums = verify,
                                     .broadcast_slab_bytes = UINT64_MAX,
                                     .broadcast_within_host = true,
                                     .broadcast_cached = true});
    LoadResult slabs = LoadVerified(comm, model, layout, ckpt,
                                    {.verify_checksums = verify,
                                     .broadcast_slab_bytes = 4096,
                                     .broadcast_within_host = true,
                                     .broadcast_cached = true});
    EXPECT_GT(Sum(GatherU64(*comm, slabs.shared_shards)),
              Sum(GatherU64(*comm, whole.shared_shards)))
        << "no shard was cut into slabs";
    const auto read_whole = GatherU64(*comm, whole.bytes_read);
    const auto read_slabs = GatherU64(*comm, slabs.bytes_read);
    EXPECT_EQ(Sum(read_whole), unique);
    EXPECT_EQ(Sum(read_slabs), unique);
    const uint64_t max_slabs = *std::max_element(read_slabs.begin(), read_slabs.end());
    EXPECT_LE(max_slabs, *std::max_element(read_whole.begin(), read_whole.end()));
    EXPECT_LE(static_cast<double>(max_slabs), 1.2 * static_cast<double>(unique) / comm->size());
  }
  // Written by one rank, loaded whole by every rank, checksums verified: an 8 MiB tensor
  // stored as one chunk of 8 checksum blocks is cut inside it, at blocks, so every stored byte
  // is read once and each rank reads 2 MiB (uncut, one rank would read all 8).
  const std::string single = dir + "/one-rank";
  std::vector<float> w(2048 * 1024);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i % 65521);
  if (comm->rank() == 0) {
    StateDict one;
    one.add("w", TensorView(w.data(), DType::kF32, {2048, 1024}));
    ASSERT_NO_THROW(save(one, single));
  }
  ASSERT_TRUE(comm->Barrier().ok());
  std::vector<float> got(w.size(), -1.0f);
  StateDict dst;
  dst.add("w", TensorView(got.data(), DType::kF32, {2048, 1024}));
  LoadResult r;
  ASSERT_NO_THROW(r = load(dst, single,
                           {.comm = comm,
                            .verify_checksums = true,
                            .broadcast_slab_bytes = 1 << 20,
                            .broadcast_within_host = true,
                            .broadcast_cached = true}));
  EXPECT_EQ(got, w);
  EXPECT_EQ(GatherU64(*comm, r.bytes_read),
            std::vector<uint64_t>(comm->size(), (uint64_t{8} << 20) / comm->size()))
      << "the one stored chunk was not cut at its blocks among the readers";
  EXPECT_EQ(r.shared_chunks, 0u);
  ASSERT_TRUE(comm->Barrier().ok());
}

void BroadcastReadFailure(const std::shared_ptr<Comm>& comm, const std::string& dir) {
  const auto model = SmallModel();
  const auto layout = Layout("dp" + std::to_string(comm->size()));
  const std::string ckpt = dir + "/corrupt";
  ASSERT_NO_FATAL_FAILURE(SaveReplicated(comm, model, ckpt));
  ASSERT_TRUE(comm->Barrier().ok());
  std::string file;
  if (comm->rank() == 0) {
    // Corrupt the largest chunk: it is shared by every rank and read by one of them.
    auto md = checkpoint::ReadMetadata(storage::PosixFileSystem(), ckpt);
    ASSERT_TRUE(md.ok());
    const metadata::StoredChunk* big = nullptr;
    for (const auto& t : md->tensors) {
      for (const auto& c : t.chunks) {
        if (!big || c.byte_length > big->byte_length) big = &c;
      }
    }
    file = ckpt + "/" + md->files[big->file].name;
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(big->byte_offset + 17));
    f.put('\x7f');
  }
  ASSERT_TRUE(comm->Broadcast(file, 0).ok());
  auto dst = workload::MakeEmptyLike(model, layout, comm->rank());
  ASSERT_TRUE(dst.ok());
  try {
    load(dst->sd, ckpt, {.comm = comm, .broadcast_within_host = true, .broadcast_cached = true});
    ADD_FAILURE() << "load of a corrupt checkpoint succeeded on rank " << comm->rank();
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("checksum mismatch"), std::string::npos) << m;
    EXPECT_NE(m.find(file), std::string::npos) << m;
    EXPECT_NE(m.find("tensor '"), std::string::npos) << m;
  }
  ASSERT_TRUE(comm->Barrier().ok());
}

}  // namespace dcp::testing

namespace dcp::testing {

void HuggingFaceDirectLoad(const std::shared_ptr<Comm>& comm, const std::string& dir) {
  const auto model = SmallModel();
  const std::string hf_dir = dir + "/hf", dcp_dir = dir + "/from";
  // All ranks write the source (a collective save), then convert it together.
  auto whole =
      workload::PopulateStateDict(model, Layout("dp" + std::to_string(comm->size())), comm->rank());
  ASSERT_TRUE(whole.ok());
  ASSERT_NO_THROW(save(whole->sd, dcp_dir, {.comm = comm}));
  auto converted = convert::DcpToHf(dcp_dir, hf_dir, {.comm = comm, .max_shard_bytes = 4'000'000},
                                    storage::PosixFileSystem());
  ASSERT_TRUE(converted.ok()) << converted.status().ToString();
  ASSERT_TRUE(comm->Barrier().ok());

  const auto layout = Layout("tp" + std::to_string(comm->size()));
  uint64_t read[2];
  for (bool broadcast : {false, true}) {
    SCOPED_TRACE(broadcast ? "broadcast on" : "broadcast off");
    auto dst = workload::MakeEmptyLike(model, layout, comm->rank());
    ASSERT_TRUE(dst.ok());
    // Bytes entries do not exist in a HuggingFace checkpoint.
    LoadResult r;
    ASSERT_NO_THROW(r = load(dst->sd, hf_dir,
                             {.comm = comm,
                              .allow_partial = true,
                              .broadcast = broadcast,
                              .broadcast_within_host = true,
                              .broadcast_cached = true}));
    EXPECT_EQ(r.entries_skipped, 2u);
    for (size_t i = 0; i < dst->sd.size(); ++i) {
      const StateEntry& e = dst->sd.entries()[i];
      if (e.kind == StateEntry::Kind::kBytes) {
        auto expected = workload::ExpectedBytesEntry(e.fqn);
        dst->sd.mutable_bytes(i).assign(expected.begin(), expected.end());
      }
    }
    Status v = workload::VerifyStateDict(dst->sd);
    EXPECT_TRUE(v.ok()) << v.ToString();
    read[broadcast] = Sum(GatherU64(*comm, r.bytes_read));
  }
  // Replicated tensors are read once and broadcast; column slices of row-major tensors
  // (which every rank would fetch almost whole) are read once and sent (whole, or as parts).
  EXPECT_EQ(read[1], model.TotalBytes());
  EXPECT_GT(read[0], read[1]);
  ASSERT_TRUE(comm->Barrier().ok());
}

}  // namespace dcp::testing

namespace dcp::testing {

void HostAwareBroadcast(const std::shared_ptr<Comm>& comm, const std::string& dir) {
  const auto model = SmallModel();
  auto sd = workload::PopulateStateDict(model, Layout("tp4"), comm->rank());
  ASSERT_TRUE(sd.ok());
  const std::string ckpt = dir + "/hosts";
  ASSERT_NO_THROW(save(sd->sd, ckpt, {.comm = comm}));
  // Ranks 0,1 on one host and 2,3 on another ($DCP_HOST_ID set by the test's launcher).
  // tp2,dp2 puts the replicas of a piece on ranks {0,1} and {2,3}: each pair shares a host,
  // reads through its page cache, and only the tensors every rank holds (norms, router)
  // cross hosts and are broadcast (even though the emulated hosts share one page cache that
  // holds every file: broadcast_cached).
  LoadResult same = LoadVerified(comm, model, Layout("tp2,dp2"), ckpt, {.broadcast_cached = true});
  uint64_t replicated = 0;
  for (const auto& t : model.tensors) replicated += t.tp_dim < 0 ? t.NumBytes() : 0;
  EXPECT_EQ(Sum(GatherU64(*comm, same.bytes_sent)), replicated);
  // dp2,tp2 puts them on {0,2} and {1,3}: across hosts, read once and broadcast.
  LoadResult across =
      LoadVerified(comm, model, Layout("dp2,tp2"), ckpt, {.broadcast_cached = true});
  EXPECT_GT(Sum(GatherU64(*comm, across.broadcasts)), 0u);
  EXPECT_LT(Sum(GatherU64(*comm, across.bytes_read)), Sum(GatherU64(*comm, same.bytes_read)));
  ASSERT_TRUE(comm->Barrier().ok());
}

}  // namespace dcp::testing

namespace dcp::testing {

void RealHostsBroadcast(const std::shared_ptr<Comm>& comm, const std::string& dir, int hosts) {
  // The hosts must be real: each process's own host name, not an emulation.
  ASSERT_EQ(std::getenv("DCP_HOST_ID"), nullptr) << "DCP_HOST_ID would emulate the hosts";
  char name[256] = {};
  ASSERT_EQ(gethostname(name, sizeof(name) - 1), 0);
  auto names = comm->AllGather(name);
  ASSERT_TRUE(names.ok()) << names.status().ToString();
  const int world = comm->size();
  ASSERT_EQ(world % hosts, 0) << world << " ranks cannot be spread evenly over " << hosts
                              << " hosts";
  const int per_host = world / hosts;
  // Placed host by host: ranks [h*R, (h+1)*R) on host h, and no two hosts share a name.
  std::string listing;
  for (int r = 0; r < world; ++r) {
    const std::string& mine = (*names)[r];
    const std::string& first = (*names)[r / per_host * per_host];
    EXPECT_EQ(mine, first) << "rank " << r << " is not on the host of rank "
                           << r / per_host * per_host;
    if (r % per_host == 0) {
      for (int q = 0; q < r; ++q) EXPECT_NE((*names)[q], mine) << "ranks " << q << ", " << r;
      listing += (r ? ", " : "") + mine + ": ranks " + std::to_string(r) + ".." +
                 std::to_string(r + per_host - 1);
    }
  }
  if (comm->rank() == 0) std::cout << "hosts: " << listing << std::endl;
  ASSERT_FALSE(::testing::Test::HasFailure());

  const auto model = SmallModel();
  uint64_t replicated = 0;  // bytes of the tensors every rank holds (no tp dimension)
  for (const auto& t : model.tensors) replicated += t.tp_dim < 0 ? t.NumBytes() : 0;
  const std::string H = std::to_string(hosts), R = std::to_string(per_host);
  for (const std::string& layout : {"dp" + H + ",tp" + R, "tp" + H + ",dp" + R}) {
    SCOPED_TRACE(layout);
    const bool across = layout[0] == 'd';
    if (!across && per_host == 1) continue;  // the same layout as the first
    auto sd = workload::PopulateStateDict(model, Layout(layout), comm->rank());
    ASSERT_TRUE(sd.ok());
    const std::string ckpt = dir + "/" + layout;
    ASSERT_NO_THROW(save(sd->sd, ckpt, {.comm = comm}));
    auto md = checkpoint::ReadMetadata(storage::PosixFileSystem(), ckpt);
    ASSERT_TRUE(md.ok());
    uint64_t unique = 0, bytes_entries = 0;
    for (const auto& t : md->tensors) {
      for (const auto& c : t.chunks) unique += c.byte_length;
    }
    for (const auto& b : md->bytes) bytes_entries += b.byte_length;
    ASSERT_EQ(unique, model.TotalBytes());

    // The defaults: broadcast between hosts only (forced: the namespaces share one page cache,
    // which holds every file, so the default would read each from memory).
    const LoadResult on =
        LoadVerified(comm, model, Layout(layout), ckpt, {.broadcast_cached = true});
    const LoadResult off = LoadVerified(comm, model, Layout(layout), ckpt, {.broadcast = false});
    const uint64_t read = Sum(GatherU64(*comm, on.bytes_read));
    const uint64_t read_off = Sum(GatherU64(*comm, off.bytes_read));
    const uint64_t sent = Sum(GatherU64(*comm, on.bytes_sent));
    const uint64_t received = Sum(GatherU64(*comm, on.bytes_received));
    const uint64_t broadcasts = Sum(GatherU64(*comm, on.broadcasts));
    if (across) {
      // Every shard is held on every host: read once in all, sent once, received by the
      // holders that did not read it (bytes entries are read by every rank itself).
      EXPECT_EQ(read, unique + bytes_entries * world);
      EXPECT_EQ(sent, unique);
      EXPECT_EQ(received, (unique - replicated) * (hosts - 1) + replicated * (world - 1));
    } else {
      // Replicas within a host read through its page cache: only what every rank holds
      // crosses hosts.
      EXPECT_EQ(read, (unique - replicated) * per_host + replicated + bytes_entries * world);
      EXPECT_EQ(sent, replicated);
    }
    EXPECT_GT(broadcasts, 0u);
    EXPECT_LT(read, read_off);
    if (comm->rank() == 0) {
      std::cout << layout << ": storage read " << read << " bytes by all ranks (unique " << unique
                << " + bytes entries " << bytes_entries << " x " << world
                << " ranks; broadcast off: " << read_off << "), broadcast sent " << sent
                << ", received " << received << ", " << broadcasts << " broadcasts" << std::endl;
      // real_hosts.sh checks these bytes against the hosts' network links.
      if (across) {
        std::cout << "crossing hosts: at least " << (unique - replicated) * (hosts - 1) << " bytes"
                  << std::endl;
      }
    }
  }
  ASSERT_TRUE(comm->Barrier().ok());
}

}  // namespace dcp::testing

namespace dcp::testing {
namespace {

// A number of a tensor's name, the same in every process and layout (FNV-1a).
uint64_t NameKey(const std::string& fqn) {
  uint64_t h = 1469598103934665603ULL;
  for (char c : fqn) h = (h ^ static_cast<uint8_t>(c)) * 1099511628211ULL;
  return h >> 7;
}

// Flips every byte of the chunks of every tensor whose NameKey `pick` chooses: the same change
// on every rank holding a replica, whatever the layout.
void ChangeTensors(workload::OwnedStateDict& sd, const std::function<bool(uint64_t)>& pick) {
  for (const StateEntry& e : sd.sd.entries()) {
    if (e.kind != StateEntry::Kind::kTensor || !pick(NameKey(e.fqn))) continue;
    for (const TensorChunk& c : e.chunks) {
      std::byte* p = c.view.bytes();
      for (uint64_t i = 0; i < c.view.NumBytes(); ++i) p[i] ^= std::byte{0x5a};
    }
  }
}

// A copy of a state dict's tensor bytes, entry by entry and chunk by chunk.
std::vector<std::vector<std::byte>> Snapshot(const StateDict& sd) {
  std::vector<std::vector<std::byte>> out;
  for (const StateEntry& e : sd.entries()) {
    for (const TensorChunk& c : e.chunks) {
      out.emplace_back(c.view.bytes(), c.view.bytes() + c.view.NumBytes());
    }
  }
  return out;
}

}  // namespace

void IncrementalSaves(const std::shared_ptr<Comm>& comm, const std::string& dir,
                      const std::string& save_layout, const std::string& load_layout) {
  const auto model = SmallModel();
  const auto layout = Layout(save_layout);
  ASSERT_EQ(layout.WorldSize(), comm->size());
  auto sd = workload::PopulateStateDict(model, layout, comm->rank());
  ASSERT_TRUE(sd.ok()) << sd.status().ToString();
  const std::string root = dir + "/incremental";
  auto step = [&](int s) { return root + "/step_" + std::to_string(s); };
  auto total = [&](uint64_t v) {
    uint64_t t = 0;
    for (uint64_t x : GatherU64(*comm, v)) t += x;
    return t;
  };

  ASSERT_NO_THROW(save(sd->sd, step(1), {.comm = comm}));
  // The checkpoint's own bytes entries are always written; the rest must be the changed chunks.
  auto md1 = checkpoint::ReadMetadata(storage::PosixFileSystem(), step(1));
  ASSERT_TRUE(md1.ok());
  uint64_t entry_bytes = 0;
  for (const auto& b : md1->bytes) entry_bytes += b.byte_length;

  // Step 2: half the tensors change. Bytes changed on a rank count once per replica; the
  // checkpoint's changed bytes are the metadata's own files' tensor chunks.
  ChangeTensors(*sd, [](uint64_t i) { return i % 2 == 0; });
  SaveResult r2;
  ASSERT_NO_THROW(r2 = save(sd->sd, step(2), {.comm = comm, .incremental_base = step(1)}));
  // Step 3: a quarter change again (half of those that changed for step 2).
  ChangeTensors(*sd, [](uint64_t i) { return i % 4 == 0; });
  SaveResult r3;
  ASSERT_NO_THROW(r3 = save(sd->sd, step(3), {.comm = comm, .incremental_base = step(2)}));

  auto md2 = checkpoint::ReadMetadata(storage::PosixFileSystem(), step(2));
  auto md3 = checkpoint::ReadMetadata(storage::PosixFileSystem(), step(3));
  ASSERT_TRUE(md2.ok() && md3.ok());
  // What each step stores itself: exactly the chunks of the tensors that changed for it.
  for (int s : {2, 3}) {
    SCOPED_TRACE("step " + std::to_string(s));
    const metadata::Metadata& md = s == 2 ? *md2 : *md3;
    const SaveResult& r = s == 2 ? r2 : r3;
    uint64_t own = 0, referenced = 0;
    for (size_t t = 0; t < md.tensors.size(); ++t) {
      const uint64_t i = NameKey(md.tensors[t].fqn);
      const bool changed = s == 2 ? i % 2 == 0 : i % 4 == 0;
      for (const auto& c : md.tensors[t].chunks) {
        const std::string& base = md.files[c.file].base;
        // Unchanged since step 1 (odd keys): step_1; changed for step 2 only: step_2.
        const std::string want = changed ? "" : (i % 2 == 1 || s == 2) ? "step_1" : "step_2";
        EXPECT_EQ(base, want) << md.tensors[t].fqn;
        (base.empty() ? own : referenced) += c.byte_length;
      }
    }
    EXPECT_EQ(total(r.bytes_written), own + entry_bytes);
    EXPECT_EQ(total(r.bytes_referenced), referenced);
    EXPECT_GT(referenced, 0u);
  }

  // Every step loads with the values of its time, under another layout: the same bytes as a
  // rank of that layout held when populated and changed alike.
  auto load_layout_spec = Layout(load_layout);
  if (comm->rank() < load_layout_spec.WorldSize()) {
    std::vector<int> members(load_layout_spec.WorldSize());
    for (int i = 0; i < load_layout_spec.WorldSize(); ++i) members[i] = i;
    auto group = load_layout_spec.WorldSize() == comm->size() ? Result<std::shared_ptr<Comm>>(comm)
                                                              : comm->CreateGroup(members);
    ASSERT_TRUE(group.ok());
    for (int s : {1, 2, 3}) {
      SCOPED_TRACE("load step " + std::to_string(s));
      auto want = workload::PopulateStateDict(model, load_layout_spec, (*group)->rank());
      ASSERT_TRUE(want.ok());
      if (s >= 2) ChangeTensors(*want, [](uint64_t i) { return i % 2 == 0; });
      if (s >= 3) ChangeTensors(*want, [](uint64_t i) { return i % 4 == 0; });
      auto got = workload::MakeEmptyLike(model, load_layout_spec, (*group)->rank());
      ASSERT_TRUE(got.ok());
      ASSERT_NO_THROW(load(got->sd, step(s), {.comm = *group}));
      EXPECT_TRUE(Snapshot(got->sd) == Snapshot(want->sd));
    }
  }
  ASSERT_TRUE(comm->Barrier().ok());

  if (comm->rank() == 0) {
    for (int s : {1, 2, 3}) EXPECT_NO_THROW(verify(step(s)));
    // A flipped byte of a chunk step 3 references in step_1's files: verify of step 3 names
    // the base's file.
    const metadata::FileInfo* in_base = nullptr;
    uint64_t at = 0;
    for (const auto& t : md3->tensors) {
      for (const auto& c : t.chunks) {
        if (!in_base && md3->files[c.file].base == "step_1" && c.byte_length > 0) {
          in_base = &md3->files[c.file];
          at = c.byte_offset;
        }
      }
    }
    ASSERT_NE(in_base, nullptr);
    {
      std::fstream f(step(1) + "/" + in_base->name,
                     std::ios::in | std::ios::out | std::ios::binary);
      f.seekg(static_cast<std::streamoff>(at));
      const char c = static_cast<char>(f.get() ^ 0x01);
      f.seekp(static_cast<std::streamoff>(at));
      f.put(c);
      ASSERT_TRUE(f.good());
    }
    try {
      verify(step(3));
      ADD_FAILURE() << "verify passed over a flipped byte in the base";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("step_1/" + in_base->name), std::string::npos)
          << e.what();
    }
  }
  ASSERT_TRUE(comm->Barrier().ok());
}

}  // namespace dcp::testing
