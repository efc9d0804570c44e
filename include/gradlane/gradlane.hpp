// gradlane — the embedding API. Include this one header and link gradlane::gradlane.
#pragma once

#include "gradlane/completion_queue.hpp"
#include "gradlane/connection.hpp"
#include "gradlane/device.hpp"
#include "gradlane/error.hpp"
#include "gradlane/memory.hpp"
#include "gradlane/memory_window.hpp"
#include "gradlane/options.hpp"
#include "gradlane/ps.hpp"
#include "gradlane/registration_cache.hpp"
#include "gradlane/sidecar.hpp"
