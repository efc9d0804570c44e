// The models trained on Fashion-MNIST, in Eigen, over one flat float vector of parameters —
// the layout the parameter server shards and the worker's registered buffers hold, so a
// gradient is computed straight into the buffer that is pushed (no copy).
//   softmax:  logits = x·W + b                            (784·10 + 10 = 7,850 floats)
//   mlp:      h = relu(x·W1 + b1), logits = h·W2 + b2      (784-256-10: 203,530 floats)
// Matrices are row-major in the flat vector, in the order W1, b1[, W2, b2].
#pragma once

#include <Eigen/Core>

#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "train/dataset.hpp"

namespace gradlane::train {

enum class ModelKind : std::uint8_t { softmax, mlp };

// "softmax" or "mlp"; throws std::invalid_argument naming the accepted ones.
ModelKind parse_model_kind(const std::string& name);
const char* to_string(ModelKind kind);

struct ModelSpec {
  ModelKind kind = ModelKind::softmax;
  std::size_t inputs = 784;
  std::size_t hidden = 256;  // mlp only
  std::size_t classes = 10;
};

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// Scratch matrices of one caller (a worker thread), reused across batches so the training loop
// does not allocate.
struct Workspace {
  RowMatrix x;       // batch × inputs
  RowMatrix hidden;  // batch × hidden (mlp)
  RowMatrix probs;   // batch × classes, then the logits' gradient
  RowMatrix d_hidden;
};

class Model {
 public:
  explicit Model(const ModelSpec& spec);

  const ModelSpec& spec() const { return spec_; }
  std::size_t parameters() const;
  // Floats per tensor, in layout order (W1, b1[, W2, b2]): what the servers place.
  std::vector<std::size_t> tensor_floats() const;

  // Zeros for softmax; for the MLP, weights uniform in ±sqrt(6 / fan_in) (He) from `seed`,
  // biases zero. Same seed, same parameters.
  void initialise(std::span<float> parameters, std::uint64_t seed) const;

  // The gradient of the mean cross-entropy over `rows` of `data`, written into `gradient`
  // (parameters() floats); returns the mean loss.
  float gradient(std::span<const float> parameters, const Dataset& data, std::span<const std::uint32_t> rows,
                 std::span<float> gradient, Workspace& work) const;

  // Fraction of `data` classified right.
  double accuracy(std::span<const float> parameters, const Dataset& data) const;

 private:
  // Logits (then probabilities) of x into work.probs.
  void forward(std::span<const float> parameters, const RowMatrix& x, Workspace& work) const;
  ModelSpec spec_;
};

// parameters -= learning_rate · gradient (the local reference of the server's SGD step).
void sgd_step(std::span<float> parameters, std::span<const float> gradient, float learning_rate);

// Minibatches of row indices: each epoch a fresh permutation of [0, rows) from the seed, so a
// (seed, worker) pair always sees the same data order.
class BatchSampler {
 public:
  BatchSampler(std::size_t rows, std::size_t batch, std::uint64_t seed);
  std::span<const std::uint32_t> next();
  std::uint64_t epoch() const { return epoch_; }

 private:
  std::vector<std::uint32_t> order_;
  std::size_t batch_;
  std::size_t at_ = 0;
  std::uint64_t epoch_ = 0;
  std::mt19937_64 rng_;
};

}  // namespace gradlane::train
