// SPDX-License-Identifier: Apache-2.0
// Error propagation: every internal function that can fail returns ncclResult_t and its
// callers propagate it with MESH_CHECK. Nothing here throws or aborts.
#pragma once

#include <cerrno>
#include <cstring>

#include "err.h"
#include "mesh/platform/log.h"

namespace mesh {
const char* resultName(ncclResult_t r);
}  // namespace mesh

// Propagates a non-success result unchanged.
#define MESH_CHECK(call)                                         \
  do {                                                           \
    ncclResult_t mesh_res_ = (call);                             \
    if (mesh_res_ != ncclSuccess) return mesh_res_;              \
  } while (0)

// Logs and returns `err` when `cond` is false.
#define MESH_REQUIRE(cond, err, fmt, ...)                        \
  do {                                                           \
    if (!(cond)) {                                               \
      MESH_WARN(fmt, ##__VA_ARGS__);                             \
      return (err);                                              \
    }                                                            \
  } while (0)

// A POSIX call that returns -1 and sets errno: log the call with errno text and fail
// with ncclSystemError.
#define MESH_SYSCHECK(call, what)                                             \
  do {                                                                        \
    if ((call) == -1) {                                                       \
      int mesh_errno_ = errno;                                                \
      MESH_WARN("%s failed: %s (errno %d)", (what), strerror(mesh_errno_), mesh_errno_); \
      return ncclSystemError;                                                 \
    }                                                                         \
  } while (0)
