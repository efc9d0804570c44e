// gradlane_doctor: the checks, each one finding with what is wrong and how to fix it.
//
// The order follows what breaks first on a new cluster (BytePS's and NCCL's issue trackers):
// no driver / no device, port down, wrong interface or GID, memlock, rdma_cm not reachable,
// and finally data that does not arrive. Local checks read verbs and sysfs directly (a
// diagnosis must work when the library refuses to start); the peer checks use only
// gradlane's public API, as a job would.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gradlane/gradlane.hpp"

namespace gradlane::doctor {

enum class Status { ok, warn, fail };

struct Finding {
  Status status = Status::ok;
  std::string check;   // "memlock"
  std::string detail;  // what was found
  std::string fix;     // what to do, empty when ok
};

class Report {
 public:
  void add(Status status, std::string check, std::string detail, std::string fix = {});
  bool failed() const;
  void print_last() const;  // prints each finding as it is added
  std::string summary() const;
  nlohmann::json to_json() const;

 private:
  std::vector<Finding> findings_;
};

struct DoctorOptions {
  DeviceSelector device;
  std::string peer;  // client mode: the doctor server's address
  std::uint16_t port = 18515;
  int timeout = 60;                 // seconds
  std::uint64_t bytes = 4096;       // per write in the exchange
  std::uint64_t pin = 64ull << 20;  // memory a job is expected to pin (memlock check)
  std::optional<std::string> json_file;
};

// Local checks. Returns the opened device when it could be opened.
std::optional<Device> check_local(const DoctorOptions& options, Report& report);
// rdma_cm reachability and a verified RDMA WRITE in each direction (peer.cpp).
void check_peer(const DoctorOptions& options, const Device& device, Report& report);

}  // namespace gradlane::doctor
