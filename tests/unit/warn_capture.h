// SPDX-License-Identifier: Apache-2.0
// The WARN lines the code under test logs, for tests that check them: installs itself as
// the plugin's logger while alive (one at a time; the logger is a plain function pointer).
#pragma once

#include <cstdarg>
#include <cstdio>
#include <string>
#include <vector>

#include "mesh/platform/log.h"

namespace mesh {
namespace testing_support {

inline std::vector<std::string>& capturedWarnings() {
  static std::vector<std::string> lines;
  return lines;
}

__attribute__((format(printf, 5, 6))) inline void captureWarning(ncclDebugLogLevel level, unsigned long,
                                                                const char*, int, const char* fmt, ...) {
  if (level != NCCL_LOG_WARN) return;
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  capturedWarnings().emplace_back(buf);
}

class WarnCapture {
 public:
  WarnCapture() {
    capturedWarnings().clear();
    setLogger(captureWarning);
  }
  ~WarnCapture() { setLogger(nullptr); }
  WarnCapture(const WarnCapture&) = delete;
  WarnCapture& operator=(const WarnCapture&) = delete;
  const std::vector<std::string>& lines() const { return capturedWarnings(); }
  std::string last() const { return lines().empty() ? std::string() : lines().back(); }
};

}  // namespace testing_support
}  // namespace mesh
