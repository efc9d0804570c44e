// A shard server on one host, in a thread of the test process: it accepts `peers` connections,
// then serves until stop(). While it runs, the peers it lost; once stopped, its history and
// stats, and what it failed with ("" when it did not).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "../common/hosts.hpp"
#include "gradlane/gradlane.hpp"

namespace gradlane::testing {

class ServerThread {
 public:
  // `floats` floats, 8 slots, direct mode.
  ServerThread(const Host& host, std::uint16_t port, std::size_t peers, std::size_t floats)
      : ServerThread(host, port, peers, shard_of(floats)) {}
  ServerThread(const Host& host, std::uint16_t port, std::size_t peers, ps::ShardOptions shard)
      : thread_([this, host, port, peers, shard] {
          try {
            Device device = Device::open({.name = host.device});
            ps::ShardServer server(device, ps::Role::server, port, shard, std::vector<float>(shard.floats, 0.0F));
            serving_ = true;
            server.accept_peers(peers, std::chrono::seconds(60));
            while (!stop_.load()) {
              if (server.progress() == 0) server.wait_for_input(std::chrono::milliseconds(5));
              peers_lost = server.stats().peers_lost;
            }
            history = server.history();
            stats = server.stats();
          } catch (const std::exception& e) {
            failure = e.what();
          }
          serving_ = true;  // or failed before it could
        }) {
    while (!serving_.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~ServerThread() { stop(); }
  ServerThread(const ServerThread&) = delete;
  ServerThread& operator=(const ServerThread&) = delete;
  static ps::ShardOptions shard_of(std::size_t floats) {
    ps::ShardOptions shard;
    shard.floats = floats;
    shard.slots = 8;
    return shard;
  }
  void stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }

  std::atomic<std::uint64_t> peers_lost{0};
  std::string failure;
  std::vector<ps::AppliedUpdate> history;
  ps::ServerStats stats;

 private:
  std::atomic<bool> stop_{false}, serving_{false};
  std::jthread thread_;  // last: it starts once the members it writes exist
};

}  // namespace gradlane::testing
