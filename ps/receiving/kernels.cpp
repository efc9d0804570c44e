#include "ps/receiving/kernels.hpp"

#include <Eigen/Core>
#include <algorithm>
#include <cstddef>
#include <functional>
#include <string>

#include "gradlane/error.hpp"

namespace gradlane::ps {
namespace {

using Array = Eigen::Map<Eigen::ArrayXf>;
using ConstArray = Eigen::Map<const Eigen::ArrayXf>;

// Floats per block of the blocked loops: the block of `out` (or of the velocity) stays in L2
// (≥ 256 KiB on any current core) while every input streams through it once. Measured on the
// CI machine with k = 16: 16 KiB blocks 22.5 GiB/s read, 64 KiB 28.7, 256 KiB 31 — short
// blocks restart the hardware prefetcher on each of the k streams too often.
constexpr std::size_t kBlock = 16384;  // 64 KiB

Array array(std::span<float> s, std::size_t begin, std::size_t n) {
  return Array(s.data() + begin, static_cast<Eigen::Index>(n));
}
ConstArray array(std::span<const float> s, std::size_t begin, std::size_t n) {
  return ConstArray(s.data() + begin, static_cast<Eigen::Index>(n));
}

void require_same_size(const char* kernel, const char* what, std::size_t expected, const char* other, std::size_t got) {
  if (expected == got) return;
  throw Error(Errc::invalid_argument, std::string(kernel) + ": " + other + " has " + std::to_string(got) +
                                          " floats but " + what + " has " + std::to_string(expected) +
                                          "; they must be the same length");
}

bool overlap(std::span<const float> a, std::span<const float> b) {
  // std::less gives a total order even over pointers into unrelated objects.
  const std::less<const float*> before;
  return before(a.data(), b.data() + b.size()) && before(b.data(), a.data() + a.size());
}

}  // namespace

void sgd_step(std::span<float> model, std::span<const float> gradient, float learning_rate) {
  require_same_size("sgd_step", "the model", model.size(), "the gradient", gradient.size());
  // One pass, one load of each operand per element: memory bound, as it should be.
  array(model, 0, model.size()) -= learning_rate * array(gradient, 0, gradient.size());
}

void sgd_momentum_step(std::span<float> model, std::span<float> velocity, std::span<const float> gradient,
                       float learning_rate, float momentum) {
  require_same_size("sgd_momentum_step", "the model", model.size(), "the velocity", velocity.size());
  require_same_size("sgd_momentum_step", "the model", model.size(), "the gradient", gradient.size());
  // Blocked so the velocity block just written is still in cache when the model reads it.
  for (std::size_t begin = 0; begin < model.size(); begin += kBlock) {
    const std::size_t n = std::min(kBlock, model.size() - begin);
    Array v = array(velocity, begin, n);
    v = momentum * v + array(gradient, begin, n);
    array(model, begin, n) -= learning_rate * v;
  }
}

void sum_in_order(std::span<float> out, std::span<const std::span<const float>> parts) {
  if (parts.empty()) throw Error(Errc::invalid_argument, "sum_in_order: no parts to sum");
  for (std::size_t j = 0; j < parts.size(); ++j) {
    const std::string name = "part " + std::to_string(j);
    require_same_size("sum_in_order", "out", out.size(), name.c_str(), parts[j].size());
    const bool in_place = j == 0 && parts[0].data() == out.data();
    if (!in_place && overlap(out, parts[j])) {
      throw Error(Errc::invalid_argument, "sum_in_order: out overlaps " + name +
                                              "; out may only be parts[0] itself or disjoint from every part");
    }
  }
  // Per block, up to four parts are folded in per pass over the block of out, each pass one
  // Eigen expression whose per-element evaluation order is exactly the parenthesisation
  // written. Every part is read once from memory; out's block stays in cache between passes.
  for (std::size_t begin = 0; begin < out.size(); begin += kBlock) {
    const std::size_t n = std::min(kBlock, out.size() - begin);
    auto part = [&](std::size_t j) { return array(parts[j], begin, n); };
    Array o = array(out, begin, n);
    switch (std::min<std::size_t>(parts.size(), 4)) {
      case 1:
        if (parts[0].data() != out.data()) o = part(0);
        break;
      case 2:
        o = part(0) + part(1);
        break;
      case 3:
        o = (part(0) + part(1)) + part(2);
        break;
      default:
        o = ((part(0) + part(1)) + part(2)) + part(3);
        break;
    }
    for (std::size_t j = 4; j < parts.size(); j += 3) {
      switch (std::min<std::size_t>(parts.size() - j, 3)) {
        case 1:
          o = o + part(j);
          break;
        case 2:
          o = (o + part(j)) + part(j + 1);
          break;
        default:
          o = ((o + part(j)) + part(j + 1)) + part(j + 2);
          break;
      }
    }
  }
}

}  // namespace gradlane::ps
