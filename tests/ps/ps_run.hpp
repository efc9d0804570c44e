// What the ps softroce tests share about a run of ps_node processes: the output directory, the
// workers' exits, the model files they write (the floats of a shard, raw).
#pragma once

#include <sys/wait.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "../common/external_process.hpp"
#include "gradlane/gradlane.hpp"

namespace gradlane::testing {

// Exactly `floats` floats, or an exception naming the file.
inline std::vector<float> read_model(const std::string& path, std::size_t floats) {
  std::vector<float> model(floats);
  std::ifstream in(path, std::ios::binary);
  in.read(reinterpret_cast<char*>(model.data()), static_cast<std::streamsize>(floats * sizeof(float)));
  if (in.gcount() != static_cast<std::streamsize>(floats * sizeof(float)) ||
      std::filesystem::file_size(path) != floats * sizeof(float)) {
    throw std::runtime_error(path + ": not a model of " + std::to_string(floats) + " floats");
  }
  return model;
}

// True once `path` (a process's captured stderr) holds a line containing `text`, within `limit`.
inline bool wait_for_text(const std::string& path, const std::string& text, std::chrono::seconds limit) {
  const auto give_up = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < give_up) {
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) {
      if (line.find(text) != std::string::npos) return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

// Waits until `count` lines of `path` contain `text` (a log another process appends to).
inline bool wait_for_lines_with(const std::string& path, const std::string& text, std::size_t count,
                                std::chrono::seconds limit) {
  const auto give_up = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < give_up) {
    std::ifstream in(path);
    std::size_t seen = 0;
    for (std::string line; std::getline(in, line) && seen < count;)
      seen += line.find(text) != std::string::npos ? 1 : 0;
    if (seen >= count) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

// $GRADLANE_OUT_DIR/<current test's name>, emptied: a rerun into the same directory starts clean.
// The error kind `wait` throws for a write the peer's NIC refused ("remote_access"), or
// "landed" when it completed.
inline std::string refusal_of(Connection& c, OpId op) {
  try {
    c.wait(op, std::chrono::seconds(30));
    return "landed";
  } catch (const Error& e) {
    std::printf("  [refused] %s\n", e.what());
    return std::string(errc_name(e.code()));
  }
}

inline std::string fresh_test_dir() {
  const std::string dir = std::string(std::getenv("GRADLANE_OUT_DIR")) + "/" +
                          ::testing::UnitTest::GetInstance()->current_test_info()->name();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// Waits for workers 1..N (workers[id - 1]); those in `exit_codes` must exit with theirs (9:
// ps_node's die_after; 1: an error), the others with 0. Fails the test otherwise.
inline void expect_workers_exit(const std::vector<std::unique_ptr<ExternalProcess>>& workers,
                                const std::map<std::uint32_t, int>& exit_codes) {
  for (std::uint32_t id = 1; id <= workers.size(); ++id) {
    const auto status = workers[id - 1]->wait_exit(std::chrono::seconds(240));
    ASSERT_TRUE(status.has_value()) << "worker " << id << " did not finish";
    const int expected = exit_codes.contains(id) ? exit_codes.at(id) : 0;
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == expected) << "worker " << id << " status " << *status;
  }
}

}  // namespace gradlane::testing
