#include "train/model.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>

namespace gradlane::train {
namespace {

// A small random classification set: 40 rows of 6 features, 3 classes.
Dataset tiny_set() {
  Dataset d;
  d.rows = 40;
  d.features = 6;
  d.classes = 3;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(0.0F, 1.0F);
  for (std::size_t i = 0; i < d.rows * d.features; ++i) d.pixels.push_back(u(rng));
  for (std::size_t i = 0; i < d.rows; ++i) d.labels.push_back(static_cast<std::uint8_t>(i % 3));
  return d;
}

double mean_loss(const Model& m, std::span<const float> p, const Dataset& d, std::span<const std::uint32_t> rows) {
  std::vector<float> g(m.parameters());
  Workspace w;
  return m.gradient(p, d, rows, g, w);
}

// Analytic gradient vs central finite differences (in double-checked float: loose but able to
// catch a wrong sign, a missing 1/batch, a transposed matrix or a missing ReLU mask).
void check_gradient(ModelKind kind) {
  ModelSpec spec;
  spec.kind = kind;
  spec.inputs = 6;
  spec.hidden = 5;
  spec.classes = 3;
  const Model model(spec);
  const Dataset d = tiny_set();
  std::vector<float> p(model.parameters());
  model.initialise(p, 3);
  std::mt19937 rng(11);
  std::normal_distribution<float> n(0.0F, 0.3F);
  for (auto& v : p) v += n(rng);  // away from zero so softmax's gradient is not trivially small
  const std::vector<std::uint32_t> rows{0, 3, 5, 8, 13, 21, 34};
  std::vector<float> g(p.size());
  Workspace w;
  model.gradient(p, d, rows, g, w);
  const float eps = 1e-2F;
  double worst = 0.0;
  for (std::size_t i = 0; i < p.size(); ++i) {
    auto plus = p, minus = p;
    plus[i] += eps;
    minus[i] -= eps;
    const double numeric = (mean_loss(model, plus, d, rows) - mean_loss(model, minus, d, rows)) / (2.0 * eps);
    worst = std::max(worst, std::abs(numeric - g[i]));
    ASSERT_NEAR(g[i], numeric, 2e-3) << to_string(kind) << " parameter " << i;
  }
  EXPECT_LT(worst, 2e-3);
}

TEST(Model, SoftmaxGradientMatchesFiniteDifferences) { check_gradient(ModelKind::softmax); }
TEST(Model, MlpGradientMatchesFiniteDifferences) { check_gradient(ModelKind::mlp); }

TEST(Model, LayoutAndInitialisation) {
  const Model softmax(ModelSpec{});
  EXPECT_EQ(softmax.parameters(), 7850U);
  EXPECT_EQ(softmax.tensor_floats(), (std::vector<std::size_t>{7840, 10}));
  ModelSpec mlp_spec;
  mlp_spec.kind = ModelKind::mlp;
  const Model mlp(mlp_spec);
  EXPECT_EQ(mlp.parameters(), 203530U);
  std::vector<float> a(mlp.parameters()), b(mlp.parameters()), c(mlp.parameters());
  mlp.initialise(a, 1);
  mlp.initialise(b, 1);
  mlp.initialise(c, 2);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  const float bound = std::sqrt(6.0F / 784.0F);
  EXPECT_TRUE(std::all_of(a.begin(), a.begin() + 200704, [&](float v) { return std::abs(v) <= bound; }));
  EXPECT_TRUE(std::all_of(a.begin() + 200704, a.begin() + 200960, [](float v) { return v == 0.0F; }));
  EXPECT_THROW(parse_model_kind("cnn"), std::invalid_argument);
}

TEST(BatchSampler, EachEpochVisitsEveryRowOnce) {
  BatchSampler s(10, 5, 42);
  std::multiset<std::uint32_t> seen;
  for (int i = 0; i < 4; ++i) {
    for (auto r : s.next()) seen.insert(r);
  }
  EXPECT_EQ(s.epoch(), 1U);
  for (std::uint32_t r = 0; r < 10; ++r) EXPECT_EQ(seen.count(r), 2U) << r;
  BatchSampler same(10, 5, 42), other(10, 5, 43);
  const auto a = same.next();
  const std::vector<std::uint32_t> first(a.begin(), a.end());
  const auto b = other.next();
  EXPECT_NE(first, std::vector<std::uint32_t>(b.begin(), b.end()));
}

// Plain SGD on the real data learns: 400 steps of batch 64 take softmax regression from 10 %
// (zeros) past 75 % test accuracy (evaluation.md: 80 % is reached after ~500 steps at lr 0.1).
TEST(Model, SoftmaxLearnsFashionMnist) {
  const auto data = load_fashion_mnist();
  const Model model(ModelSpec{});
  std::vector<float> p(model.parameters()), g(model.parameters());
  model.initialise(p, 1);
  const auto test = data.test.slice(0, 2000);
  const double before = model.accuracy(p, test);
  BatchSampler batches(data.train.rows, 64, 1);
  Workspace w;
  for (int step = 0; step < 400; ++step) {
    model.gradient(p, data.train, batches.next(), g, w);
    sgd_step(p, g, 0.1F);
  }
  const double after = model.accuracy(p, test);
  EXPECT_LT(before, 0.15);
  EXPECT_GT(after, 0.75);
}

}  // namespace
}  // namespace gradlane::train
