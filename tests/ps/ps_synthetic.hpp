// The synthetic model of ps_node: the initial shard and each worker's gradient for a step,
// deterministic so a test can recompute the model the server must have reached.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gradlane::examples {

// Uniform, so that with uniform gradients every model version is uniform too.
inline float initial_value(std::size_t /*j*/) { return 0.5F; }

// gradient=uniform: every float of an update is the same value, so every model version is
// uniform too (a pull that mixed two versions shows as unequal floats).
inline float gradient_value(std::uint64_t worker, std::uint64_t step, std::size_t j, bool uniform) {
  const float base = static_cast<float>((worker * 131 + step * 17) % 23) * 0.125F - 1.0F;
  return uniform ? base : base + static_cast<float>(j % 13) * 0.0625F;
}

inline constexpr float kLearningRate = 0.05F;

}  // namespace gradlane::examples
