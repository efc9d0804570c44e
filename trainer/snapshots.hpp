// The server's model over wall time, recorded while it trains and evaluated afterwards, so that
// evaluating never takes CPU from the run it measures. File: records of
//   [int64 nanoseconds since training started][uint64 version][uint64 floats][floats…]
#pragma once

#include <cstdint>
#include <fstream>
#include <span>
#include <string>
#include <vector>

namespace gradlane::trainer {

struct Snapshot {
  std::int64_t at_ns = 0;
  std::uint64_t version = 0;
  std::vector<float> model;
};

class SnapshotWriter {
 public:
  explicit SnapshotWriter(const std::string& path);
  void write(std::int64_t at_ns, std::uint64_t version, std::span<const float> model);

 private:
  std::string path_;
  std::ofstream out_;
};

// Every record of `path`; throws std::runtime_error on a truncated or inconsistent file.
std::vector<Snapshot> read_snapshots(const std::string& path);

}  // namespace gradlane::trainer
