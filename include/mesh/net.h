// Core entry points behind the ABI layer, one per ncclNet call, with internal types only.
// The ABI layer validates pointers and translates; these own the semantics.
#pragma once

#include <cstddef>
#include <cstdint>

#include "err.h"
#include "mesh/comm.h"
#include "mesh/mr_cache.h"

namespace mesh {

struct ListenComm;

ncclResult_t netListen(int dev, void* handle, ListenComm** out);
ncclResult_t netConnect(int dev, void* handle, const ConnOptions& opts, SendComm** out);
ncclResult_t netAccept(ListenComm* listen, RecvComm** out);
ncclResult_t netRegMr(void* comm, void* data, size_t size, int type, int dmabufFd, uint64_t offset,
                      MrHandle** out);
ncclResult_t netDeregMr(MrHandle* handle);
ncclResult_t netIsend(SendComm* comm, void* data, size_t size, int tag, MrHandle* mh, Request** out);
ncclResult_t netIrecv(RecvComm* comm, int n, void** data, const size_t* sizes, const int* tags,
                      MrHandle* const* mh, Request** out);
ncclResult_t netIflush(RecvComm* comm, int n, void** data, const int* sizes, MrHandle* const* mh,
                       Request** out);
ncclResult_t netTest(Request* req, int* done, size_t* sizes, int* count);
ncclResult_t netCloseSend(SendComm* comm);
ncclResult_t netCloseRecv(RecvComm* comm);
ncclResult_t netCloseListen(ListenComm* comm);

}  // namespace mesh
