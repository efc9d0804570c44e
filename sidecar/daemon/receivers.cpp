// Receivers (receivers.hpp): who speaks for each receiver endpoint at this gradlaned.
#include "sidecar/daemon/receivers.hpp"

#include "gradlane/sidecar.hpp"

namespace gradlane::sidecar {

bool Receivers::owned_by_another(std::uint32_t endpoint, std::uint32_t job) const {
  const auto owner = owners_.find(endpoint);
  return owner != owners_.end() && owner->second != job;
}

bool Receivers::take_survivor(std::uint32_t endpoint, const Survivor& app, std::uint32_t segment) {
  const auto held = held_.find(endpoint);
  if (held == held_.end() || held->second.segment != segment) return false;
  const Survivor& server = held->second.server;
  if (server.pid != app.pid || server.start_time != app.start_time || server.job != app.job) return false;
  held_.erase(held);
  return true;
}

void Receivers::seat(std::uint32_t endpoint, std::uint32_t job, std::uint32_t slot,
                     std::optional<sched::GrantKey> key) {
  servers_[endpoint] = Server{job, slot};
  owners_[endpoint] = job;
  if (key) {
    keys_[endpoint] = *key;
  } else {
    keys_.erase(endpoint);
  }
}

bool Receivers::unseat(std::uint32_t endpoint, std::uint32_t slot, bool detached) {
  const auto server = servers_.find(endpoint);
  if (server == servers_.end() || server->second.slot != slot) return false;
  servers_.erase(server);
  if (detached) owners_.erase(endpoint);
  return true;
}

std::optional<std::uint32_t> Receivers::server_slot(std::uint32_t endpoint, std::optional<std::uint32_t> job) const {
  const auto server = servers_.find(endpoint);
  if (server == servers_.end() || (job && server->second.job != *job)) return std::nullopt;
  return server->second.slot;
}

std::uint64_t Receivers::token(std::uint32_t receiver, std::uint64_t seq, std::uint64_t carried, bool hands_out) const {
  const auto key = keys_.find(receiver);
  if (key == keys_.end() || !hands_out) return carried;
  return grant_token(key->second, seq);
}

}  // namespace gradlane::sidecar
