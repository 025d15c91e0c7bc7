// SPDX-License-Identifier: Apache-2.0
// The call recorder (NCCL_MESH_TRACE=<path prefix>): every ncclNet call NCCL makes, as the
// ABI layer sees it, into <prefix>.<host>.<pid>.trace (trace_format.h says what a line
// holds). For bug reports, and for tests/replay, which replays such files against the
// plugin on the userspace fabric.
// Owns: the open trace file, its buffer, and the ids it gives NCCL's comms, registrations,
// requests and contexts (pointers never reach the file).
//
// Cost when off: the table wrappers (traced.h) test one relaxed atomic bool after each call
// and branch over the hook; nothing else runs. On: every hook takes one mutex (NCCL's proxy
// threads share the ids), formats one line into a 64 KiB buffer and writes it out when full,
// at finalize, at every close and when the library is unloaded or the process exits.
// Bounded by NCCL_MESH_TRACE_MAX: at the cap the file gets "end cap", one WARN is logged and
// recording stops for the rest of the process.
// Threads: any NCCL thread calls the hooks; all state is under one mutex. A child forked
// after init records nothing and never takes that mutex (the fork may have copied it held):
// its copy of the buffer is never written.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "err.h"
#include "trace_format.h"

namespace mesh {
namespace trace {

// Written by init (on) and by the cap or unload (off), read by every entry point.
extern std::atomic<bool> gOn;
inline bool on() { return __builtin_expect(gOn.load(std::memory_order_relaxed), 0); }

// A hook threw (the recorder could not allocate, or lock): recording stops with a WARN and
// NCCL's call returns as it would have; an exception must never reach NCCL's C frames.
void stopAfterHookFailure(const char* what) noexcept;

// After every init, traced or not: the first one with NCCL_MESH_TRACE set opens the file.
// `ctx`: the context v11/v12 returned (NULL before v11); `tc`: its traffic class.
void afterInit(int api, ncclResult_t r, void* const* ctx, uint64_t commId, int tc);

// The hooks below run only while on(); each records one call from its arguments after the
// call returned (out-pointers are read, never trusted to be non-NULL).
void afterFinalize(int api, void* ctx, ncclResult_t r);
void afterDevices(int api, const int* ndev, ncclResult_t r);
void afterProps(int api, int dev, int maxRecvs, int ptrSupport, int speed, const char* name, ncclResult_t r);
void afterListen(int api, void* ctx, int dev, const void* handle, void* const* listenComm, ncclResult_t r);
void afterConnect(int api, void* ctx, int dev, const void* handle, int tc, void* const* sendComm, ncclResult_t r);
void afterAccept(int api, void* listenComm, void* const* recvComm, ncclResult_t r);
void afterRegMr(int api, void* comm, void* data, size_t size, int type, bool dmabuf, void* const* mhandle,
                ncclResult_t r);
void afterDeregMr(int api, void* comm, void* mhandle, ncclResult_t r);
void afterIsend(int api, void* sendComm, const void* data, size_t size, int tag, void* mhandle,
                void* const* request, ncclResult_t r);
// Sizes are v8's ints or v9+'s size_t: exactly one of the two is non-NULL (or both NULL).
void afterIrecv(int api, void* recvComm, int n, void* const* data, const int* intSizes, const size_t* sizes,
                const int* tags, void* const* mhandles, void* const* request, ncclResult_t r);
void afterIflush(int api, void* recvComm, int n, void* const* data, const int* sizes, void* const* mhandles,
                 void* const* request, ncclResult_t r);
void afterTest(int api, void* request, const int* done, const int* sizes, ncclResult_t r);
void afterClose(int api, Call which, void* comm, ncclResult_t r);
void afterGetDeviceMr(int api, void* comm, void* mhandle, ncclResult_t r);
void afterIrecvConsumed(int api, void* recvComm, int n, void* request, ncclResult_t r);
void afterSetNetAttr(int api, void* ctx, ncclResult_t r);

}  // namespace trace
}  // namespace mesh
