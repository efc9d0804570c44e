#include "sidecar/peer/redialer.hpp"

#include <algorithm>
#include <cstdio>
#include <fmt/format.h>

namespace gradlane::peer {

Redialer::Redialer(const Device& device, const TransportOptions& options, std::chrono::milliseconds retry_every)
    : device_(device), options_(options), retry_every_(retry_every) {}

Redialer::~Redialer() {
  std::vector<Attempt> attempts;
  {
    const std::lock_guard lock(mutex_);
    attempts = std::move(attempts_);
  }
  for (Attempt& a : attempts) a.thread.request_stop();
  wake_.notify_all();
  // Each jthread joins here: at most one connect() timeout.
}

void Redialer::redial(const PeerAddress& peer) {
  reap();
  const std::string key = fmt::format("{}:{}", peer.address, peer.port);
  const std::lock_guard lock(mutex_);
  if (std::any_of(attempts_.begin(), attempts_.end(), [&](const Attempt& a) { return a.key == key; })) return;
  Attempt& a = attempts_.emplace_back(Attempt{.key = key, .done = false, .thread = {}});
  a.thread = std::jthread([this, peer, key](std::stop_token stop) { run(std::move(stop), peer, key); });
}

void Redialer::run(std::stop_token stop, PeerAddress peer, std::string key) {
  std::optional<Connection> made;
  std::string last_error;
  while (!stop.stop_requested()) {
    try {
      made.emplace(connect(device_, peer.address, peer.port, options_));
      break;
    } catch (const Error& e) {
      // Nothing listens yet (the peer's gradlaned is restarting), or its host is down: again
      // later. Said once per distinct error, not every attempt.
      if (last_error != e.what()) {
        last_error = e.what();
        std::fprintf(stderr, "gradlaned: reconnecting to peer sidecar %s: %s; trying every %lld ms\n", key.c_str(),
                     e.what(), static_cast<long long>(retry_every_.count()));
      }
    }
    std::unique_lock lock(mutex_);
    wake_.wait_for(lock, stop, retry_every_, [] { return false; });
  }
  const std::lock_guard lock(mutex_);
  if (made) made_.emplace_back(peer, std::move(*made));
  for (Attempt& a : attempts_) {
    if (a.key == key) a.done = true;
  }
}

void Redialer::reap() {
  std::vector<Attempt> finished;
  {
    const std::lock_guard lock(mutex_);
    for (auto it = attempts_.begin(); it != attempts_.end();) {
      if (it->done) {
        finished.push_back(std::move(*it));
        it = attempts_.erase(it);
      } else {
        ++it;
      }
    }
  }
  // `finished` joins here, each thread already past its last use of the mutex.
}

std::vector<std::pair<PeerAddress, Connection>> Redialer::take() {
  reap();
  const std::lock_guard lock(mutex_);
  return std::exchange(made_, {});
}

}  // namespace gradlane::peer
