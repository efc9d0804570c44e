// RDMA READ latency: see latency.cpp.
#include "common/tool.hpp"

int main(int argc, char** argv) { return gradlane::perf::latency_main(gradlane::perf::kReadLat, argc, argv); }
