#include "perf/sched/training.hpp"

#include <algorithm>
#include <chrono>
#include <stdexcept>

namespace gradlane::sched::sim {

SgdObserver::SgdObserver(const train::Model& model, const train::Dataset& train, Mode mode, float learning_rate,
                         std::size_t batch, std::uint64_t seed)
    : model_(model),
      train_(train),
      mode_(mode),
      learning_rate_(learning_rate),
      sampler_(train.rows, batch, seed),
      params_(model.parameters()),
      gradient_(model.parameters()),
      sum_(model.parameters()) {
  if (!(learning_rate > 0)) throw std::invalid_argument("SgdObserver: the learning rate must be positive");
  model.initialise(params_, seed);
}

std::uint64_t SgdObserver::pulled(std::uint32_t /*worker*/) {
  if (current_) {  // the model has not moved since the last pull: share its snapshot
    ++pool_[*current_].refs;
    return *current_;
  }
  std::uint64_t token = 0;
  if (free_.empty()) {
    token = pool_.size();
    pool_.emplace_back();
  } else {
    token = free_.back();
    free_.pop_back();
  }
  Snapshot& s = pool_[token];
  s.params = params_;
  s.applied_at_pull = gradients_applied_;
  s.refs = 1;
  current_ = token;
  return token;
}

void SgdObserver::release(std::uint64_t token) {
  Snapshot& s = pool_.at(token);
  if (s.refs == 0) throw std::logic_error("SgdObserver: a snapshot released twice");
  if (--s.refs > 0) return;
  if (current_ == token) current_.reset();
  free_.push_back(token);
}

void SgdObserver::dropped(const Gradient& gradient) { release(gradient.token); }

void SgdObserver::applied(std::span<const Gradient> gradients, Instant /*now*/) {
  if (gradients.empty()) return;
  std::fill(sum_.begin(), sum_.end(), 0.0F);
  for (const Gradient& g : gradients) {
    const Snapshot& s = pool_.at(g.token);
    model_.gradient(s.params, train_, sampler_.next(), gradient_, work_);
    for (std::size_t i = 0; i < sum_.size(); ++i) sum_[i] += gradient_[i];
    gradient_delays_.push_back(gradients_applied_ - s.applied_at_pull);
    release(g.token);
  }
  const float scale = mode_ == Mode::sync ? 1.0F / static_cast<float>(gradients.size()) : 1.0F;
  train::sgd_step(params_, sum_, learning_rate_ * scale);
  gradients_applied_ += gradients.size();
  ++updates_applied_;
  current_.reset();  // the model moved: the next pull needs a snapshot of its own
}

TrainResult train_in_simulation(const ClusterParams& cluster_params, const TrainParams& tp, const train::Model& model,
                                const train::Dataset& train_set, const train::Dataset& eval_set, Progress progress,
                                void* context) {
  if (!(tp.eval_every_ms > 0) || !(tp.duration_ms > 0)) {
    throw std::invalid_argument("the evaluation cadence and the duration must be positive");
  }
  const auto wall_start = std::chrono::steady_clock::now();
  SgdObserver sgd(model, train_set, cluster_params.mode, tp.learning_rate, tp.batch, tp.seed);
  Cluster cluster(cluster_params, &sgd);
  TrainResult result;
  const auto evaluate = [&](double t_ms) {
    EvalPoint e;
    e.t_ms = t_ms;
    e.accuracy = model.accuracy(sgd.parameters(), eval_set);
    e.gradients = sgd.gradients_applied();
    e.updates = sgd.updates_applied();
    const ClusterStats& s = cluster.stats();
    e.drops = s.drops;
    e.server_ingress_bytes = s.server_ingress_bytes;
    e.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
    result.curve.push_back(e);
    result.best_accuracy = std::max(result.best_accuracy, e.accuracy);
    if (!result.time_to_target_ms && e.accuracy >= tp.target) {
      result.time_to_target_ms = t_ms;
      result.ingress_bytes_at_target = e.server_ingress_bytes;
    }
    if (progress) progress(e, context);
  };
  evaluate(0.0);
  const auto steps = static_cast<std::uint64_t>(tp.duration_ms / tp.eval_every_ms + 0.5);
  for (std::uint64_t k = 1; k <= steps; ++k) {
    const double t_ms = static_cast<double>(k) * tp.eval_every_ms;
    cluster.run_until(Instant{Nanos{static_cast<std::int64_t>(t_ms * 1e6)}});
    evaluate(t_ms);
    if (tp.stop_at_target && result.time_to_target_ms) break;
  }
  result.stats = cluster.stats();
  result.gradient_delays = sgd.gradient_delays();
  result.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  return result;
}

}  // namespace gradlane::sched::sim
