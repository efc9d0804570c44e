// What the header block reports about this run, read from the session.
#pragma once

#include "common/report.hpp"
#include "common/session.hpp"

namespace gradlane::perf {

HeaderFacts header_facts(const PerfOptions& options, Session& session);

}  // namespace gradlane::perf
