#include "snapshots.hpp"

#include <stdexcept>

namespace gradlane::trainer {

SnapshotWriter::SnapshotWriter(const std::string& path) : path_(path), out_(path, std::ios::binary | std::ios::trunc) {
  if (!out_) throw std::runtime_error("cannot create " + path);
}

void SnapshotWriter::write(std::int64_t at_ns, std::uint64_t version, std::span<const float> model) {
  const std::uint64_t floats = model.size();
  out_.write(reinterpret_cast<const char*>(&at_ns), sizeof at_ns);
  out_.write(reinterpret_cast<const char*>(&version), sizeof version);
  out_.write(reinterpret_cast<const char*>(&floats), sizeof floats);
  out_.write(reinterpret_cast<const char*>(model.data()), static_cast<std::streamsize>(model.size_bytes()));
  out_.flush();
  if (!out_) throw std::runtime_error("writing " + path_ + " failed (disk full?)");
}

std::vector<Snapshot> read_snapshots(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::vector<Snapshot> all;
  for (;;) {
    Snapshot s;
    std::uint64_t floats = 0;
    if (!in.read(reinterpret_cast<char*>(&s.at_ns), sizeof s.at_ns)) break;
    if (!in.read(reinterpret_cast<char*>(&s.version), sizeof s.version) ||
        !in.read(reinterpret_cast<char*>(&floats), sizeof floats) || floats > (1ULL << 30)) {
      throw std::runtime_error(path + ": truncated record header after " + std::to_string(all.size()) + " records");
    }
    s.model.resize(floats);
    if (!in.read(reinterpret_cast<char*>(s.model.data()), static_cast<std::streamsize>(floats * sizeof(float)))) {
      throw std::runtime_error(path + ": truncated model after " + std::to_string(all.size()) + " records");
    }
    all.push_back(std::move(s));
  }
  return all;
}

}  // namespace gradlane::trainer
