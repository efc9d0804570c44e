// Runs the README's example (examples/push_update.cpp) as a server and a worker process.
#include <sys/wait.h>

#include <gtest/gtest.h>

#include "harness.hpp"

namespace gradlane::testing {
namespace {

TEST(ReadmeExample, WorkerPushesAGradientTheServerSums) {
  const auto env = softroce_env();
  ExternalProcess server({GRADLANE_EXAMPLE_PUSH_UPDATE, env.device});
  ExternalProcess worker({GRADLANE_EXAMPLE_PUSH_UPDATE, env.device, env.address});
  const auto worker_status = worker.wait_exit(60s);
  const auto server_status = server.wait_exit(60s);
  ASSERT_TRUE(worker_status && server_status) << "example did not finish";
  EXPECT_TRUE(WIFEXITED(*worker_status) && WEXITSTATUS(*worker_status) == 0) << *worker_status;
  EXPECT_TRUE(WIFEXITED(*server_status) && WEXITSTATUS(*server_status) == 0) << "server's sum was wrong";
}

}  // namespace
}  // namespace gradlane::testing
