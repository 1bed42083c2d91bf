#include "workload/layout_spec.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>

namespace dcp::workload {
namespace {

TEST(ParseLayoutTest, Valid) {
  for (const char* text : {"dp4", "tp4", "ep4", "tp2,dp2", "dp2,tp2", "tp2,ep2", "dp1", "tp16"}) {
    auto l = ParseLayout(text);
    ASSERT_TRUE(l.ok()) << text << ": " << l.status().ToString();
    EXPECT_EQ(l->ToString(), text);
  }
  auto l = ParseLayout("dp2,tp3");
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->dims, (std::vector<MeshDim>{{MeshAxis::kDp, 2}, {MeshAxis::kTp, 3}}));
  EXPECT_EQ(l->MeshShape(), (std::vector<int>{2, 3}));
  EXPECT_EQ(l->WorldSize(), 6);
}

TEST(ParseLayoutTest, Invalid) {
  for (const char* text : {"", "tp", "tp0", "tp-1", "xp2", "tp2,tp2", "tp2,", ",tp2", "tp2 ,dp2",
                           "tp2x", "TP2", "tp99999999999", "tp65536,dp65536"}) {
    auto l = ParseLayout(text);
    ASSERT_FALSE(l.ok()) << "'" << text << "' parsed";
    EXPECT_EQ(l.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(l.status().message().find("layout '"), std::string::npos);
  }
}

// All ranks' chunks of each tensor must tile it: the distinct boxes are disjoint, lie
// inside the tensor and cover all of it; identical boxes on several ranks are replicas.
// Returns, per tensor, how many ranks hold each distinct box.
std::vector<std::map<Box, int>> CheckTiling(const ModelSpec& model, const LayoutSpec& layout) {
  std::vector<std::map<Box, int>> holders(model.tensors.size());
  for (int r = 0; r < layout.WorldSize(); ++r) {
    auto chunks = ChunksForRank(model, layout, r);
    EXPECT_TRUE(chunks.ok()) << chunks.status().ToString();
    if (!chunks.ok()) return holders;
    size_t prev = 0;
    for (size_t k = 0; k < chunks->size(); ++k) {
      const auto& [i, box] = (*chunks)[k];
      EXPECT_TRUE(k == 0 || i > prev) << "not in tensor order / duplicate tensor";
      prev = i;
      EXPECT_FALSE(box.Empty());
      holders[i][box]++;
    }
  }
  for (size_t i = 0; i < model.tensors.size(); ++i) {
    const TensorSpec& t = model.tensors[i];
    EXPECT_FALSE(holders[i].empty()) << t.fqn << " is held by no rank in " << layout.ToString();
    uint64_t covered = 0;
    for (auto a = holders[i].begin(); a != holders[i].end(); ++a) {
      EXPECT_TRUE(a->first.WithinShape(t.shape)) << t.fqn << " " << a->first.ToString();
      covered += a->first.NumElements();
      for (auto b = std::next(a); b != holders[i].end(); ++b) {
        EXPECT_FALSE(Intersect(a->first, b->first).has_value())
            << t.fqn << ": " << a->first.ToString() << " overlaps " << b->first.ToString();
      }
    }
    EXPECT_EQ(covered, *t.shape.NumElements()) << t.fqn << " in " << layout.ToString();
  }
  return holders;
}

class LayoutTilingTest : public ::testing::TestWithParam<const char*> {};

TEST_P(LayoutTilingTest, QwenChunksTileEveryTensor) {
  auto model = MakeModel("qwen3-30b-a3b", 2, 1.0 / 32, DType::kBF16);
  auto layout = ParseLayout(GetParam());
  ASSERT_TRUE(model.ok() && layout.ok());
  const auto holders = CheckTiling(*model, *layout);
  int tp = 1, ep = 1, dp = 1;
  for (const MeshDim& d : layout->dims) {
    (d.axis == MeshAxis::kTp ? tp : d.axis == MeshAxis::kEp ? ep : dp) = d.size;
  }
  for (size_t i = 0; i < model->tensors.size(); ++i) {
    const TensorSpec& t = model->tensors[i];
    // Distinct pieces: tp shards split tp_dim (all extents here divide evenly by 4).
    const size_t pieces = t.tp_dim >= 0 ? tp : 1;
    EXPECT_EQ(holders[i].size(), pieces) << t.fqn;
    // Replicas of each piece: dp always, ep only for non-expert tensors.
    const int replicas = dp * (t.expert >= 0 ? 1 : ep) * (t.tp_dim >= 0 ? 1 : tp);
    for (const auto& [box, n] : holders[i]) EXPECT_EQ(n, replicas) << t.fqn << box.ToString();
  }
}

TEST_P(LayoutTilingTest, LlamaChunksTileEveryTensor) {
  auto model = MakeModel("llama-dense", 2, 1.0 / 64, DType::kF32);
  auto layout = ParseLayout(GetParam());
  ASSERT_TRUE(model.ok() && layout.ok());
  CheckTiling(*model, *layout);
}

INSTANTIATE_TEST_SUITE_P(Layouts, LayoutTilingTest,
                         ::testing::Values("dp4", "tp2,dp2", "dp2,tp2", "tp4", "ep4", "tp2,ep2",
                                           "ep2,tp2", "tp2,ep2,dp2"));

TEST(ChunksForRankTest, TpShardsColumnAndRowParallel) {
  auto model = MakeModel("qwen3-30b-a3b", 1, 1.0, DType::kBF16);
  auto layout = ParseLayout("dp2,tp2");
  ASSERT_TRUE(model.ok() && layout.ok());
  // Rank 3 = (dp 1, tp 1).
  auto chunks = ChunksForRank(*model, *layout, 3);
  ASSERT_TRUE(chunks.ok());
  ASSERT_EQ(chunks->size(), model->tensors.size());
  auto box_of = [&](std::string_view fqn) {
    for (const auto& [i, box] : *chunks) {
      if (model->tensors[i].fqn == fqn) return box;
    }
    return Box{};
  };
  EXPECT_EQ(box_of("model.layers.0.self_attn.q_proj.weight"), (Box{{2048, 0}, {2048, 2048}}));
  EXPECT_EQ(box_of("model.layers.0.self_attn.o_proj.weight"), (Box{{0, 2048}, {2048, 2048}}));
  EXPECT_EQ(box_of("model.layers.0.mlp.experts.5.down_proj.weight"), (Box{{0, 384}, {2048, 384}}));
  EXPECT_EQ(box_of("model.layers.0.mlp.gate.weight"), Box::Whole({128, 2048}));
  EXPECT_EQ(box_of("lm_head.weight"), (Box{{75968, 0}, {75968, 2048}}));
}

TEST(ChunksForRankTest, EpDealsContiguousExpertBlocks) {
  auto model = MakeModel("qwen3-30b-a3b", 1, 1.0 / 64, DType::kBF16);
  auto layout = ParseLayout("ep4");
  ASSERT_TRUE(model.ok() && layout.ok());
  for (int r = 0; r < 4; ++r) {
    auto chunks = ChunksForRank(*model, *layout, r);
    ASSERT_TRUE(chunks.ok());
    int experts = 0;
    for (const auto& [i, box] : *chunks) {
      const TensorSpec& t = model->tensors[i];
      EXPECT_EQ(box, Box::Whole(t.shape)) << t.fqn;
      if (t.expert < 0) continue;
      ++experts;
      EXPECT_GE(t.expert, 32 * r);
      EXPECT_LT(t.expert, 32 * (r + 1));
    }
    EXPECT_EQ(experts, 32 * 3);
    EXPECT_EQ(chunks->size(), 32u * 3 + 9 + 3);
  }
}

ModelSpec Custom(std::vector<TensorSpec> tensors, int experts = 0) {
  ModelSpec m;
  m.name = "custom";
  m.num_layers = 1;
  m.num_experts = experts;
  m.tensors = std::move(tensors);
  return m;
}

TEST(ChunksForRankTest, UnevenTpFollowsTorchChunkWithEmptyTail) {
  const ModelSpec model = Custom({
      {"six", DType::kF32, {6}, 0, -1},      // 2,2,2,0
      {"five", DType::kF32, {5, 3}, 0, -1},  // 2,2,1,0
      {"ten", DType::kF32, {3, 10}, 1, -1},  // 3,3,3,1
      {"scalar", DType::kF32, Shape{}, -1, -1},
  });
  auto layout = ParseLayout("tp4");
  ASSERT_TRUE(layout.ok());
  std::vector<std::vector<HeldChunk>> per_rank;
  for (int r = 0; r < 4; ++r) {
    auto c = ChunksForRank(model, *layout, r);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    per_rank.push_back(*c);
  }
  // Ranks 0-2 hold a piece of each tensor; rank 3's pieces of "six" and "five" are empty
  // and left out.
  EXPECT_EQ(per_rank[0][0], (HeldChunk{0, Box{{0}, {2}}}));
  EXPECT_EQ(per_rank[2][0], (HeldChunk{0, Box{{4}, {2}}}));
  EXPECT_EQ(per_rank[2][1], (HeldChunk{1, Box{{4, 0}, {1, 3}}}));
  ASSERT_EQ(per_rank[3].size(), 2u);
  EXPECT_EQ(per_rank[3][0], (HeldChunk{2, Box{{0, 9}, {3, 1}}}));
  EXPECT_EQ(per_rank[3][1], (HeldChunk{3, Box{Shape{}, Shape{}}}));
  CheckTiling(model, *layout);
}

TEST(ChunksForRankTest, EpWithUnevenAndTooFewExperts) {
  std::vector<TensorSpec> tensors;
  for (int e = 0; e < 5; ++e) tensors.push_back({"e" + std::to_string(e), DType::kU8, {8}, 0, e});
  const ModelSpec five = Custom(tensors, 5);
  auto ep2 = ParseLayout("ep2");
  ASSERT_TRUE(ep2.ok());
  auto r0 = ChunksForRank(five, *ep2, 0);
  auto r1 = ChunksForRank(five, *ep2, 1);
  ASSERT_TRUE(r0.ok() && r1.ok());
  EXPECT_EQ(r0->size(), 3u);  // experts 0, 1, 2
  EXPECT_EQ(r1->size(), 2u);  // experts 3, 4
  EXPECT_EQ((*r1)[0].first, 3u);
  CheckTiling(five, *ep2);

  // More ep ranks than experts: some ranks own none, every expert still has an owner.
  const ModelSpec two = Custom({tensors[0], tensors[1]}, 2);
  auto ep4 = ParseLayout("ep4,tp2");
  ASSERT_TRUE(ep4.ok());
  CheckTiling(two, *ep4);
}

TEST(ChunksForRankTest, InvalidArguments) {
  auto model = MakeModel("llama-dense", 1, 0.01, DType::kBF16);
  auto layout = ParseLayout("tp2,dp2");
  ASSERT_TRUE(model.ok() && layout.ok());
  EXPECT_EQ(ChunksForRank(*model, *layout, 4).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ChunksForRank(*model, *layout, -1).status().code(), StatusCode::kInvalidArgument);

  const ModelSpec bad_dim = Custom({{"w", DType::kF32, {4}, 1, -1}});
  auto r = ChunksForRank(bad_dim, *layout, 0);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("tensor w"), std::string::npos) << r.status().message();

  const ModelSpec bad_expert = Custom({{"w", DType::kF32, {4}, 0, 3}}, 2);
  EXPECT_EQ(ChunksForRank(bad_expert, *layout, 0).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dcp::workload
