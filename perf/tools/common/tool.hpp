// The entry points of the four tools: each main() is one line naming its ToolKind.
#pragma once

#include <exception>
#include <iostream>

#include "common/options.hpp"
#include "gradlane/error.hpp"

namespace gradlane::perf {

int bandwidth_main(const ToolKind& kind, int argc, char** argv);  // bandwidth.cpp
int latency_main(const ToolKind& kind, int argc, char** argv);    // latency.cpp

// Runs a tool body: a gradlane::Error (or any exception) becomes one line on stderr naming
// the tool and the error's category, and exit status 1 — never an abort, never a hang.
template <class Body>
int guarded(const char* tool, Body body) {
  try {
    return body();
  } catch (const Error& e) {
    std::cout.flush();
    std::cerr << tool << ": " << errc_name(e.code()) << ": " << e.what() << '\n';
  } catch (const std::exception& e) {
    std::cout.flush();
    std::cerr << tool << ": " << e.what() << '\n';
  }
  return 1;
}

}  // namespace gradlane::perf
