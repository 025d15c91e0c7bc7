// SPDX-License-Identifier: Apache-2.0
// The WARN lines the code under test logs, for tests that check them: installs itself as
// the plugin's logger while alive (one at a time; the logger is a plain function pointer).
#pragma once

#include <cstdarg>
#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

#include "mesh/platform/log.h"

namespace mesh {
namespace testing_support {

inline std::vector<std::string>& capturedWarnings() {
  static std::vector<std::string> lines;
  return lines;
}
// The code under test may WARN from its own threads (the handshake reactor) while the test
// thread does: appends and the locked readers below take this.
inline std::mutex& capturedWarningsMutex() {
  static std::mutex m;
  return m;
}

__attribute__((format(printf, 5, 6))) inline void captureWarning(ncclDebugLogLevel level, unsigned long,
                                                                const char*, int, const char* fmt, ...) {
  if (level != NCCL_LOG_WARN) return;
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  std::lock_guard<std::mutex> lock(capturedWarningsMutex());
  capturedWarnings().emplace_back(buf);
}

class WarnCapture {
 public:
  WarnCapture() {
    std::lock_guard<std::mutex> lock(capturedWarningsMutex());
    capturedWarnings().clear();
    setLogger(captureWarning);
  }
  ~WarnCapture() { setLogger(nullptr); }
  WarnCapture(const WarnCapture&) = delete;
  WarnCapture& operator=(const WarnCapture&) = delete;
  // For tests whose code WARNs only from the test's thread, or after its threads stopped.
  const std::vector<std::string>& lines() const { return capturedWarnings(); }
  std::string last() const {
    std::lock_guard<std::mutex> lock(capturedWarningsMutex());
    return capturedWarnings().empty() ? std::string() : capturedWarnings().back();
  }
  // Safe while other threads WARN: whether a line holds every one of `parts`.
  bool has(std::initializer_list<const char*> parts) const {
    std::lock_guard<std::mutex> lock(capturedWarningsMutex());
    for (const std::string& w : capturedWarnings()) {
      bool all = true;
      for (const char* p : parts) all = all && w.find(p) != std::string::npos;
      if (all) return true;
    }
    return false;
  }
};

}  // namespace testing_support
}  // namespace mesh
