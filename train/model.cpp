#include "train/model.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

namespace gradlane::train {
namespace {

using MatrixMap = Eigen::Map<RowMatrix>;
using ConstMatrixMap = Eigen::Map<const RowMatrix>;
using ConstRowVector = Eigen::Map<const Eigen::RowVectorXf>;

// The tensors of a flat parameter (or gradient) vector.

std::size_t first_layer_outputs(const ModelSpec& s) { return s.kind == ModelKind::mlp ? s.hidden : s.classes; }

void gather(const Dataset& data, std::span<const std::uint32_t> rows, RowMatrix& x) {
  x.resize(static_cast<Eigen::Index>(rows.size()), static_cast<Eigen::Index>(data.features));
  for (std::size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] >= data.rows) throw std::out_of_range("Model::gradient: row past the data set");
    x.row(static_cast<Eigen::Index>(i)) =
        Eigen::Map<const Eigen::RowVectorXf>(data.image(rows[i]).data(), static_cast<Eigen::Index>(data.features));
  }
}

// Row-wise softmax in place, shifted by each row's max so exp never overflows.
void softmax_rows(RowMatrix& m) {
  for (Eigen::Index r = 0; r < m.rows(); ++r) {
    auto row = m.row(r);
    row.array() -= row.maxCoeff();
    row = row.array().exp();
    row /= row.sum();
  }
}

}  // namespace

ModelKind parse_model_kind(const std::string& name) {
  if (name == "softmax") return ModelKind::softmax;
  if (name == "mlp") return ModelKind::mlp;
  throw std::invalid_argument("unknown model '" + name + "': use softmax or mlp");
}

const char* to_string(ModelKind kind) { return kind == ModelKind::mlp ? "mlp" : "softmax"; }

Model::Model(const ModelSpec& spec) : spec_(spec) {
  if (spec.inputs == 0 || spec.classes < 2 || (spec.kind == ModelKind::mlp && spec.hidden == 0)) {
    throw std::invalid_argument("Model: inputs, classes (>= 2) and hidden units must be positive");
  }
}

std::vector<std::size_t> Model::tensor_floats() const {
  const std::size_t out1 = first_layer_outputs(spec_);
  std::vector<std::size_t> sizes{spec_.inputs * out1, out1};
  if (spec_.kind == ModelKind::mlp) {
    sizes.push_back(spec_.hidden * spec_.classes);
    sizes.push_back(spec_.classes);
  }
  return sizes;
}

std::size_t Model::parameters() const {
  const auto sizes = tensor_floats();
  return std::accumulate(sizes.begin(), sizes.end(), std::size_t{0});
}

void Model::initialise(std::span<float> parameters, std::uint64_t seed) const {
  if (parameters.size() != this->parameters()) throw std::invalid_argument("Model::initialise: wrong size");
  std::fill(parameters.begin(), parameters.end(), 0.0F);
  if (spec_.kind == ModelKind::softmax) return;
  std::mt19937_64 rng(seed);
  const auto sizes = tensor_floats();
  const auto he_uniform = [&](std::size_t offset, std::size_t count, std::size_t fan_in) {
    const float bound = std::sqrt(6.0F / static_cast<float>(fan_in));
    std::uniform_real_distribution<float> uniform(-bound, bound);
    for (std::size_t i = 0; i < count; ++i) parameters[offset + i] = uniform(rng);
  };
  he_uniform(0, sizes[0], spec_.inputs);
  he_uniform(sizes[0] + sizes[1], sizes[2], spec_.hidden);
}

void Model::forward(std::span<const float> p, const RowMatrix& x, Workspace& work) const {
  const auto in = static_cast<Eigen::Index>(spec_.inputs);
  const auto out1 = static_cast<Eigen::Index>(first_layer_outputs(spec_));
  const ConstMatrixMap w1(p.data(), in, out1);
  const ConstRowVector b1(p.data() + in * out1, out1);
  if (spec_.kind == ModelKind::softmax) {
    work.probs.noalias() = x * w1;
    work.probs.rowwise() += b1;
    return;
  }
  const auto classes = static_cast<Eigen::Index>(spec_.classes);
  const float* rest = p.data() + in * out1 + out1;
  const ConstMatrixMap w2(rest, out1, classes);
  const ConstRowVector b2(rest + out1 * classes, classes);
  work.hidden.noalias() = x * w1;
  work.hidden.rowwise() += b1;
  work.hidden = work.hidden.cwiseMax(0.0F);
  work.probs.noalias() = work.hidden * w2;
  work.probs.rowwise() += b2;
}

