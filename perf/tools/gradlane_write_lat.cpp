// RDMA WRITE latency: see latency.cpp.
#include "common/tool.hpp"

int main(int argc, char** argv) { return gradlane::perf::latency_main(gradlane::perf::kWriteLat, argc, argv); }
