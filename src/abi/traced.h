// SPDX-License-Identifier: Apache-2.0
// The exported tables' entries: each calls its implementation (abi_common.h, a version's
// adapter or comm_context.h), then, only while NCCL_MESH_TRACE records (trace.h), hands the
// arguments and the outcome to the recorder with the version of the table it sits in.
// `traced::isend<9, abi::isend>` is the v9 table's isend, and so on; one template per
// signature, so every version's table is built from the same few lines.
// Cost when not recording: one relaxed load of a bool and a branch predicted not taken,
// after the call (measured per message: docs/DESIGN-notes.md, "Call recorder").
#pragma once

#include "net_v12.h"  // and, through it, v11, v10, v9 and v8
#include "trace.h"

namespace mesh {
namespace traced {

using DevHandle = ncclNetDeviceHandle_v8_t;  // one layout in every version

template <int V, ncclResult_t (*Impl)(ncclDebugLogger_t)>
ncclResult_t init(ncclDebugLogger_t logger) {
  ncclResult_t r = Impl(logger);
  trace::afterInit(V, r, nullptr, 0, -1);  // not hot: opens the file on the first init
  return r;
}

template <int V, ncclResult_t (*Impl)(ncclDebugLogger_t, ncclProfilerCallback_t)>
ncclResult_t initProf(ncclDebugLogger_t logger, ncclProfilerCallback_t prof) {
  ncclResult_t r = Impl(logger, prof);
  trace::afterInit(V, r, nullptr, 0, -1);
  return r;
}

template <int V, ncclResult_t (*Impl)(void**, uint64_t, ncclNetCommConfig_v11_t*, ncclDebugLogger_t,
                                      ncclProfilerCallback_t)>
ncclResult_t ctxInit(void** ctx, uint64_t commId, ncclNetCommConfig_v11_t* config, ncclDebugLogger_t logger,
                     ncclProfilerCallback_t prof) {
  ncclResult_t r = Impl(ctx, commId, config, logger, prof);
  trace::afterInit(V, r, ctx, commId, config != nullptr ? config->trafficClass : -1);
  return r;
}

template <int V, ncclResult_t (*Impl)(void*)>
ncclResult_t finalize(void* ctx) {
  ncclResult_t r = Impl(ctx);
  if (trace::on()) trace::afterFinalize(V, ctx, r);
  return r;
}

template <int V, ncclResult_t (*Impl)(int*)>
ncclResult_t devices(int* ndev) {
  ncclResult_t r = Impl(ndev);
  if (trace::on()) trace::afterDevices(V, ndev, r);
  return r;
}

template <int V, typename Props, ncclResult_t (*Impl)(int, Props*)>
ncclResult_t getProperties(int dev, Props* props) {
  ncclResult_t r = Impl(dev, props);
  if (trace::on()) {
    bool ok = r == ncclSuccess && props != nullptr;
    trace::afterProps(V, dev, ok ? props->maxRecvs : 0, ok ? props->ptrSupport : 0, ok ? props->speed : 0,
                      ok ? props->name : nullptr, r);
  }
  return r;
}

template <int V, ncclResult_t (*Impl)(int, void*, void**)>
ncclResult_t listen(int dev, void* handle, void** listenComm) {
  ncclResult_t r = Impl(dev, handle, listenComm);
  if (trace::on()) trace::afterListen(V, nullptr, dev, handle, listenComm, r);
  return r;
}

template <int V, ncclResult_t (*Impl)(void*, int, void*, void**)>
ncclResult_t ctxListen(void* ctx, int dev, void* handle, void** listenComm) {
  ncclResult_t r = Impl(ctx, dev, handle, listenComm);
  if (trace::on()) trace::afterListen(V, ctx, dev, handle, listenComm, r);
  return r;
}

template <int V, ncclResult_t (*Impl)(int, void*, void**, DevHandle**)>
ncclResult_t connect(int dev, void* handle, void** sendComm, DevHandle** sendDevComm) {
  ncclResult_t r = Impl(dev, handle, sendComm, sendDevComm);
  if (trace::on()) trace::afterConnect(V, nullptr, dev, handle, -1, sendComm, r);
  return r;
}

template <int V, ncclResult_t (*Impl)(int, ncclNetCommConfig_v10_t*, void*, void**, DevHandle**)>
ncclResult_t connectCfg(int dev, ncclNetCommConfig_v10_t* config, void* handle, void** sendComm,
                        DevHandle** sendDevComm) {
  ncclResult_t r = Impl(dev, config, handle, sendComm, sendDevComm);
  if (trace::on()) {
    trace::afterConnect(V, nullptr, dev, handle, config != nullptr ? config->trafficClass : -1, sendComm, r);
  }
  return r;
}

template <int V, ncclResult_t (*Impl)(void*, int, void*, void**, DevHandle**)>
ncclResult_t ctxConnect(void* ctx, int dev, void* handle, void** sendComm, DevHandle** sendDevComm) {
  ncclResult_t r = Impl(ctx, dev, handle, sendComm, sendDevComm);
  if (trace::on()) trace::afterConnect(V, ctx, dev, handle, -1, sendComm, r);
  return r;
}

template <int V, ncclResult_t (*Impl)(void*, void**, DevHandle**)>
ncclResult_t accept(void* listenComm, void** recvComm, DevHandle** recvDevComm) {
  ncclResult_t r = Impl(listenComm, recvComm, recvDevComm);
  if (trace::on()) trace::afterAccept(V, listenComm, recvComm, r);
  return r;
}

template <int V, ncclResult_t (*Impl)(void*, void*, size_t, int, void**)>
ncclResult_t regMr(void* comm, void* data, size_t size, int type, void** mhandle) {
  ncclResult_t r = Impl(comm, data, size, type, mhandle);
  if (trace::on()) trace::afterRegMr(V, comm, data, size, type, false, mhandle, r);
  return r;
}

template <int V, ncclResult_t (*Impl)(void*, void*, size_t, int, uint64_t, int, void**)>
ncclResult_t regMrDmaBuf(void* comm, void* data, size_t size, int type, uint64_t offset, int fd, void** mhandle) {
  ncclResult_t r = Impl(comm, data, size, type, offset, fd, mhandle);
  if (trace::on()) trace::afterRegMr(V, comm, data, size, type, true, mhandle, r);
  return r;
}

template <int V, ncclResult_t (*Impl)(void*, void*)>
ncclResult_t deregMr(void* comm, void* mhandle) {
  ncclResult_t r = Impl(comm, mhandle);
  if (trace::on()) trace::afterDeregMr(V, comm, mhandle, r);
  return r;
}

template <int V, ncclResult_t (*Impl)(void*, void*, int, int, void*, void**)>
ncclResult_t isendInt(void* sendComm, void* data, int size, int tag, void* mhandle, void** request) {
  ncclResult_t r = Impl(sendComm, data, size, tag, mhandle, request);
  if (trace::on()) {
    trace::afterIsend(V, sendComm, data, size < 0 ? 0 : static_cast<size_t>(size), tag, mhandle, request, r);
  }
  return r;
}

template <int V, ncclResult_t (*Impl)(void*, void*, size_t, int, void*, void**)>
ncclResult_t isend(void* sendComm, void* data, size_t size, int tag, void* mhandle, void** request) {
  ncclResult_t r = Impl(sendComm, data, size, tag, mhandle, request);
  if (trace::on()) trace::afterIsend(V, sendComm, data, size, tag, mhandle, request, r);
  return r;
}

template <int V, ncclResult_t (*Impl)(void*, void*, size_t, int, void*, void*, void**)>
ncclResult_t isendP(void* sendComm, void* data, size_t size, int tag, void* mhandle, void* phandle,
                    void** request) {
  ncclResult_t r = Impl(sendComm, data, size, tag, mhandle, phandle, request);
  if (trace::on()) trace::afterIsend(V, sendComm, data, size, tag, mhandle, request, r);
  return r;
}

template <int V, ncclResult_t (*Impl)(void*, int, void**, int*, int*, void**, void**)>
ncclResult_t irecvInt(void* recvComm, int n, void** data, int* sizes, int* tags, void** mhandles, void** request) {
  ncclResult_t r = Impl(recvComm, n, data, sizes, tags, mhandles, request);
  if (trace::on()) trace::afterIrecv(V, recvComm, n, data, sizes, nullptr, tags, mhandles, request, r);
  return r;
}

template <int V, ncclResult_t (*Impl)(void*, int, void**, size_t*, int*, void**, void**)>
ncclResult_t irecv(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhandles, void** request) {
  ncclResult_t r = Impl(recvComm, n, data, sizes, tags, mhandles, request);
  if (trace::on()) trace::afterIrecv(V, recvComm, n, data, nullptr, sizes, tags, mhandles, request, r);
  return r;
}

template <int V, ncclResult_t (*Impl)(void*, int, void**, size_t*, int*, void**, void**, void**)>
ncclResult_t irecvP(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhandles,
                    void** phandles, void** request) {
  ncclResult_t r = Impl(recvComm, n, data, sizes, tags, mhandles, phandles, request);
  if (trace::on()) trace::afterIrecv(V, recvComm, n, data, nullptr, sizes, tags, mhandles, request, r);
  return r;
}

template <int V, ncclResult_t (*Impl)(void*, int, void**, int*, void**, void**)>
ncclResult_t iflush(void* recvComm, int n, void** data, int* sizes, void** mhandles, void** request) {
  ncclResult_t r = Impl(recvComm, n, data, sizes, mhandles, request);
  if (trace::on()) trace::afterIflush(V, recvComm, n, data, sizes, mhandles, request, r);
  return r;
}

template <int V, ncclResult_t (*Impl)(void*, int*, int*)>
ncclResult_t test(void* request, int* done, int* sizes) {
  ncclResult_t r = Impl(request, done, sizes);
  if (trace::on()) trace::afterTest(V, request, done, sizes, r);
  return r;
}

template <int V, trace::Call Which, ncclResult_t (*Impl)(void*)>
ncclResult_t close(void* comm) {
  ncclResult_t r = Impl(comm);
  if (trace::on()) trace::afterClose(V, Which, comm, r);
  return r;
}

template <int V, ncclResult_t (*Impl)(void*, void*, void**)>
ncclResult_t getDeviceMr(void* comm, void* mhandle, void** dptr) {
  ncclResult_t r = Impl(comm, mhandle, dptr);
  if (trace::on()) trace::afterGetDeviceMr(V, comm, mhandle, r);
  return r;
}

template <int V, ncclResult_t (*Impl)(void*, int, void*)>
ncclResult_t irecvConsumed(void* recvComm, int n, void* request) {
  ncclResult_t r = Impl(recvComm, n, request);
  if (trace::on()) trace::afterIrecvConsumed(V, recvComm, n, request, r);
  return r;
}

template <int V, ncclResult_t (*Impl)(void*, ncclNetAttr_v11_t*)>
ncclResult_t setNetAttr(void* ctx, ncclNetAttr_v11_t* attr) {
  ncclResult_t r = Impl(ctx, attr);
  if (trace::on()) trace::afterSetNetAttr(V, ctx, r);
  return r;
}

}  // namespace traced
}  // namespace mesh
