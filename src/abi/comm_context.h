// SPDX-License-Identifier: Apache-2.0
// Communicator contexts, the part of the ncclNet ABI that v11 (NCCL 2.28+) introduced and
// v12 (NCCL 2.30) keeps unchanged: both tables (net_v11.cpp, net_v12.cpp) use these entry
// points.
//
// NCCL calls init(&ctx, commId, config, ...) for every communicator and finalize(ctx) when
// it is destroyed; listen/connect name the communicator by its ctx. Underneath, the plugin
// is still initialized once per process (Plugin::init is idempotent) and torn down only by
// the library destructor: finalizing the last context frees the context, nothing more.
// A context carries what the communicator's config asked for (its traffic class).
//
// Contexts are looked up in a registry rather than dereferenced, so a stale or foreign ctx
// is an error with a WARN, never a crash. The lookup costs an uncontended mutex on listen,
// connect and setNetAttr. The last is on NCCL's data path: NCCL 2.28+ calls it from proxy
// progress before a transfer whose peers, channels, collective, algorithm or protocol differ
// from the communicator's (net.cc setXferNetAttrs), so as often as once per operation.
#pragma once

#include <cstddef>
#include <cstdint>

#include "net_v11.h"

namespace mesh {
namespace abi {

// `abi`: 11 or 12, the table NCCL entered through (ctxInitAs<> fills it in).
ncclResult_t ctxInit(int abi, void** ctx, uint64_t commId, ncclNetCommConfig_v11_t* config,
                     ncclDebugLogger_t logFunction, ncclProfilerCallback_t profFunction);
template <int kAbi>
ncclResult_t ctxInitAs(void** ctx, uint64_t commId, ncclNetCommConfig_v11_t* config, ncclDebugLogger_t logFunction,
                       ncclProfilerCallback_t profFunction) {
  return ctxInit(kAbi, ctx, commId, config, logFunction, profFunction);
}
ncclResult_t ctxFinalize(void* ctx);
ncclResult_t ctxListen(void* ctx, int dev, void* handle, void** listenComm);
ncclResult_t ctxConnect(void* ctx, int dev, void* handle, void** sendComm, ncclNetDeviceHandle_v11_t** sendDevComm);
ncclResult_t ctxIsend(void* sendComm, void* data, size_t size, int tag, void* mhandle, void* phandle, void** request);
ncclResult_t ctxIrecv(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhandles, void** phandles,
                      void** request);
ncclResult_t ctxSetNetAttr(void* ctx, ncclNetAttr_v11_t* netAttr);

}  // namespace abi
}  // namespace mesh
