// The kernels against plain scalar loops doing the same IEEE operations in the same order:
// results must be bitwise equal (this is what lets a replica or a checker reproduce a sum),
// for lengths that are and are not multiples of the SIMD width and of the kernels' block.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <random>
#include <vector>

#include "gradlane/error.hpp"
#include "ps/receiving/kernels.hpp"

namespace gradlane::ps {
namespace {

// 0, 1, SIMD-odd lengths, and around the 16384-float block of the blocked kernels.
const std::size_t kLengths[] = {0, 1, 3, 7, 8, 17, 31, 1000, 16383, 16384, 16385, 3 * 16384 + 5, 100003};

std::vector<float> random_floats(std::size_t n, std::mt19937& rng) {
  // Wide exponents and both signs, so rounding differences would show.
  std::uniform_real_distribution<float> mantissa(-1.0F, 1.0F);
  std::uniform_int_distribution<int> exponent(-20, 20);
  std::vector<float> v(n);
  for (float& x : v) x = std::ldexp(mantissa(rng), exponent(rng));
  return v;
}

// Bitwise, so -0.0 vs 0.0 and NaN payloads would count as different.
::testing::AssertionResult bitwise_equal(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "sizes " << got.size() << " vs " << want.size();
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0) {
      return ::testing::AssertionFailure() << "element " << i << ": " << got[i] << " vs " << want[i];
    }
  }
  return ::testing::AssertionSuccess();
}

// The references: one rounded IEEE operation per statement, in the kernel's order. GCC could
// only break this by contracting a product and a sum into an FMA: it does not in ISO mode
// (-std=c++20 implies -ffp-contract=off), and without -march x86-64 has no FMA instruction.
void reference_sgd(std::vector<float>& model, const std::vector<float>& g, float lr) {
  for (std::size_t i = 0; i < model.size(); ++i) {
    const float step = lr * g[i];
    model[i] = model[i] - step;
  }
}

TEST(Kernels, SgdStepIsBitwiseTheScalarLoop) {
  std::mt19937 rng(1);
  for (const std::size_t n : kLengths) {
    SCOPED_TRACE(n);
    std::vector<float> model = random_floats(n, rng), want = model;
    const std::vector<float> g = random_floats(n, rng);
    sgd_step(model, g, 0.01F);
    reference_sgd(want, g, 0.01F);
    EXPECT_TRUE(bitwise_equal(model, want));
  }
}

TEST(Kernels, SgdMomentumStepIsBitwiseTheScalarLoop) {
  std::mt19937 rng(2);
  for (const std::size_t n : kLengths) {
    SCOPED_TRACE(n);
    std::vector<float> model = random_floats(n, rng), velocity = random_floats(n, rng);
    std::vector<float> want_model = model, want_velocity = velocity;
    const std::vector<float> g = random_floats(n, rng);
    for (int round = 0; round < 3; ++round) {
      sgd_momentum_step(model, velocity, g, 0.05F, 0.9F);
      for (std::size_t i = 0; i < n; ++i) {
        const float decayed = 0.9F * want_velocity[i];
        want_velocity[i] = decayed + g[i];
        const float step = 0.05F * want_velocity[i];
        want_model[i] = want_model[i] - step;
      }
    }
    EXPECT_TRUE(bitwise_equal(velocity, want_velocity));
    EXPECT_TRUE(bitwise_equal(model, want_model));
  }
}

std::vector<float> reference_sum(const std::vector<std::vector<float>>& parts) {
  std::vector<float> out = parts[0];
  for (std::size_t j = 1; j < parts.size(); ++j) {
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = out[i] + parts[j][i];
  }
  return out;
}

std::vector<std::span<const float>> spans(const std::vector<std::vector<float>>& parts) {
  return {parts.begin(), parts.end()};
}

