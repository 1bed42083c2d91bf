// Incremental roots (ManagerOptions::incremental): saves write only what changed, retention
// keeps every base a kept step references, full_every bounds the chains, and a crash at any
// operation leaves every kept step loadable.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "checkpoint/names.h"
#include "dcp/checkpoint.h"
#include "dcp/manager.h"
#include "manager/manager.h"
#include "storage/file_system.h"
#include "test_util.h"
#include "testfs/fault_file_system.h"
#include "tier/memory_tier.h"

namespace dcp {
namespace {

using testing::TempDir;

// A LoRA-like state: a frozen base that never changes, a small adapter and a step counter
// that change every step.
struct Tuned {
  static constexpr int64_t kFrozenRows = 256, kCols = 256, kAdapterRows = 4;
  std::vector<float> frozen, adapter;
  StateDict sd;
  Tuned() : frozen(kFrozenRows * kCols), adapter(kAdapterRows * kCols) {
    for (size_t i = 0; i < frozen.size(); ++i) frozen[i] = static_cast<float>(i) * 0.5f;
    sd.add("base.weight", TensorView(frozen.data(), DType::kF32, Shape{kFrozenRows, kCols}));
    sd.add("lora.weight", TensorView(adapter.data(), DType::kF32, Shape{kAdapterRows, kCols}));
    sd.add_bytes("step", std::string_view("none"));
  }
  static uint64_t AdapterBytes() { return kAdapterRows * kCols * 4; }
  static uint64_t FrozenBytes() { return kFrozenRows * kCols * 4; }
  void Fill(int64_t step) {
    for (size_t i = 0; i < adapter.size(); ++i) adapter[i] = static_cast<float>(step * 7 + i);
    const std::string s = std::to_string(step);
    sd.mutable_bytes(2).assign(reinterpret_cast<const std::byte*>(s.data()),
                               reinterpret_cast<const std::byte*>(s.data()) + s.size());
  }
  // Whether this state holds step `step`'s tensors.
  ::testing::AssertionResult HoldsTensorsOf(int64_t step) const {
    Tuned want;
    want.Fill(step);
    if (frozen != want.frozen) return ::testing::AssertionFailure() << "frozen of " << step;
    if (adapter != want.adapter) return ::testing::AssertionFailure() << "adapter of " << step;
    return ::testing::AssertionSuccess();
  }
  ::testing::AssertionResult LoadsAs(CheckpointManager& mgr, int64_t step) {
    Tuned got;
    std::fill(got.frozen.begin(), got.frozen.end(), -1.0f);
    try {
      mgr.Load(got.sd, step);
    } catch (const Error& e) {
      return ::testing::AssertionFailure() << "step " << step << ": " << e.what();
    }
    Tuned want;
    want.Fill(step);
    if (got.frozen != want.frozen) return ::testing::AssertionFailure() << "frozen of " << step;
    if (got.adapter != want.adapter) return ::testing::AssertionFailure() << "adapter of " << step;
    if (got.sd.find("step")->bytes != want.sd.find("step")->bytes) {
      return ::testing::AssertionFailure() << "bytes entry of " << step;
    }
    return ::testing::AssertionSuccess();
  }
};

TEST(IncrementalRetention, BasesOfKeptStepsAndTheirBasesStay) {
  const StepBases bases = {{3, {1}}, {4, {1, 3}}, {5, {1, 4}}};
  EXPECT_EQ(StepsToRemove({1, 2, 3, 4, 5}, 5, {.keep_last = 2}, {}, bases),
            (std::vector<int64_t>{2}));
  // Once nothing kept references them, bases go like any step.
  EXPECT_EQ(StepsToRemove({1, 2, 3, 4, 5, 6}, 6, {.keep_last = 1}, {}, bases),
            (std::vector<int64_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(StepsToRemove({1, 2, 3, 4, 5, 6}, 6, {.keep_last = 1}, {}, {{6, {4}}, {4, {1}}}),
            (std::vector<int64_t>{2, 3, 5}));
}

TEST(IncrementalManager, WritesWhatChangedAndKeepsItsBases) {
  TempDir d;
  Tuned st;
  std::vector<uint64_t> written, referenced;
  {
    CheckpointManager mgr(
        d.path(), ManagerOptions{.policy = {.keep_last = 2}, .incremental = true, .full_every = 3});
    for (int64_t step = 1; step <= 5; ++step) {
      st.Fill(step);
      SaveResult r = mgr.Save(step, st.sd);
      written.push_back(r.bytes_written);
      referenced.push_back(r.bytes_referenced);
    }
    // Steps 1 and 4 full; 2, 3 and 5 wrote the adapter and the bytes entry only.
    for (int i : {0, 3}) {
      EXPECT_GE(written[i], Tuned::FrozenBytes()) << i;
      EXPECT_EQ(referenced[i], 0u) << i;
    }
    for (int i : {1, 2, 4}) {
      EXPECT_LT(written[i], Tuned::AdapterBytes() + 64) << i;
      EXPECT_EQ(referenced[i], Tuned::FrozenBytes()) << i;
    }
    // keep_last=2 keeps 4 and 5; 5 references 4, which is full: 1..3 went.
    EXPECT_EQ(mgr.steps(), (std::vector<int64_t>{4, 5}));
    for (int64_t s : mgr.steps()) EXPECT_TRUE(st.LoadsAs(mgr, s));
  }
  const RootInfo info = inspect_root(d.path());
  ASSERT_EQ(info.steps.size(), 2u);
  EXPECT_EQ(info.steps[0].referenced_by, (std::vector<int64_t>{5}));
  EXPECT_EQ(info.steps[1].bases, (std::vector<int64_t>{4}));
  // A restarted manager continues the chain: 6 is incremental (the second after 4), 7 full.
  CheckpointManager again(
      d.path(), ManagerOptions{.policy = {.keep_last = 2}, .incremental = true, .full_every = 3});
  st.Fill(6);
  EXPECT_EQ(again.Save(6, st.sd).bytes_referenced, Tuned::FrozenBytes());
  // keep_last=2 keeps 5 and 6; 4 stays as their base.
  EXPECT_EQ(again.steps(), (std::vector<int64_t>{4, 5, 6}));
  st.Fill(7);
  EXPECT_EQ(again.Save(7, st.sd).bytes_referenced, 0u);
  // 6 still references 4 (its frozen bytes resolve to where they are stored).
  EXPECT_EQ(again.steps(), (std::vector<int64_t>{4, 6, 7}));
  st.Fill(8);
  EXPECT_EQ(again.Save(8, st.sd).bytes_referenced, Tuned::FrozenBytes());
  EXPECT_EQ(again.steps(), (std::vector<int64_t>{7, 8}));
  EXPECT_FALSE(std::filesystem::exists(d.path() + "/step_000000004"));
  for (int64_t s : again.steps()) EXPECT_TRUE(st.LoadsAs(again, s));
}

TEST(IncrementalManager, BadFullEveryIsRefused) {
  TempDir d;
  EXPECT_THROW(CheckpointManager(d.path(), ManagerOptions{.incremental = true, .full_every = 0}),
               Error);
}

// With a memory tier, steps stay whole in memory and each drain into the root references the
// root's newest step: only what changed reaches durable storage, every drained step verifies
// and loads without the tier, and a step whose memory copy lacks a file is loaded from the
// root, never patched with the root's (differently cut) files.
TEST(IncrementalManager, DrainsFromAMemoryTierReferenceTheRoot) {
  TempDir d;
  const std::string root = d.Sub("ckpt");
  auto with_tier = [&] {
    return ManagerOptions{.policy = {.keep_last = 3},
                          .memory_tier = MemoryTierOptions{.dir = d.Sub("shm"), .keep_last = 2},
                          .incremental = true,
                          .full_every = 3};
  };
  auto own_bytes = [&](int64_t step) {
    uint64_t n = 0;
    const Metadata md = read_metadata(root + "/" + checkpoint::StepDirName(step));
    for (const auto& f : md.files) n += f.base.empty() ? f.size : 0;
    return n;
  };
  Tuned st;
  {
    CheckpointManager mgr(root, with_tier());
    for (int64_t step = 1; step <= 4; ++step) {
      st.Fill(step);
      mgr.Save(step, st.sd);
    }
    // Step 1 full, 2 and 3 against the step before, 4 full again (full_every = 3): 1 stays,
    // a base of kept steps.
    EXPECT_EQ(mgr.steps(), (std::vector<int64_t>{1, 2, 3, 4}));
  }
  EXPECT_GT(own_bytes(4), Tuned::FrozenBytes());
  for (int64_t step : {2, 3}) {
    EXPECT_LT(own_bytes(step), Tuned::AdapterBytes() + 4096) << step;
    const Metadata md = read_metadata(root + "/" + checkpoint::StepDirName(step));
    EXPECT_TRUE(std::any_of(md.files.begin(), md.files.end(), [](const FileInfo& f) {
      return f.base == "step_000000001";
    })) << step;
    EXPECT_NO_THROW(verify(root + "/" + checkpoint::StepDirName(step))) << step;
  }
  {
    CheckpointManager plain(root, ManagerOptions{.policy = {.keep_last = 3}});
    for (int64_t step : {2, 3, 4}) EXPECT_TRUE(st.LoadsAs(plain, step));
  }
  // Step 3 in memory loses its tensor file (the only host's copy); 4 goes from the root, so
  // the restore asked for is of 3.
  CheckpointManager mgr(root, with_tier());
  const std::string tier3 = tier::HostTierDir(d.Sub("shm"), root) + "/step_000000003";
  for (const auto& e : std::filesystem::directory_iterator(tier3)) {
    if (e.path().extension() == ".safetensors") std::filesystem::remove(e.path());
  }
  Tuned got;
  const LoadResult r = mgr.Load(got.sd, 3);
  EXPECT_FALSE(r.from_memory);
  EXPECT_EQ(r.fell_back, "");  // nothing was tried in memory and found wrong
  EXPECT_TRUE(got.HoldsTensorsOf(3));
}

// What a drain into an incremental root checks: the bytes it copies from memory (a damaged
// copy there would otherwise become the bytes later drains reference), and its base (one that
// cannot be read makes a whole copy, not a failure).
TEST(IncrementalManager, ADrainChecksWhatItCopiesAndCopiesWholeWithoutAUsableBase) {
  TempDir d;
  const std::string root = d.Sub("ckpt");
  CheckpointManager mgr(root, ManagerOptions{.memory_tier = MemoryTierOptions{.dir = d.Sub("shm"),
                                                                              .keep_last = 2,
                                                                              .persist_every = 0},
                                             .incremental = true});
  const std::string host = tier::HostTierDir(d.Sub("shm"), root);
  auto flip = [&](int64_t step, const std::string& fqn) {
    const std::string dir = host + "/" + checkpoint::StepDirName(step);
    const Metadata md = read_metadata(dir);
    for (const auto& t : md.tensors) {
      if (t.fqn != fqn) continue;
      const auto& c = t.chunks.front();
      std::fstream f(dir + "/" + md.files[c.file].name,
                     std::ios::in | std::ios::out | std::ios::binary);
      const auto at = static_cast<std::streamoff>(c.byte_offset + c.byte_length / 2);
      f.seekg(at);
      const char was = static_cast<char>(f.get());
      f.seekp(at);
      f.put(static_cast<char>(was ^ 0x5a));  // flipping twice restores it
      return;
    }
    FAIL() << fqn << " not found in " << dir;
  };
  auto persist_fails = [&](int64_t step) {
    try {
      mgr.Persist();
      ADD_FAILURE() << "step " << step << " drained from a damaged memory copy";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), StatusCode::kDataLoss) << e.what();
    }
    EXPECT_EQ(mgr.steps().back(), 1);
  };
  Tuned st;
  st.Fill(1);
  mgr.Save(1, st.sd);
  flip(1, "lora.weight");  // a whole copy (the root has no step yet) is checked too
  try {
    mgr.Persist();
    ADD_FAILURE() << "step 1 drained from a damaged memory copy";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), StatusCode::kDataLoss) << e.what();
  }
  EXPECT_TRUE(mgr.steps().empty());
  flip(1, "lora.weight");  // the same byte back: the copy is intact again
  mgr.Persist();           // step 1, whole
  // Step 2 changes every tensor (its file is copied whole), and its copy in memory is damaged.
  st.frozen[0] += 1;
  st.Fill(2);
  mgr.Save(2, st.sd);
  flip(2, "base.weight");
  persist_fails(2);
  // Step 3 changes the adapter only (its file is cut to it), damaged in memory too.
  st.frozen[0] -= 1;
  st.Fill(3);
  mgr.Save(3, st.sd);
  flip(3, "lora.weight");
  persist_fails(3);
  // Step 4, intact, against a base whose metadata is damaged: copied whole.
  st.Fill(4);
  mgr.Save(4, st.sd);
  {
    std::fstream f(root + "/step_000000001/dcp.metadata",
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(20);
    f.put('\x5a');
  }
  mgr.Persist();
  EXPECT_EQ(mgr.steps().back(), 4);
  const Metadata md = read_metadata(root + "/step_000000004");
  for (const auto& f : md.files) EXPECT_EQ(f.base, "") << f.name;
  Tuned got;
  load(got.sd, root + "/step_000000004");
  EXPECT_TRUE(got.HoldsTensorsOf(4));
}

// A step a load found damaged makes the next save full: an incremental one would reference
// bytes of the same bases by their recorded checksums, damaged or not.
TEST(IncrementalManager, AStepMarkedBadMakesTheNextSaveFull) {
  TempDir d;
  Tuned st;
  const ManagerOptions opts{.incremental = true, .full_every = 10};
  {
    CheckpointManager mgr(d.path(), opts);
    for (int64_t step = 1; step <= 3; ++step) {
      st.Fill(step);
      mgr.Save(step, st.sd);
    }
  }
  // Step 3's own tensor file (the adapter) damaged: the load falls back to step 2.
  const std::string step3 = d.path() + "/step_000000003/";
  for (const auto& f : testing::ListFiles(step3, "data-")) {
    if (f.ends_with(".safetensors")) {
      testing::FlipByte(step3 + f, std::filesystem::file_size(step3 + f) - 1);
    }
  }
  CheckpointManager mgr(d.path(), opts);
  Tuned got;
  const LoadResult r = mgr.Load(got.sd);
  EXPECT_EQ(r.step, 2);
  st.Fill(4);
  EXPECT_EQ(mgr.Save(4, st.sd).bytes_referenced, 0u);  // full
  st.Fill(5);
  EXPECT_EQ(mgr.Save(5, st.sd).bytes_referenced, Tuned::FrozenBytes());  // incremental again
  EXPECT_TRUE(st.LoadsAs(mgr, 5));
}

// Random sequences of saves (sync and async), prunes under random policies and restarts:
// after each, every step the manager lists loads with its own values.
TEST(IncrementalManager, EveryListedStepLoadsOverRandomSequences) {
  std::mt19937 rng(20261205);
  for (int run = 0; run < 6; ++run) {
    TempDir d;
    Tuned st;
    int64_t step = 0;
    auto open = [&] {
      RetentionPolicy p;
      if (rng() % 3) p.keep_last = 1 + static_cast<int64_t>(rng() % 3);
      if (rng() % 3 == 0) p.keep_every = 2 + static_cast<int64_t>(rng() % 3);
      return std::make_unique<CheckpointManager>(
          d.path(), ManagerOptions{.policy = p,
                                   .recycle_files = rng() % 2 == 0,
                                   .incremental = rng() % 5 != 0,
                                   .full_every = 1 + static_cast<int64_t>(rng() % 4)});
    };
    auto mgr = open();
    for (int op = 0; op < 14; ++op) {
      const unsigned what = rng() % 10;
      if (what < 6) {
        st.Fill(++step);
        mgr->Save(step, st.sd);
      } else if (what < 8) {
        st.Fill(++step);
        mgr->AsyncSave(step, st.sd);
        mgr->Wait();
      } else if (what == 8) {
        mgr->Prune();
      } else {
        mgr.reset();
        mgr = open();
      }
      for (int64_t s : mgr->steps()) {
        ASSERT_TRUE(st.LoadsAs(*mgr, s)) << "run " << run << " op " << op;
      }
    }
  }
}

// A crash at every storage operation of five incremental saves (keep_last=2, full_every=3):
// a fresh manager resumes a step no older than the last save that returned, and every step
// it lists loads with its own values.
TEST(IncrementalManager, CrashAtEveryOperation) {
  const ManagerOptions opts{.policy = {.keep_last = 2}, .incremental = true, .full_every = 3};
  auto run = [&](int64_t fail_at, int64_t* ops) {
    TempDir d;
    Tuned st;
    testfs::FaultFileSystem fs(storage::PosixFileSystem());
    fs.FailAt(fail_at);
    int64_t last_ok = 0;
    try {
      auto mgr = manager::NewManager(d.path(), opts, fs);
      for (int64_t step = 1; step <= 5; ++step) {
        st.Fill(step);
        mgr->Save(step, st.sd);
        last_ok = step;
      }
    } catch (const Error&) {
    }
    fs.SimulateCrash();  // what was not made durable is lost
    if (ops) *ops = fs.ops();
    CheckpointManager mgr(d.path(), opts);
    const std::string where = "failing at operation " + std::to_string(fail_at);
    if (last_ok > 0) {
      ASSERT_TRUE(mgr.latest_step()) << where;
      EXPECT_GE(*mgr.latest_step(), last_ok) << where;
    }
    for (int64_t s : mgr.steps()) EXPECT_TRUE(st.LoadsAs(mgr, s)) << where;
  };
  int64_t total = 0;
  run(-1, &total);
  ASSERT_GT(total, 20);
  for (int64_t k = 0; k < total; ++k) run(k, nullptr);
}

}  // namespace
}  // namespace dcp
