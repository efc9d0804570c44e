// RDMA WRITE bandwidth: see bandwidth.cpp.
#include "common/tool.hpp"

int main(int argc, char** argv) { return gradlane::perf::bandwidth_main(gradlane::perf::kWriteBw, argc, argv); }
