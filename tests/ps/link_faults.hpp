// Faults on the emulated hosts' links (ci/softroce/net.sh: host N's veth is hN, its bridge port
// hN-p), through tc; each undone when its object goes. Needs root, which the harness has.
#pragma once

#include <sys/wait.h>

#include <chrono>
#include <string>

#include <gtest/gtest.h>

#include "../common/external_process.hpp"

namespace gradlane::testing {

inline void run_tc(const std::string& command) {
  ExternalProcess p({"/bin/sh", "-c", command});
  const auto status = p.wait_exit(std::chrono::seconds(20));
  EXPECT_TRUE(status && WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << command;
}

// Drops every packet on host `host`'s link, both directions, until destroyed or speak().
class SilentHost {
 public:
  explicit SilentHost(int host) : link_("h" + std::to_string(host)) {
    run_tc("tc qdisc replace dev " + link_ + " root netem loss 100% && tc qdisc replace dev " + link_ +
           "-p root netem loss 100%");
  }
  ~SilentHost() { speak(); }
  SilentHost(const SilentHost&) = delete;
  SilentHost& operator=(const SilentHost&) = delete;
  void speak() {
    if (silent_) run_tc("tc qdisc del dev " + link_ + " root; tc qdisc del dev " + link_ + "-p root");
    silent_ = false;
  }

 private:
  std::string link_;
  bool silent_ = true;
};

// Drops every packet between host `host` and the host at `other_address`, both directions; the
// rest of both hosts' traffic flows (a link flap between two hosts, not a host gone).
class CutBetween {
 public:
  CutBetween(int host, const std::string& other_address) : link_("h" + std::to_string(host)) {
    // A band that loses everything; only the filter sends packets there (prio's default map
    // puts every TOS in bands 1 and 2).
    const auto cut = [&](const std::string& dev, const char* match) {
      return "tc qdisc replace dev " + dev + " root handle 1: prio bands 3 && tc qdisc add dev " + dev +
             " parent 1:3 netem loss 100% && tc filter add dev " + dev + " parent 1: protocol ip u32 match ip " +
             match + " " + other_address + "/32 flowid 1:3";
    };
    run_tc(cut(link_, "dst") + " && " + cut(link_ + "-p", "src"));
  }
  ~CutBetween() { run_tc("tc qdisc del dev " + link_ + " root; tc qdisc del dev " + link_ + "-p root"); }
  CutBetween(const CutBetween&) = delete;
  CutBetween& operator=(const CutBetween&) = delete;

 private:
  std::string link_;
};

}  // namespace gradlane::testing
