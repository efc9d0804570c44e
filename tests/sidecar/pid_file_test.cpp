// gradlaned --pid-file: one live gradlaned per file, named when a second one tries; a file left
// by a dead one is taken over; the file goes away with its owner.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "gradlane/error.hpp"
#include "sidecar/daemon/pid_file.hpp"
#include "../common/text_file.hpp"

namespace gradlane::sidecar {
namespace {

using gradlane::testing::read_text_file;

std::string temp_path(const char* what) {
  return ::testing::TempDir() + "gradlane-pidfile-" + what + "-" + std::to_string(::getpid());
}

bool exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

TEST(PidFile, HoldsThePidAndIsRemovedWithItsOwner) {
  const std::string path = temp_path("owner");
  {
    PidFile pid = PidFile::acquire(path);
    EXPECT_EQ(read_text_file(path), "") << "empty until the daemon is ready";
    pid.publish(4242);
    EXPECT_EQ(read_text_file(path), "4242\n");
  }
  EXPECT_FALSE(exists(path)) << "a clean exit removes the pid file";
}

TEST(PidFile, ASecondDaemonOnTheSameFileIsRefusedNamingTheFirst) {
  const std::string path = temp_path("second");
  PidFile first = PidFile::acquire(path);
  first.publish(::getpid());
  try {
    PidFile second = PidFile::acquire(path);
    ADD_FAILURE() << "two owners of one pid file";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument);
    const std::string what = e.what();
    EXPECT_NE(what.find("already running (pid " + std::to_string(::getpid()) + ","), std::string::npos) << what;
    EXPECT_NE(what.find(path), std::string::npos) << what;
  }
  EXPECT_EQ(read_text_file(path), std::to_string(::getpid()) + "\n") << "the refused start must not touch the file";
}

TEST(PidFile, AFileLeftByADeadDaemonIsTakenOver) {
  const std::string path = temp_path("stale");
  {
    std::ofstream(path) << "999999\n";  // nobody holds its lock: its gradlaned is gone
  }
  {
    PidFile pid = PidFile::acquire(path);
    EXPECT_EQ(read_text_file(path), "") << "the dead daemon's pid must not be left in the file";
    pid.publish(77);
    EXPECT_EQ(read_text_file(path), "77\n");
  }
  EXPECT_FALSE(exists(path));
}

}  // namespace
}  // namespace gradlane::sidecar
