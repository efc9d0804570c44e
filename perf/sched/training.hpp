// Training in simulated time: a Cluster (cluster.hpp) decides when each worker pulls the model
// and when its gradient reaches the server; SgdObserver computes that gradient for real
// (train/model.hpp, on the model the worker pulled) and applies it then.
//
// What an update applies:
//  - asynchronous (fifo, gradlane): params -= lr * g for one gradient, and lr * (g1 + ... + gk)
//    for an aggregate of k. The SUM, not the mean: an aggregate stands for k updates the server
//    would otherwise have applied one after another, and summing keeps each gradient's step
//    exactly what it would have been alone (mean would divide the progress of a busy server
//    by the group size). What aggregation changes is only fewer versions and server bytes.
//  - sync, backup: params -= lr * (g1 + ... + gN) / N, the mean, as synchronous SGD does; with
//    equal batches that is one SGD step on the N-times larger batch (backup: N = the gradients
//    the step was applied with, workers - b).
//  - fifo-sa (staleness-aware): params -= lr / max(1, d) * g, d the gradient's delay in server
//    versions (Gradient::delay): the staler a gradient, the smaller its step.
//  - local, gradlane-local: each worker takes local_steps SGD steps of lr from the model it
//    pulled, on its next local_steps minibatches; the step's update is the mean of the N
//    workers' models.
//
// Data order (DataOrder). By default one BatchSampler for the whole run, consumed in apply
// order — the k-th gradient applied is computed on the k-th minibatch of the seed's permutation
// in every mode, so modes differ only in which model version each gradient is computed on and
// how they are combined. With data shards, each worker draws only from its own partition.
//
// Cost: a gradient is computed lazily, when its update is applied (a dropped one never is);
// until then the worker's pulled model is kept in a snapshot shared by every pull of the same
// version (sync: one per step), so memory is at most one snapshot per outstanding gradient.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "perf/sched/cluster.hpp"
#include "train/data_order.hpp"
#include "train/dataset.hpp"
#include "train/model.hpp"

namespace gradlane::sched::sim {

using train::DataOrder;

class SgdObserver : public Observer {
 public:
  // `train` must outlive the observer. Parameters start at model.initialise(seed).
  // shard_workers: 0 for one global data order, else the workers to split the data between.
  // local_steps: H of the modes that average models (ClusterParams::local_steps); ignored by the others.
  SgdObserver(const train::Model& model, const train::Dataset& train, Mode mode, float learning_rate, std::size_t batch,
              std::uint64_t seed, std::uint32_t shard_workers = 0, std::uint32_t local_steps = 1);

  std::uint64_t pulled(std::uint32_t worker) override;
  void applied(std::span<const Gradient> gradients, Instant now) override;
  void dropped(const Gradient& gradient) override;

  std::span<const float> parameters() const { return params_; }
  std::uint64_t gradients_applied() const { return gradients_applied_; }
  std::uint64_t updates_applied() const { return updates_applied_; }
  // Per applied gradient: how many gradients reached the model between its pull and its apply
  // (staleness counted in gradients, which aggregation does not hide).
  const std::vector<std::uint64_t>& gradient_delays() const { return gradient_delays_; }
  std::size_t snapshots_allocated() const { return pool_.size(); }
  const DataOrder& data_order() const { return data_; }

 private:
  struct Snapshot {
    std::vector<float> params;
    std::uint64_t applied_at_pull = 0;  // gradients_applied_ when it was taken
    std::uint32_t refs = 0;
  };
  void release(std::uint64_t token);
  void apply_local_average(std::span<const Gradient> updates);
  // The factor a gradient is weighted by within its update, before the learning rate.
  float weight_of(const Gradient& gradient, std::size_t update_size) const;

  const train::Model& model_;
  const train::Dataset& train_;
  Mode mode_;
  float learning_rate_;
  std::uint32_t local_steps_;
  DataOrder data_;
  std::vector<float> params_;
  std::vector<float> gradient_, sum_, local_;
  train::Workspace work_;
  std::vector<Snapshot> pool_;
  std::vector<std::uint64_t> free_;
  std::optional<std::uint64_t> current_;  // the snapshot of the current version, if taken
  std::uint64_t gradients_applied_ = 0;
  std::uint64_t updates_applied_ = 0;
  std::vector<std::uint64_t> gradient_delays_;
};

struct TrainParams {
  float learning_rate = 0.01F;
  std::size_t batch = 64;
  double eval_every_ms = 50.0;  // the evaluation cadence, in simulated time
  double duration_ms = 5000.0;
  double target = 0.80;  // time-to-accuracy: first evaluation at or above it
  bool stop_at_target = false;
  // Stop once an evaluation at or above the target is followed by this many more that stay
  // there (the experiment's sustained crossing, confirmed): the rest of the run cannot move it.
  std::optional<std::uint32_t> stop_after_sustained;
  std::uint64_t seed = 1;    // the data order (the cluster has its own seed)
  bool data_shards = false;  // each worker trains on its own partition of the data (DataOrder)
};

struct EvalPoint {
  double t_ms = 0;  // simulated time since the start (all workers start computing at 0)
  double accuracy = 0;
  std::uint64_t gradients = 0;  // applied so far
  std::uint64_t updates = 0;    // server versions so far (an aggregate or a sync step is one)
  std::uint64_t drops = 0;
  Bytes server_ingress_bytes = 0;
  double wall_s = 0;  // real seconds since the start of the run
};

struct TrainResult {
  std::vector<EvalPoint> curve;
  std::optional<double> time_to_target_ms;
  std::optional<Bytes> ingress_bytes_at_target;
  double best_accuracy = 0;
  ClusterStats stats;
  std::vector<std::uint64_t> gradient_delays;
  double wall_s = 0;
};

// Runs the cluster for train.duration_ms of simulated time (or until the target, if asked),
// evaluating accuracy on all of `eval` every eval_every_ms. `progress`, if given, is called
// after every evaluation.
using Progress = void (*)(const EvalPoint&, void* context);
TrainResult train_in_simulation(const ClusterParams& cluster, const TrainParams& train, const train::Model& model,
                                const train::Dataset& train_set, const train::Dataset& eval_set,
                                Progress progress = nullptr, void* context = nullptr);

}  // namespace gradlane::sched::sim