float Model::gradient(std::span<const float> p, const Dataset& data, std::span<const std::uint32_t> rows,
                      std::span<float> g, Workspace& work) const {
  if (p.size() != parameters() || g.size() != parameters()) {
    throw std::invalid_argument("Model::gradient: parameters and gradient must hold parameters() floats");
  }
  if (rows.empty()) throw std::invalid_argument("Model::gradient: empty batch");
  if (data.features != spec_.inputs) throw std::invalid_argument("Model::gradient: data has the wrong width");
  gather(data, rows, work.x);
  forward(p, work.x, work);
  softmax_rows(work.probs);

  // Loss, then d(mean loss)/d(logits) = (probs − onehot) / batch, in place.
  const auto batch = static_cast<Eigen::Index>(rows.size());
  double loss = 0.0;
  for (Eigen::Index r = 0; r < batch; ++r) {
    const auto label = static_cast<Eigen::Index>(data.labels[rows[static_cast<std::size_t>(r)]]);
    loss -= std::log(std::max(work.probs(r, label), 1e-30F));
    work.probs(r, label) -= 1.0F;
  }
  work.probs /= static_cast<float>(batch);

  const auto in = static_cast<Eigen::Index>(spec_.inputs);
  const auto out1 = static_cast<Eigen::Index>(first_layer_outputs(spec_));
  MatrixMap gw1(g.data(), in, out1);
  Eigen::Map<Eigen::RowVectorXf> gb1(g.data() + in * out1, out1);
  if (spec_.kind == ModelKind::softmax) {
    gw1.noalias() = work.x.transpose() * work.probs;
    gb1 = work.probs.colwise().sum();
  } else {
    const auto classes = static_cast<Eigen::Index>(spec_.classes);
    const float* w2_data = p.data() + in * out1 + out1;
    const ConstMatrixMap w2(w2_data, out1, classes);
    float* rest = g.data() + in * out1 + out1;
    MatrixMap gw2(rest, out1, classes);
    Eigen::Map<Eigen::RowVectorXf> gb2(rest + out1 * classes, classes);
    gw2.noalias() = work.hidden.transpose() * work.probs;
    gb2 = work.probs.colwise().sum();
    work.d_hidden.noalias() = work.probs * w2.transpose();
    work.d_hidden = (work.hidden.array() > 0.0F).select(work.d_hidden, 0.0F);
    gw1.noalias() = work.x.transpose() * work.d_hidden;
    gb1 = work.d_hidden.colwise().sum();
  }
  return static_cast<float>(loss / static_cast<double>(batch));
}

double Model::accuracy(std::span<const float> p, const Dataset& data) const {
  if (p.size() != parameters()) throw std::invalid_argument("Model::accuracy: wrong parameter count");
  if (data.rows == 0) return 0.0;
  Workspace work;
  std::size_t right = 0;
  constexpr std::size_t kChunk = 1000;  // bounded scratch, whatever the set's size
  for (std::size_t first = 0; first < data.rows; first += kChunk) {
    const std::size_t count = std::min(kChunk, data.rows - first);
    const ConstMatrixMap x(data.pixels.data() + first * data.features, static_cast<Eigen::Index>(count),
                           static_cast<Eigen::Index>(data.features));
    work.x = x;
    forward(p, work.x, work);
    for (std::size_t r = 0; r < count; ++r) {
      Eigen::Index best = 0;
      work.probs.row(static_cast<Eigen::Index>(r)).maxCoeff(&best);
      right += static_cast<std::size_t>(best) == data.labels[first + r] ? 1 : 0;
    }
  }
  return static_cast<double>(right) / static_cast<double>(data.rows);
}

void sgd_step(std::span<float> parameters, std::span<const float> gradient, float learning_rate) {
  if (parameters.size() != gradient.size()) throw std::invalid_argument("sgd_step: size mismatch");
  Eigen::Map<Eigen::VectorXf>(parameters.data(), static_cast<Eigen::Index>(parameters.size())) -=
      learning_rate * Eigen::Map<const Eigen::VectorXf>(gradient.data(), static_cast<Eigen::Index>(gradient.size()));
}

BatchSampler::BatchSampler(std::size_t rows, std::size_t batch, std::uint64_t seed)
    : order_(rows), batch_(batch), rng_(seed) {
  if (rows == 0 || batch == 0 || batch > rows) {
    throw std::invalid_argument("BatchSampler: need 0 < batch <= rows");
  }
  std::iota(order_.begin(), order_.end(), 0U);
  std::shuffle(order_.begin(), order_.end(), rng_);
}

std::span<const std::uint32_t> BatchSampler::next() {
  if (at_ + batch_ > order_.size()) {
    std::shuffle(order_.begin(), order_.end(), rng_);
    at_ = 0;
    ++epoch_;
  }
  const std::span<const std::uint32_t> rows(order_.data() + at_, batch_);
  at_ += batch_;
  return rows;
}

}  // namespace gradlane::train
