// SPDX-License-Identifier: Apache-2.0
#include "mesh/platform/log.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "mesh/platform/check.h"
#include "mesh/platform/text.h"
#include "mesh/platform/thread_guard.h"

namespace mesh {
namespace {

std::atomic<ncclDebugLogger_t> gLogger{nullptr};

ncclDebugLogLevel levelFromEnv() {
  const char* v = getenv("NCCL_DEBUG");
  if (v == nullptr) return NCCL_LOG_WARN;
  if (strcasecmp(v, "TRACE") == 0) return NCCL_LOG_TRACE;
  if (strcasecmp(v, "INFO") == 0) return NCCL_LOG_INFO;
  if (strcasecmp(v, "VERSION") == 0) return NCCL_LOG_VERSION;
  if (strcasecmp(v, "NONE") == 0) return NCCL_LOG_NONE;
  return NCCL_LOG_WARN;
}

std::atomic<int> gFallbackLevel{-1};  // -1: not read from the environment yet

const char* levelTag(ncclDebugLogLevel level) {
  switch (level) {
    case NCCL_LOG_WARN: return "WARN";
    case NCCL_LOG_INFO: return "INFO";
    case NCCL_LOG_TRACE: return "TRACE";
    default: return "LOG";
  }
}

}  // namespace

void setLogger(ncclDebugLogger_t logger) { gLogger.store(logger, std::memory_order_release); }
ncclDebugLogger_t logger() { return gLogger.load(std::memory_order_acquire); }
void setFallbackLevel(ncclDebugLogLevel level) { gFallbackLevel.store(level); }

void logMessage(ncclDebugLogLevel level, unsigned long flags, const char* file, int line,
                const char* fmt, ...) {
  char buf[1024];
  MESH_VFORMAT(buf, fmt);

  ncclDebugLogger_t fn = logger();
  if (fn != nullptr) {
    fn(level, flags, file, line, "%s", buf);
    return;
  }
  int limit = gFallbackLevel.load();
  if (limit < 0) {
    limit = levelFromEnv();
    gFallbackLevel.store(limit);
  }
  if (static_cast<int>(level) > limit || level == NCCL_LOG_NONE) return;
  // One fprintf per message keeps lines from different threads whole.
  fprintf(stderr, "nccl-mesh %s %s\n", levelTag(level), buf);
}

void noteThreadException(const char* thread, const char* what, const char* why) noexcept {
  // Per thread: the reactor's and the relay's counts do not hide each other's first line.
  thread_local std::chrono::steady_clock::time_point last{};
  thread_local unsigned long unlogged = 0;
  auto now = std::chrono::steady_clock::now();
  if (last != std::chrono::steady_clock::time_point{} && now - last < std::chrono::seconds(1)) {
    ++unlogged;
    return;
  }
  last = now;
  MESH_WARN("%s: %s failed: %s; it goes on (%lu more since the last such line)", thread, what, why, unlogged);
  unlogged = 0;
}

const char* resultName(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "ncclSuccess";
    case ncclUnhandledCudaError: return "ncclUnhandledCudaError";
    case ncclSystemError: return "ncclSystemError";
    case ncclInternalError: return "ncclInternalError";
    case ncclInvalidArgument: return "ncclInvalidArgument";
    case ncclInvalidUsage: return "ncclInvalidUsage";
    case ncclRemoteError: return "ncclRemoteError";
    case ncclInProgress: return "ncclInProgress";
    default: return "ncclResult(unknown)";
  }
}

}  // namespace mesh
