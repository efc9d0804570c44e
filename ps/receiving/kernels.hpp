// Numeric kernels of the parameter server: apply an update to a model shard, sum updates.
//
// They run in place over registered memory (the slot an update landed in, the shard a worker
// pulls), so they take spans, allocate nothing and copy nothing. Each is element-wise with a
// fixed order of IEEE operations per element and no fused multiply-add, so the server, its
// replica and any checker computing the same thing get bitwise the same floats: that is what
// lets a replica be compared with its server by a hash. (The library is built without
// -ffast-math and without -march, and ISO C++ mode keeps GCC from contracting a*b+c.)
//
// A size mismatch throws gradlane::Error(Errc::invalid_argument) before anything is written.
#pragma once

#include <span>

namespace gradlane::ps {

// model[i] = model[i] - learning_rate * gradient[i]
void sgd_step(std::span<float> model, std::span<const float> gradient, float learning_rate);

// velocity[i] = momentum * velocity[i] + gradient[i];  model[i] = model[i] - learning_rate * velocity[i]
void sgd_momentum_step(std::span<float> model, std::span<float> velocity, std::span<const float> gradient,
                       float learning_rate, float momentum);

// out[i] = ((parts[0][i] + parts[1][i]) + parts[2][i]) + … in exactly that order, so whoever sums
// the same parts in the same order gets the same bits. Each part is read once. At least one
// part; every part as long as out. out may be parts[0] itself (accumulate in place into the
// first update) but must not overlap any other part.
void sum_in_order(std::span<float> out, std::span<const std::span<const float>> parts);

}  // namespace gradlane::ps
