// PidFile: `gradlaned --pid-file PATH` — where a detached gradlaned tells init scripts and
// operators its pid.
//
// The file is held with an exclusive flock() for the daemon's whole life. Whether a gradlaned
// still runs is therefore answered by the kernel (the lock dies with its process), not by
// guessing whether the pid in a leftover file was reused by something else: a file nobody
// locks is stale and is taken over; a locked one belongs to a live gradlaned and starting a
// second one on it is an error naming that pid.
#pragma once

#include <sys/types.h>

#include <string>
#include <utility>

#include "common/unique_fd.hpp"

namespace gradlane::sidecar {

class PidFile {
 public:
  // Opens (creating, mode 0644) and locks `path`, emptying a stale file. Throws
  // Error(invalid_argument) naming the pid if a live gradlaned holds it, Error(system) naming
  // the path if it cannot be opened.
  static PidFile acquire(const std::string& path);

  PidFile(PidFile&&) noexcept = default;
  PidFile& operator=(PidFile&&) noexcept = delete;
  PidFile(const PidFile&) = delete;
  PidFile& operator=(const PidFile&) = delete;
  // Removes the file if it is still the one we locked (clean exit, or a start that failed).
  ~PidFile();

  // Writes this process's pid. Called once the daemon is ready to serve (the segment exists),
  // so a pid in the file always means "attach now works"; an empty file means "starting".
  void publish(pid_t pid);

  const std::string& path() const noexcept { return path_; }

 private:
  PidFile(std::string path, UniqueFd fd) noexcept : path_(std::move(path)), fd_(std::move(fd)) {}

  std::string path_;
  UniqueFd fd_;
};

}  // namespace gradlane::sidecar
