#include "tier/tier_plan.h"

#include <gtest/gtest.h>

namespace dcp::tier {
namespace {

// Four hosts a..d of two ranks each, given out of order: ranks 0,1 on c; 2,3 on a; ...
Hosts FourHosts() { return Hosts::From({"c", "c", "a", "a", "d", "d", "b", "b"}); }

TEST(TierPlanTest, HostsAreInNameOrderWithTheirRanks) {
  const Hosts h = FourHosts();
  EXPECT_EQ(h.names, (std::vector<std::string>{"a", "b", "c", "d"}));
  EXPECT_EQ(h.ranks[0], (std::vector<int>{2, 3}));
  EXPECT_EQ(h.ranks[2], (std::vector<int>{0, 1}));
  EXPECT_EQ(h.host_of_rank, (std::vector<int>{2, 2, 0, 0, 3, 3, 1, 1}));
  EXPECT_EQ(h.Find("d"), 3);
  EXPECT_EQ(h.Find("e"), -1);
}

TEST(TierPlanTest, PartnersAreTheNextHostsNeverItself) {
  const Hosts h = FourHosts();
  EXPECT_EQ(PartnersOf(h, 3, 1), (std::vector<int>{0}));
  EXPECT_EQ(PartnersOf(h, 1, 2), (std::vector<int>{2, 3}));
  EXPECT_EQ(PartnersOf(h, 0, 9), (std::vector<int>{1, 2, 3}));     // only 3 other hosts
  EXPECT_TRUE(PartnersOf(Hosts::From({"x", "x"}), 0, 1).empty());  // one host: nowhere to go
}

TEST(TierPlanTest, ReplicationSendsEveryFileToEachPartnerOnce) {
  const Hosts h = FourHosts();
  std::vector<std::vector<FileRef>> files(8);
  for (int r = 0; r < 8; ++r) files[r] = {{"f" + std::to_string(r), 10u + r}};
  const auto t = PlanReplication(h, 1, files);
  ASSERT_EQ(t.size(), 8u);
  for (const Transfer& x : t) {
    EXPECT_EQ(x.file, "f" + std::to_string(x.from));
    // To the next host, the rank at the same position there.
    const int from_host = h.host_of_rank[x.from];
    EXPECT_EQ(h.host_of_rank[x.to], (from_host + 1) % 4);
    EXPECT_EQ(x.from % 2, x.to % 2);
  }
  EXPECT_TRUE(std::is_sorted(t.begin(), t.end(), [](const Transfer& a, const Transfer& b) {
    return std::tie(a.from, a.to, a.file) < std::tie(b.from, b.to, b.file);
  }));
  EXPECT_EQ(PlanReplication(h, 2, files).size(), 16u);  // replicas x files
}

// Host `h` holds step `step` with metadata `digest` naming files f0..f2, of which `present`.
StepCopy Copy(int64_t step, uint64_t digest, std::vector<int> present) {
  StepCopy c;
  c.step = step;
  c.metadata_digest = digest;
  for (int i = 0; i < 3; ++i) c.required.push_back({"f" + std::to_string(i), 100});
  for (int i : present) c.present.push_back({"f" + std::to_string(i), 100});
  if (digest == 0) c.required.clear();
  return c;
}

TEST(TierPlanTest, InventoryRoundTrips) {
  Inventory inv{Copy(5, 77, {0, 2}), Copy(6, 0, {1})};
  auto back = DecodeInventory(EncodeInventory(inv));
  ASSERT_TRUE(back.ok());
  ASSERT_EQ(back->size(), 2u);
  EXPECT_EQ((*back)[0].present, inv[0].present);
  EXPECT_EQ((*back)[0].required, inv[0].required);
  EXPECT_EQ((*back)[1].metadata_digest, 0u);
  EXPECT_FALSE(DecodeInventory(EncodeInventory(inv) + "x").ok());
}

TEST(TierPlanTest, ChoosesTheNewestStepWhoseFilesSomeHostHolds) {
  // Step 7: f2 nowhere (its only holder died); step 6: spread over the hosts.
  std::vector<Inventory> hosts = {{Copy(7, 9, {0}), Copy(6, 8, {0, 1})},
                                  {Copy(7, 9, {1}), Copy(6, 8, {1, 2})},
                                  {Copy(6, 8, {2, 0})}};
  auto m = ChooseMemoryStep(hosts, {}, {});
  ASSERT_TRUE(m);
  EXPECT_EQ(m->step, 6);
  EXPECT_EQ(m->holders[0], (std::vector<int>{0, 2}));
  EXPECT_EQ(m->holders[2], (std::vector<int>{1, 2}));
  EXPECT_EQ(RestorableSteps(hosts, {}), (std::vector<int64_t>{6}));
  // Step 7 durable in the root: its missing file comes from storage.
  m = ChooseMemoryStep(hosts, {}, {7});
  ASSERT_TRUE(m);
  EXPECT_EQ(m->step, 7);
  EXPECT_EQ(m->from_storage, (std::vector<bool>{false, false, true}));
  EXPECT_EQ(m->bytes_from_storage, 100u);
  // Bad copies are passed over: f0 of step 6 bad on both hosts -> nothing left.
  std::set<BadCopy> bad = {{0, 6, "f0"}, {2, 6, "f0"}};
  EXPECT_FALSE(ChooseMemoryStep(hosts, bad, {}));
  bad = {{0, 6, "f0"}};
  m = ChooseMemoryStep(hosts, bad, {});
  ASSERT_TRUE(m);
  EXPECT_EQ(m->holders[0], (std::vector<int>{2}));
}

TEST(TierPlanTest, MetadataOfTheMajorityWinsAndOtherCopiesDoNotCount) {
  // Host 1 holds a different save of step 5 (another metadata): its files do not count.
  std::vector<Inventory> hosts = {{Copy(5, 1, {0})},
                                  {Copy(5, 2, {1, 2})},
                                  {Copy(5, 1, {1})},
                                  {Copy(5, 0, {2})}};  // host 3: files, no metadata yet
  auto m = ChooseMemoryStep(hosts, {}, {});
  ASSERT_TRUE(m);
  EXPECT_EQ(m->metadata_digest, 1u);
  EXPECT_EQ(m->metadata_hosts, (std::vector<int>{0, 2}));
  EXPECT_EQ(m->holders[1], (std::vector<int>{2}));
  EXPECT_EQ(m->holders[2], (std::vector<int>{3}));
}

// A tie between two metadata copies of one step (one of another save: stale) goes to the
// first host's -- unless its files are not all held: then the other, complete, copy is the
// step, never an older step.
TEST(TierPlanTest, AnIncompleteCopyOfAStepDoesNotHideACompleteOne) {
  StepCopy stale = Copy(7, 11, {});  // its own files gone
  std::vector<Inventory> hosts{{stale, Copy(6, 22, {0, 1, 2})}, {Copy(7, 33, {0, 1, 2})}};
  auto m = ChooseMemoryStep(hosts, {}, {});
  ASSERT_TRUE(m);
  EXPECT_EQ(m->step, 7);
  EXPECT_EQ(m->metadata_digest, 33u);
  EXPECT_EQ(m->metadata_hosts, (std::vector<int>{1}));
  // Both complete: the first host's, as before (the restore then keeps the other beside it).
  hosts[0][0] = Copy(7, 11, {0, 1, 2});
  hosts[0][0].required[0].name = "g0";
  hosts[0][0].present[0].name = "g0";
  m = ChooseMemoryStep(hosts, {}, {});
  ASSERT_TRUE(m);
  EXPECT_EQ(m->metadata_digest, 11u);
  // A damaged copy of its file: the other.
  m = ChooseMemoryStep(hosts, {{0, 7, "g0"}}, {});
  ASSERT_TRUE(m);
  EXPECT_EQ(m->metadata_digest, 33u);
}

// Two complete copies of step 7 under different metadata (one of another save): the durable
// copy's digest decides, whatever the host order.
TEST(TierPlanTest, TheDurableCopysMetadataSettlesADispute) {
  std::vector<Inventory> hosts{{Copy(7, 11, {0, 1, 2}), Copy(6, 5, {0, 1, 2})},
                               {Copy(7, 33, {0, 1, 2}), Copy(6, 5, {0, 1, 2})}};
  EXPECT_EQ(DisputedSteps(hosts), (std::vector<int64_t>{7}));
  EXPECT_EQ(ChooseMemoryStep(hosts, {}, {7})->metadata_digest, 11u);  // the first host's
  auto m = ChooseMemoryStep(hosts, {}, {7}, INT64_MAX, {{7, 33}});
  ASSERT_TRUE(m);
  EXPECT_EQ(m->metadata_digest, 33u);
  EXPECT_EQ(m->holders[0], (std::vector<int>{1}));  // the other save's files do not count
  // The durable copy is neither host's: no memory copy is this step (the root's is loaded).
  m = ChooseMemoryStep(hosts, {}, {7}, INT64_MAX, {{7, 99}});
  ASSERT_TRUE(m);
  EXPECT_EQ(m->step, 6);
}

TEST(TierPlanTest, RestoreReadsLocalCopiesAndBalancesSenders) {
  const Hosts h = Hosts::From({"a", "b", "c"});
  MemoryStep m;
  m.step = 3;
  m.files = {{"f0", 100}, {"f1", 100}, {"f2", 100}, {"f3", 50}};
  m.holders = {{0, 1}, {1, 2}, {0, 2}, {}};  // f3 from storage
  m.from_storage = {false, false, false, true};
  // Every host needs every file whole.
  NeededSpans all;
  for (uint32_t f = 0; f < 4; ++f) all[f] = {{0, m.files[f].size}};
  std::vector<NeededSpans> need(3, all);
  const RestorePlan p = PlanRestore(h, m, need);
  // Each host lacks one of f0..f2 and f3: 3 network fetches, 3 storage copies.
  int from_storage = 0, network = 0;
  for (const Transfer& t : p.fetches) {
    if (t.from == kFromStorage) {
      ++from_storage;
      EXPECT_EQ(t.file, "f3");
    } else {
      ++network;
      EXPECT_NE(h.host_of_rank[t.from], h.host_of_rank[t.to]);
    }
  }
  EXPECT_EQ(from_storage, 3);
  EXPECT_EQ(network, 3);
  // Host 0 reads f0 and f2 where they lie: it receives f1 and f3 only.
  for (const Transfer& t : p.fetches) {
    if (h.host_of_rank[t.to] == 0) {
      EXPECT_TRUE(t.file == "f1" || t.file == "f3") << t.file;
    }
  }
  // No host sends twice while another holder sends nothing.
  std::vector<int> sent(3, 0);
  for (const Transfer& t : p.fetches) {
    if (t.from >= 0) ++sent[h.host_of_rank[t.from]];
  }
  EXPECT_EQ(sent, (std::vector<int>{1, 1, 1}));
}

TEST(TierPlanTest, OnlyTheNeededSpansMoveUnlessTheyAreMostOfTheFile) {
  const Hosts h = Hosts::From({"a", "b"});
  MemoryStep m;
  m.step = 1;
  m.files = {{"f0", 1000}, {"f1", 1000}};
  m.holders = {{0}, {0}};
  m.from_storage = {false, false};
  std::vector<NeededSpans> need(2);
  need[1][0] = {{500, 100}, {0, 100}, {90, 20}};  // 210 bytes of 1000, out of order
  need[1][1] = {{0, 800}};                        // most of it: the whole file moves
  const RestorePlan p = PlanRestore(h, m, need);
  ASSERT_EQ(p.fetches.size(), 2u);
  EXPECT_EQ(p.fetches[0].spans, (std::vector<Span>{{0, 110}, {500, 100}}));
  EXPECT_EQ(p.fetches[0].bytes(), 210u);
  EXPECT_TRUE(p.fetches[1].spans.empty());
  EXPECT_EQ(p.fetches[1].bytes(), 1000u);
  EXPECT_EQ(storage::MergeRanges({{10, 5}, {15, 5}, {0, 0}}), (std::vector<Span>{{10, 10}}));
}

}  // namespace
}  // namespace dcp::tier