TEST(Kernels, SumInOrderIsBitwiseTheLeftToRightScalarSum) {
  std::mt19937 rng(3);
  for (std::size_t k = 1; k <= 17; ++k) {  // every grouping of the 4-then-3 passes
    for (const std::size_t n : kLengths) {
      SCOPED_TRACE(::testing::Message() << "k " << k << " n " << n);
      std::vector<std::vector<float>> parts;
      for (std::size_t j = 0; j < k; ++j) parts.push_back(random_floats(n, rng));
      std::vector<float> out(n, -1.0F);
      sum_in_order(out, spans(parts));
      ASSERT_TRUE(bitwise_equal(out, reference_sum(parts)));
    }
  }
}

TEST(Kernels, SumInOrderReallyDependsOnTheOrder) {
  // The property the bitwise test relies on: with these values another order gives other bits,
  // so a kernel that summed in another order would fail it.
  const std::vector<std::vector<float>> parts = {{1e8F}, {1.0F}, {-1e8F}, {1.0F}};
  std::vector<float> out(1);
  sum_in_order(out, spans(parts));
  EXPECT_EQ(out[0], 1.0F);  // (1e8 + 1) rounds to 1e8; - 1e8 = 0; + 1 = 1
  const std::vector<std::vector<float>> reordered = {{1e8F}, {-1e8F}, {1.0F}, {1.0F}};
  sum_in_order(out, spans(reordered));
  EXPECT_EQ(out[0], 2.0F);
}

TEST(Kernels, SumInOrderAccumulatesInPlaceIntoTheFirstPart) {
  std::mt19937 rng(4);
  for (std::size_t k = 1; k <= 9; ++k) {
    std::vector<std::vector<float>> parts;
    for (std::size_t j = 0; j < k; ++j) parts.push_back(random_floats(5000, rng));
    const std::vector<float> want = reference_sum(parts);
    sum_in_order(parts[0], spans(parts));
    EXPECT_TRUE(bitwise_equal(parts[0], want)) << "k " << k;
  }
}

template <typename F>
void expect_invalid(F&& f, const std::string& mentions) {
  try {
    f();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument);
    EXPECT_NE(std::string(e.what()).find(mentions), std::string::npos) << e.what();
  }
}

TEST(Kernels, SizeMismatchesAreRefusedBeforeWriting) {
  std::vector<float> model(8, 1.0F), velocity(8, 0.0F), short_g(7, 1.0F), g(8, 1.0F);
  expect_invalid([&] { sgd_step(model, short_g, 1.0F); }, "gradient has 7 floats but the model has 8");
  expect_invalid([&] { sgd_momentum_step(model, std::span<float>(velocity).first(5), g, 1.0F, 0.9F); },
                 "velocity has 5 floats but the model has 8");
  expect_invalid([&] { sgd_momentum_step(model, velocity, short_g, 1.0F, 0.9F); }, "gradient has 7");
  const std::vector<std::vector<float>> parts = {g, g, short_g};
  std::vector<float> out(8, 3.0F);
  expect_invalid([&] { sum_in_order(out, spans(parts)); }, "part 2 has 7 floats but out has 8");
  expect_invalid([&] { sum_in_order(out, {}); }, "no parts");
  EXPECT_EQ(model, std::vector<float>(8, 1.0F));
  EXPECT_EQ(velocity, std::vector<float>(8, 0.0F));
  EXPECT_EQ(out, std::vector<float>(8, 3.0F));
}

TEST(Kernels, SumInOrderRefusesAnOutputOverlappingALaterPart) {
  std::vector<float> buffer(16, 1.0F);
  const std::span<float> all(buffer);
  const std::vector<std::span<const float>> parts = {all.subspan(8, 8), all.subspan(4, 8)};
  expect_invalid([&] { sum_in_order(all.first(8), parts); }, "overlaps part 1");
  const std::vector<std::span<const float>> first_shifted = {all.subspan(4, 8), all.subspan(8, 8)};
  expect_invalid([&] { sum_in_order(all.first(8), first_shifted); }, "overlaps part 0");
  EXPECT_EQ(buffer, std::vector<float>(16, 1.0F));
}

}  // namespace
}  // namespace gradlane::ps
