// Offline: every snapshot the server recorded, evaluated on the full test set (or on the
// validation split). Writes
// accuracy.csv (seconds, version, accuracy) and accuracy.json (time to the target accuracy,
// final and best accuracy), and prints one summary line.
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>

#include "config.hpp"
#include "snapshots.hpp"
#include "train/dataset.hpp"
#include "train/model.hpp"

namespace gradlane::trainer {

int run_evaluate(const Config& c) {
  const gradlane::train::Model model(gradlane::train::ModelSpec{.kind = gradlane::train::parse_model_kind(c.model)});
  const std::filesystem::path dir = c.data.empty() ? gradlane::train::kDefaultFashionMnistDir : c.data;
  const bool validation = c.split == "validation";
  const auto images = gradlane::train::load_fashion_mnist(
      dir, validation ? gradlane::train::Split::train : gradlane::train::Split::test);
  const auto test =
      validation ? images.slice(gradlane::train::rows_before_validation(images), gradlane::train::kValidationRows)
                 : images;
  const auto snapshots = read_snapshots(c.out + "/snapshots.bin");
  if (snapshots.empty()) throw std::runtime_error(c.out + "/snapshots.bin holds no snapshot");

  std::ofstream csv(c.out + "/accuracy.csv");
  csv << "seconds,version,accuracy\n";
  double best = 0.0, final_accuracy = 0.0, time_to_target = -1.0;
  std::uint64_t version_at_target = 0;
  for (const auto& s : snapshots) {
    if (s.model.size() != model.parameters()) {
      throw std::runtime_error("snapshot of " + std::to_string(s.model.size()) + " floats, the " + c.model +
                               " model has " + std::to_string(model.parameters()));
    }
    const double seconds = static_cast<double>(s.at_ns) / 1e9;
    const double accuracy = model.accuracy(s.model, test);
    csv << seconds << ',' << s.version << ',' << accuracy << '\n';
    best = std::max(best, accuracy);
    final_accuracy = accuracy;
    if (time_to_target < 0 && accuracy >= c.target) {
      time_to_target = seconds;
      version_at_target = s.version;
    }
  }
  const double wall = static_cast<double>(snapshots.back().at_ns) / 1e9;
  std::ofstream(c.out + "/accuracy.json")
      << "{\"target\":" << c.target
      << ",\"time_to_target_s\":" << (time_to_target < 0 ? std::string("null") : std::to_string(time_to_target))
      << ",\"version_at_target\":" << version_at_target << ",\"final_accuracy\":" << final_accuracy
      << ",\"best_accuracy\":" << best << ",\"wall_s\":" << wall << ",\"final_version\":" << snapshots.back().version
      << ",\"snapshots\":" << snapshots.size() << ",\"split\":\"" << c.split << "\",\"test_images\":" << test.rows
      << "}\n";
  std::printf("evaluated %zu snapshots on %zu %s images: final accuracy %.4f (best %.4f), ", snapshots.size(),
              test.rows, c.split.c_str(), final_accuracy, best);
  if (time_to_target < 0) {
    std::printf("target %.2f not reached in %.1f s\n", c.target, wall);
  } else {
    std::printf("target %.2f reached at %.1f s (version %llu)\n", c.target, time_to_target,
                static_cast<unsigned long long>(version_at_target));
  }
  return 0;
}

}  // namespace gradlane::trainer
