#include "sidecar/peer/schedule_log.hpp"

#include <cerrno>
#include <fmt/format.h>
#include <variant>

#include "common/overloaded.hpp"
#include "common/syscall_error.hpp"

namespace gradlane::sidecar {
namespace {

std::int64_t ns(sched::Instant t) { return t.time_since_epoch().count(); }

}  // namespace

std::string decision_json(const sched::Outcome& outcome, sched::Instant now, std::string_view origin) {
  return std::visit(
      detail::Overloaded{
          [&](const sched::Grant& g) {
            return fmt::format(
                R"({{"at":{},"origin":"{}","kind":"go","request":{},"part":{},"parts":{},"job":{},"tensor":{},"sender":{},)"
                R"("receiver":{},"bytes":{},"seq":{},"delay":{},"slot_start":{},"slot_end":{}}})",
                ns(now), origin, static_cast<std::uint64_t>(g.request), g.part, g.part_count, sched::to_int(g.job),
                sched::to_int(g.tensor), sched::to_int(g.sender), sched::to_int(g.receiver), g.length, g.seq, g.delay,
                ns(g.slot.start), ns(g.slot.end));
          },
          [&](const sched::Redirect& r) {
            return fmt::format(
                R"({{"at":{},"origin":"{}","kind":"redirect","request":{},"part":{},"parts":{},"job":{},"sender":{},)"
                R"("aggregator":{},"receiver":{},"aggregate":{},"bytes":{},"slot_start":{},"slot_end":{}}})",
                ns(now), origin, static_cast<std::uint64_t>(r.request), r.part, r.part_count, sched::to_int(r.job),
                sched::to_int(r.sender), sched::to_int(r.aggregator), sched::to_int(r.receiver),
                static_cast<std::uint64_t>(r.aggregate), r.length, ns(r.slot.start), ns(r.slot.end));
          },
          [&](const sched::AggregateGrant& a) {
            return fmt::format(
                R"({{"at":{},"origin":"{}","kind":"aggregate","aggregate":{},"members":{},"aggregator":{},"receiver":{},)"
                R"("bytes":{},"seq":{},"delay":{},"slot_start":{},"slot_end":{}}})",
                ns(now), origin, static_cast<std::uint64_t>(a.aggregate), a.members.size(), sched::to_int(a.aggregator),
                sched::to_int(a.receiver), a.length, a.seq, a.delay, ns(a.slot.start), ns(a.slot.end));
          },
          [&](const sched::Cancel& c) {
            return fmt::format(R"({{"at":{},"origin":"{}","kind":"cancel","job":{},"receiver":{},"seq":{}}})", ns(now),
                               origin, sched::to_int(c.job), sched::to_int(c.receiver), c.seq);
          },
          [&](const sched::Drop& d) {
            return fmt::format(
                R"({{"at":{},"origin":"{}","kind":"drop","request":{},"part":{},"parts":{},"job":{},"sender":{},"receiver":{},)"
                R"("bytes":{},"delay":{}}})",
                ns(now), origin, static_cast<std::uint64_t>(d.request), d.part, d.part_count, sched::to_int(d.job),
                sched::to_int(d.sender), sched::to_int(d.receiver), d.length, d.delay);
          },
      },
      outcome);
}

ScheduleLog::ScheduleLog(const std::string& path) {
  if (path == "-") {
    file_ = stderr;
  } else {
    file_ = std::fopen(path.c_str(), "a");
    if (file_ == nullptr) detail::throw_call_failed(Errc::system, "opening schedule log " + path, errno);
    owned_ = true;
  }
}

ScheduleLog::~ScheduleLog() {
  if (owned_) std::fclose(file_);
}

void ScheduleLog::decision(const sched::Outcome& outcome, sched::Instant now, std::string_view origin) {
  fmt::print(file_, "{}\n", decision_json(outcome, now, origin));
  // Flushed per decision: a reader (or a post-mortem after a crash) sees every decision made.
  std::fflush(file_);
}

void ScheduleLog::completion(sched::TransferId transfer, sched::Instant now, sched::Nanos measured, bool ok) {
  fmt::print(file_, R"({{"at":{},"kind":"complete","transfer":{},"measured_ns":{},"ok":{}}})" "\n", ns(now),
             static_cast<std::uint64_t>(transfer), measured.count(), ok ? "true" : "false");
  std::fflush(file_);
}

}  // namespace gradlane::sidecar
