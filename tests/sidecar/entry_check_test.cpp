// Every malformed-entry rule, one case each (the daemon-level tests send them for real).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "sidecar/daemon/entry_check.hpp"

namespace gradlane::sidecar {
namespace {

const AppLimits kLimits{.job = 7, .endpoint = 1, .region_bytes = 1 << 20, .max_update_bytes = 1 << 30};

shm::AppEntry submit_entry() {
  shm::AppEntry e{};
  e.format = shm::kEntryFormat;
  e.op = shm::Op::submit;
  e.job = 7;
  e.request = 1;
  e.body.submit = {.tensor = 1,
                   .receiver = 2,
                   .bytes = 4096,
                   .region_offset = 0,
                   .computed_on = 0,
                   .gradient_norm = 1.0F,
                   .priority = 0,
                   .job_remaining = 0};
  return e;
}

std::optional<Reason> check(const shm::AppEntry& e) {
  if (auto r = check_envelope(e)) return r;
  return e.op == shm::Op::submit ? check_submit(e, kLimits) : check_complete(e);
}

TEST(SidecarEntryCheck, AWellFormedSubmitPasses) { EXPECT_EQ(check(submit_entry()), std::nullopt); }

TEST(SidecarEntryCheck, DirectOnlyIsASubmitsFlagAlone) {
  shm::AppEntry e = submit_entry();
  e.flags = shm::kSubmitDirectOnly;
  EXPECT_EQ(check(e), std::nullopt);
  e = shm::AppEntry{};
  e.format = shm::kEntryFormat;
  e.op = shm::Op::complete;
  e.flags = shm::kSubmitDirectOnly;
  EXPECT_EQ(check(e), Reason::unknown_fields);
}

TEST(SidecarEntryCheck, EachMalformationHasItsReason) {
  struct Case {
    const char* what;
    void (*mutate)(shm::AppEntry&);
    Reason reason;
  };
  const Case cases[] = {
      {"future format", [](shm::AppEntry& e) { e.format = 2; }, Reason::bad_format},
      {"unknown op", [](shm::AppEntry& e) { e.op = static_cast<shm::Op>(9); }, Reason::bad_format},
      {"unknown flag", [](shm::AppEntry& e) { e.flags = 2; }, Reason::unknown_fields},
      {"unknown job", [](shm::AppEntry& e) { e.job = 8; }, Reason::unknown_job},
      {"zero bytes", [](shm::AppEntry& e) { e.body.submit.bytes = 0; }, Reason::bad_size},
      {"absurd bytes", [](shm::AppEntry& e) { e.body.submit.bytes = std::uint64_t{1} << 40; }, Reason::bad_size},
      {"bytes past region", [](shm::AppEntry& e) { e.body.submit.bytes = (1 << 20) + 64; }, Reason::bad_offset},
      {"offset past region", [](shm::AppEntry& e) { e.body.submit.region_offset = 1 << 20; }, Reason::bad_offset},
      {"offset overflows", [](shm::AppEntry& e) { e.body.submit.region_offset = ~std::uint64_t{0} - 10; },
       Reason::bad_offset},
      {"NaN norm", [](shm::AppEntry& e) { e.body.submit.gradient_norm = std::numeric_limits<float>::quiet_NaN(); },
       Reason::bad_value},
      {"negative norm", [](shm::AppEntry& e) { e.body.submit.gradient_norm = -1.0F; }, Reason::bad_value},
      {"send to self", [](shm::AppEntry& e) { e.body.submit.receiver = 1; }, Reason::bad_receiver},
  };
  for (const Case& c : cases) {
    shm::AppEntry e = submit_entry();
    c.mutate(e);
    EXPECT_EQ(check(e), c.reason) << c.what;
  }
}

TEST(SidecarEntryCheck, CompleteEntries) {
  shm::AppEntry e{};
  e.format = shm::kEntryFormat;
  e.op = shm::Op::complete;
  EXPECT_EQ(check(e), std::nullopt);
  e.body.complete.failed = 2;
  EXPECT_EQ(check(e), Reason::bad_value);
  e.body.complete.failed = 0;
  e.body.complete.reserved[3] = 1;
  EXPECT_EQ(check(e), Reason::unknown_fields);
}

}  // namespace
}  // namespace gradlane::sidecar
