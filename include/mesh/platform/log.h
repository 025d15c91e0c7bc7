// SPDX-License-Identifier: Apache-2.0
// Logging for every module: messages go through NCCL's logger when NCCL gave us one
// (init), otherwise to stderr, filtered by NCCL_DEBUG (WARN by default).
// Owns: the process-wide logger pointer. Thread-safe: the pointer is atomic and NCCL's
// logger is itself thread-safe.
#pragma once

#include <cstdarg>
#include <cstddef>

#include "err.h"

namespace mesh {

// Installs NCCL's logger (nullptr restores the stderr fallback).
void setLogger(ncclDebugLogger_t logger);
ncclDebugLogger_t logger();

// The stderr fallback prints messages up to this level (NCCL_LOG_WARN unless NCCL_DEBUG
// says INFO/TRACE). Tools such as nccl-mesh-info raise it with -v.
void setFallbackLevel(ncclDebugLogLevel level);

// NCCL formats a message into 1024 bytes after its own prefix (host, pid, thread, device:
// up to about 150 characters) and cuts the rest; text meant to be read whole (the settings
// line) stays within this many characters.
constexpr size_t kLogLineMax = 800;

void logMessage(ncclDebugLogLevel level, unsigned long flags, const char* file, int line,
                const char* fmt, ...) __attribute__((format(printf, 5, 6)));

}  // namespace mesh

#define MESH_WARN(fmt, ...) \
  ::mesh::logMessage(NCCL_LOG_WARN, NCCL_ALL, __FILE__, __LINE__, "NET/Mesh : " fmt, ##__VA_ARGS__)
#define MESH_INFO(flags, fmt, ...) \
  ::mesh::logMessage(NCCL_LOG_INFO, (flags), __FILE__, __LINE__, "NET/Mesh : " fmt, ##__VA_ARGS__)
#define MESH_TRACE(flags, fmt, ...) \
  ::mesh::logMessage(NCCL_LOG_TRACE, (flags), __FILE__, __LINE__, "NET/Mesh : " fmt, ##__VA_ARGS__)
