#include "perf/sched/training.hpp"

#include <algorithm>
#include <chrono>
#include <stdexcept>

namespace gradlane::sched::sim {

SgdObserver::SgdObserver(const train::Model& model, const train::Dataset& train, Mode mode, float learning_rate,
                         std::size_t batch, std::uint64_t seed, std::uint32_t shard_workers, std::uint32_t local_steps)
    : model_(model),
      train_(train),
      mode_(mode),
      learning_rate_(learning_rate),
      local_steps_(local_steps),
      data_(train.rows, batch, seed, shard_workers),
      params_(model.parameters()),
      gradient_(model.parameters()),
      sum_(model.parameters()) {
  if (!(learning_rate > 0)) throw std::invalid_argument("SgdObserver: the learning rate must be positive");
  if (averages_models(mode) && local_steps == 0)
    throw std::invalid_argument("SgdObserver: local SGD needs local_steps >= 1");
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
  if (averages_models(mode_)) {
    apply_local_average(gradients);
    return;
  }
  std::fill(sum_.begin(), sum_.end(), 0.0F);
  for (const Gradient& g : gradients) {
    const Snapshot& s = pool_.at(g.token);
    model_.gradient(s.params, train_, data_.next(g.worker), gradient_, work_);
    const float weight = weight_of(g, gradients.size());
    for (std::size_t i = 0; i < sum_.size(); ++i) sum_[i] += weight * gradient_[i];
    gradient_delays_.push_back(gradients_applied_ - s.applied_at_pull);
    release(g.token);
  }
  train::sgd_step(params_, sum_, learning_rate_);
  gradients_applied_ += gradients.size();
  ++updates_applied_;
  current_.reset();  // the model moved: the next pull needs a snapshot of its own
}

void SgdObserver::apply_local_average(std::span<const Gradient> updates) {
  std::fill(sum_.begin(), sum_.end(), 0.0F);
  const float weight = 1.0F / static_cast<float>(updates.size());
  for (const Gradient& g : updates) {
    const Snapshot& s = pool_.at(g.token);
    local_ = s.params;
    for (std::uint32_t h = 0; h < local_steps_; ++h) {
      model_.gradient(local_, train_, data_.next(g.worker), gradient_, work_);
      train::sgd_step(local_, gradient_, learning_rate_);
    }
    // sum_ gathers the mean of (pulled - local): the model a step pulled minus it is their mean.
    for (std::size_t i = 0; i < sum_.size(); ++i) sum_[i] += weight * (s.params[i] - local_[i]);
    gradient_delays_.insert(gradient_delays_.end(), local_steps_, gradients_applied_ - s.applied_at_pull);
    release(g.token);
  }
  train::sgd_step(params_, sum_, 1.0F);
  gradients_applied_ += updates.size() * local_steps_;
  ++updates_applied_;
  current_.reset();
}

float SgdObserver::weight_of(const Gradient& gradient, std::size_t update_size) const {
  if (is_synchronous(mode_)) return 1.0F / static_cast<float>(update_size);  // the step's mean
  if (mode_ == Mode::fifo_sa) return 1.0F / static_cast<float>(std::max<std::uint64_t>(1, gradient.delay));
  return 1.0F;  // asynchronous: each gradient its full step, an aggregate their sum
}

TrainResult train_in_simulation(const ClusterParams& cluster_params, const TrainParams& tp, const train::Model& model,
                                const train::Dataset& train_set, const train::Dataset& eval_set, Progress progress,
                                void* context) {
  if (!(tp.eval_every_ms > 0) || !(tp.duration_ms > 0)) {
    throw std::invalid_argument("the evaluation cadence and the duration must be positive");
  }
  const auto wall_start = std::chrono::steady_clock::now();
  SgdObserver sgd(model, train_set, cluster_params.mode, tp.learning_rate, tp.batch, tp.seed,
                  tp.data_shards ? cluster_params.workers : 0, cluster_params.local_steps);
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
    if (tp.stop_after_sustained) {
      const std::size_t run = std::size_t{*tp.stop_after_sustained} + 1;
      const auto& curve = result.curve;
      if (curve.size() >= run && std::all_of(curve.end() - static_cast<std::ptrdiff_t>(run), curve.end(),
                                             [&](const EvalPoint& e) { return e.accuracy >= tp.target; })) {
        break;
      }
    }
  }
  result.stats = cluster.stats();
  result.gradient_delays = sgd.gradient_delays();
  result.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  return result;
}

}  // namespace gradlane::sched::sim
