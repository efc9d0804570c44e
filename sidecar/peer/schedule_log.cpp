#include "sidecar/peer/schedule_log.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fmt/format.h>
#include <utility>
#include <variant>

#include "common/overloaded.hpp"
#include "common/syscall_error.hpp"
#include "gradlane/error.hpp"

namespace gradlane::sidecar {
namespace {

std::int64_t ns(sched::Instant t) { return t.time_since_epoch().count(); }
std::uint64_t id(sched::TransferId t) { return static_cast<std::uint64_t>(t); }

}  // namespace

std::string decision_json(const sched::Outcome& outcome, sched::Instant now, std::string_view origin) {
  return std::visit(
      detail::Overloaded{
          [&](const sched::Grant& g) {
            return fmt::format(
                R"({{"at":{},"origin":"{}","kind":"go","transfer":{},"request":{},"part":{},"parts":{},"job":{},"tensor":{},"sender":{},)"
                R"("receiver":{},"bytes":{},"seq":{},"delay":{},"slot_start":{},"slot_end":{}}})",
                ns(now), origin, id(g.transfer), static_cast<std::uint64_t>(g.request), g.part, g.part_count,
                sched::to_int(g.job), sched::to_int(g.tensor), sched::to_int(g.sender), sched::to_int(g.receiver),
                g.length, g.seq, g.delay, ns(g.slot.start), ns(g.slot.end));
          },
          [&](const sched::Redirect& r) {
            return fmt::format(
                R"({{"at":{},"origin":"{}","kind":"redirect","transfer":{},"request":{},"part":{},"parts":{},"job":{},"sender":{},)"
                R"("aggregator":{},"receiver":{},"aggregate":{},"bytes":{},"slot_start":{},"slot_end":{}}})",
                ns(now), origin, id(r.transfer), static_cast<std::uint64_t>(r.request), r.part, r.part_count,
                sched::to_int(r.job), sched::to_int(r.sender), sched::to_int(r.aggregator), sched::to_int(r.receiver),
                static_cast<std::uint64_t>(r.aggregate), r.length, ns(r.slot.start), ns(r.slot.end));
          },
          [&](const sched::AggregateGrant& a) {
            return fmt::format(
                R"({{"at":{},"origin":"{}","kind":"aggregate","transfer":{},"aggregate":{},"members":{},"aggregator":{},"receiver":{},)"
                R"("bytes":{},"seq":{},"delay":{},"slot_start":{},"slot_end":{}}})",
                ns(now), origin, id(a.transfer), static_cast<std::uint64_t>(a.aggregate), a.members.size(),
                sched::to_int(a.aggregator), sched::to_int(a.receiver), a.length, a.seq, a.delay, ns(a.slot.start),
                ns(a.slot.end));
          },
          [&](const sched::Cancel& c) {
            return fmt::format(R"({{"at":{},"origin":"{}","kind":"cancel","job":{},"receiver":{},"seq":{}}})", ns(now),
                               origin, sched::to_int(c.job), sched::to_int(c.receiver), c.seq);
          },
          [&](const sched::Drop& d) {
            return fmt::format(
                R"({{"at":{},"origin":"{}","kind":"drop","reason":"{}","request":{},"part":{},"parts":{},"job":{},)"
                R"("sender":{},"receiver":{},"offset":{},"bytes":{},"delay":{}}})",
                ns(now), origin, sched::drop_reason_name(d.reason), static_cast<std::uint64_t>(d.request), d.part,
                d.part_count, sched::to_int(d.job), sched::to_int(d.sender), sched::to_int(d.receiver), d.offset,
                d.length, d.delay);
          },
      },
      outcome);
}

std::string completion_json(sched::TransferId transfer, const sched::TransferView& granted, sched::Instant now,
                            sched::Nanos measured, sched::TransferResult result) {
  const sched::Slot used = sched::used_slot(granted.slot, now, result);
  return fmt::format(
      R"({{"at":{},"origin":"here","kind":"completion","transfer":{},"ok":{},"sender":{},"receiver":{},"seq":{},)"
      R"("bytes":{},"measured_ns":{},"slot_start":{},"slot_end":{},"used_end":{}}})",
      ns(now), id(transfer), result == sched::TransferResult::ok, sched::to_int(granted.sender),
      sched::to_int(granted.receiver), granted.seq, granted.bytes, measured.count(), ns(granted.slot.start),
      ns(granted.slot.end), ns(used.end));
}

std::string request_json(const sched::Request& request, sched::Instant now) {
  return fmt::format(
      R"({{"at":{},"origin":"here","kind":"request","request":{},"job":{},"tensor":{},"sender":{},"receiver":{},)"
      R"("bytes":{},"computed_on":{}}})",
      ns(now), static_cast<std::uint64_t>(request.id), sched::to_int(request.job), sched::to_int(request.tensor),
      sched::to_int(request.sender), sched::to_int(request.receiver), request.bytes, request.computed_on);
}

std::string applied_json(sched::EndpointId receiver, sched::Seq through, sched::Instant now) {
  return fmt::format(R"({{"at":{},"origin":"here","kind":"applied","receiver":{},"seq":{}}})", ns(now),
                     sched::to_int(receiver), through);
}

namespace {

// Why a path is refused as the log without an errno of its own.
constexpr int kNotRegular = -1;
constexpr int kOtherLinks = -2;

// The log file: a regular file with no other name, never reached through a symbolic link, and
// never blocking on a FIFO planted in its place (gradlaned runs as root; the log may sit in a
// shared directory). Truncated only once it is known to be that file. `append`: keep what is
// there (a reopen).
std::FILE* open_log(const std::string& path, bool append, int& error) {
  const int flags = O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK | (append ? O_APPEND : 0);
  const int fd = ::open(path.c_str(), flags, 0640);
  if (fd < 0) {
    error = errno == ENXIO ? kNotRegular : errno;  // ENXIO: a FIFO nobody reads
    return nullptr;
  }
  struct stat st {};
  error = ::fstat(fd, &st) != 0 ? errno : !S_ISREG(st.st_mode) ? kNotRegular : st.st_nlink != 1 ? kOtherLinks : 0;
  if (error == 0 && ::fcntl(fd, F_SETFL, append ? O_APPEND : 0) != 0) error = errno;  // blocking again
  if (error == 0 && !append && ::ftruncate(fd, 0) != 0) error = errno;
  std::FILE* file = error == 0 ? ::fdopen(fd, append ? "a" : "w") : nullptr;
  if (file == nullptr) {
    if (error == 0) error = errno;
    ::close(fd);
  }
  return file;
}

std::string open_failure(const std::string& path, int error) {
  switch (error) {
    case ELOOP:
      return "schedule log " + path + " is a symbolic link: give the file itself";
    case kNotRegular:
      return "schedule log " + path + " is not a regular file: give a file's path";
    case kOtherLinks:
      return "schedule log " + path + " has other links to it: give a file of its own";
    default:
      return "opening schedule log " + path;
  }
}

}  // namespace

ScheduleLog::ScheduleLog(const std::string& path) : path_(path) {
  if (path == "-") {
    file_ = stderr;
    return;
  }
  int error = 0;
  file_ = open_log(path, /*append=*/false, error);
  if (file_ == nullptr) {
    if (error == ELOOP || error < 0) throw Error(Errc::system, open_failure(path, error));
    detail::throw_call_failed(Errc::system, open_failure(path, error), error);
  }
  owned_ = true;
}

ScheduleLog::~ScheduleLog() {
  if (owned_) std::fclose(file_);
}

std::optional<std::string> ScheduleLog::reopen() {
  if (!owned_) return std::nullopt;  // stderr: nothing to reopen
  int error = 0;
  std::FILE* file = open_log(path_, /*append=*/true, error);
  if (file == nullptr) {
    return open_failure(path_, error) + (error > 0 ? std::string(": ") + std::strerror(error) : std::string()) +
           "; still writing the old file";
  }
  std::fclose(file_);
  file_ = file;
  failure_said_ = false;  // a new file: its first failure is news
  return std::nullopt;
}

void ScheduleLog::write_line(const std::string& json) noexcept {
  // Flushed per line: a reader (or a post-mortem after a crash) sees every decision made.
  const bool written = std::fwrite(json.data(), 1, json.size(), file_) == json.size() &&
                       std::fputc('\n', file_) != EOF && std::fflush(file_) == 0;
  if (written) return;
  std::clearerr(file_);
  ++failed_writes_;
  if (!std::exchange(failure_said_, true)) {
    std::fprintf(stderr, "gradlaned: cannot write the schedule log %s: %s; scheduling goes on, lines are lost\n",
                 path_.c_str(), std::strerror(errno));
  }
}

void ScheduleLog::decision(const sched::Outcome& outcome, sched::Instant now, std::string_view origin) {
  write_line(decision_json(outcome, now, origin));
}

void ScheduleLog::completion(sched::TransferId transfer, const sched::TransferView& granted, sched::Instant now,
                             sched::Nanos measured, sched::TransferResult result) {
  write_line(completion_json(transfer, granted, now, measured, result));
}

void ScheduleLog::request(const sched::Request& request, sched::Instant now) { write_line(request_json(request, now)); }

void ScheduleLog::applied(sched::EndpointId receiver, sched::Seq through, sched::Instant now) {
  write_line(applied_json(receiver, through, now));
}

}  // namespace gradlane::sidecar
