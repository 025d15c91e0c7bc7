// SPDX-License-Identifier: Apache-2.0
// The exported tables' entries: each calls its implementation (abi_common.h, a version's
// adapter or comm_context.h), then, only while NCCL_MESH_TRACE records (trace.h), hands the
// arguments and the outcome to the recorder with the version of the table it sits in.
// `traced::isend<9, abi::isend>` is the v9 table's isend, and so on; one template per
// signature, so every version's table is built from the same few lines.
// Cost when not recording: one relaxed load of a bool and a branch predicted not taken,
// before the call, which then is the implementation's own (measured per message:
// docs/DESIGN-notes.md, "Call recorder").
#pragma once

#include <exception>

#include "net_v12.h"  // and, through it, v11, v10, v9 and v8
#include "trace.h"

namespace mesh {
namespace traced {

using DevHandle = ncclNetDeviceHandle_v8_t;  // one layout in every version

// The recording path, out of line: Impl, then Hook(V, its result, the same arguments). The
// entry points below test the flag and tail-call either this or, while it is off, Impl
// itself with their arguments untouched: no frame, nothing kept for a hook.
// A hook's failure stops recording; it never reaches NCCL (trace::stopAfterHookFailure).
template <typename F>
void hookSafely(F&& f) noexcept {
  try {
    f();
  } catch (const std::exception& e) {
    trace::stopAfterHookFailure(e.what());
  } catch (...) {
    trace::stopAfterHookFailure("unknown exception");
  }
}

template <int V, auto Impl, auto Hook, typename... A>
__attribute__((noinline, cold)) ncclResult_t recorded(A... a) {
  ncclResult_t r = Impl(a...);
  hookSafely([&] { Hook(V, r, a...); });
  return r;
}

// What each entry point hands the recorder (trace.h), from its own arguments.
namespace hook {
inline void finalize(int v, ncclResult_t r, void* ctx) { trace::afterFinalize(v, ctx, r); }
inline void devices(int v, ncclResult_t r, int* ndev) { trace::afterDevices(v, ndev, r); }
template <typename Props>
void props(int v, ncclResult_t r, int dev, Props* p) {
  bool ok = r == ncclSuccess && p != nullptr;
  trace::afterProps(v, dev, ok ? p->maxRecvs : 0, ok ? p->ptrSupport : 0, ok ? p->speed : 0, ok ? p->name : nullptr, r);
}
inline void listen(int v, ncclResult_t r, int dev, void* handle, void** lc) {
  trace::afterListen(v, nullptr, dev, handle, lc, r);
}
inline void ctxListen(int v, ncclResult_t r, void* ctx, int dev, void* handle, void** lc) {
  trace::afterListen(v, ctx, dev, handle, lc, r);
}
inline void connect(int v, ncclResult_t r, int dev, void* handle, void** sc, DevHandle**) {
  trace::afterConnect(v, nullptr, dev, handle, -1, sc, r);
}
inline void connectCfg(int v, ncclResult_t r, int dev, ncclNetCommConfig_v10_t* cfg, void* handle, void** sc,
                       DevHandle**) {
  trace::afterConnect(v, nullptr, dev, handle, cfg != nullptr ? cfg->trafficClass : -1, sc, r);
}
inline void ctxConnect(int v, ncclResult_t r, void* ctx, int dev, void* handle, void** sc, DevHandle**) {
  trace::afterConnect(v, ctx, dev, handle, -1, sc, r);
}
inline void accept(int v, ncclResult_t r, void* lc, void** rc, DevHandle**) { trace::afterAccept(v, lc, rc, r); }
inline void regMr(int v, ncclResult_t r, void* comm, void* data, size_t size, int type, void** mh) {
  trace::afterRegMr(v, comm, data, size, type, false, mh, r);
}
inline void regMrDmaBuf(int v, ncclResult_t r, void* comm, void* data, size_t size, int type, uint64_t, int,
                        void** mh) {
  trace::afterRegMr(v, comm, data, size, type, true, mh, r);
}
inline void deregMr(int v, ncclResult_t r, void* comm, void* mh) { trace::afterDeregMr(v, comm, mh, r); }
inline void isendInt(int v, ncclResult_t r, void* sc, void* data, int size, int tag, void* mh, void** req) {
  trace::afterIsend(v, sc, data, size < 0 ? 0 : static_cast<size_t>(size), tag, mh, req, r);
}
inline void isend(int v, ncclResult_t r, void* sc, void* data, size_t size, int tag, void* mh, void** req) {
  trace::afterIsend(v, sc, data, size, tag, mh, req, r);
}
inline void isendP(int v, ncclResult_t r, void* sc, void* data, size_t size, int tag, void* mh, void*, void** req) {
  trace::afterIsend(v, sc, data, size, tag, mh, req, r);
}
inline void irecvInt(int v, ncclResult_t r, void* rc, int n, void** data, int* sizes, int* tags, void** mhs,
                     void** req) {
  trace::afterIrecv(v, rc, n, data, sizes, nullptr, tags, mhs, req, r);
}
inline void irecv(int v, ncclResult_t r, void* rc, int n, void** data, size_t* sizes, int* tags, void** mhs,
                  void** req) {
  trace::afterIrecv(v, rc, n, data, nullptr, sizes, tags, mhs, req, r);
}
inline void irecvP(int v, ncclResult_t r, void* rc, int n, void** data, size_t* sizes, int* tags, void** mhs, void**,
                   void** req) {
  trace::afterIrecv(v, rc, n, data, nullptr, sizes, tags, mhs, req, r);
}
inline void iflush(int v, ncclResult_t r, void* rc, int n, void** data, int* sizes, void** mhs, void** req) {
  trace::afterIflush(v, rc, n, data, sizes, mhs, req, r);
}
inline void test(int v, ncclResult_t r, void* req, int* done, int* sizes) { trace::afterTest(v, req, done, sizes, r); }
template <trace::Call Which>
void close(int v, ncclResult_t r, void* comm) {
  trace::afterClose(v, Which, comm, r);
}
inline void getDeviceMr(int v, ncclResult_t r, void* comm, void* mh, void**) {
  trace::afterGetDeviceMr(v, comm, mh, r);
}
inline void irecvConsumed(int v, ncclResult_t r, void* rc, int n, void* req) {
  trace::afterIrecvConsumed(v, rc, n, req, r);
}
inline void setNetAttr(int v, ncclResult_t r, void* ctx, ncclNetAttr_v11_t*) { trace::afterSetNetAttr(v, ctx, r); }
}  // namespace hook

template <int V, ncclResult_t (*Impl)(ncclDebugLogger_t)>
ncclResult_t init(ncclDebugLogger_t logger) {
  ncclResult_t r = Impl(logger);
  hookSafely([&] { trace::afterInit(V, r, nullptr, 0, -1); });  // not hot: opens the file on the first init
  return r;
}

template <int V, ncclResult_t (*Impl)(ncclDebugLogger_t, ncclProfilerCallback_t)>
ncclResult_t initProf(ncclDebugLogger_t logger, ncclProfilerCallback_t prof) {
  ncclResult_t r = Impl(logger, prof);
  hookSafely([&] { trace::afterInit(V, r, nullptr, 0, -1); });
  return r;
}

template <int V,
          ncclResult_t (*Impl)(void**, uint64_t, ncclNetCommConfig_v11_t*, ncclDebugLogger_t, ncclProfilerCallback_t)>
ncclResult_t ctxInit(void** ctx, uint64_t commId, ncclNetCommConfig_v11_t* config, ncclDebugLogger_t logger,
                     ncclProfilerCallback_t prof) {
  ncclResult_t r = Impl(ctx, commId, config, logger, prof);
  hookSafely([&] { trace::afterInit(V, r, ctx, commId, config != nullptr ? config->trafficClass : -1); });
  return r;
}

template <int V, ncclResult_t (*Impl)(void*)>
ncclResult_t finalize(void* ctx) {
  return trace::on() ? recorded<V, Impl, hook::finalize>(ctx) : Impl(ctx);
}

template <int V, ncclResult_t (*Impl)(int*)>
ncclResult_t devices(int* ndev) {
  return trace::on() ? recorded<V, Impl, hook::devices>(ndev) : Impl(ndev);
}

template <int V, ncclResult_t (*Impl)(int, void*, void**)>
ncclResult_t listen(int dev, void* handle, void** listenComm) {
  return trace::on() ? recorded<V, Impl, hook::listen>(dev, handle, listenComm) : Impl(dev, handle, listenComm);
}

template <int V, ncclResult_t (*Impl)(void*, int, void*, void**)>
ncclResult_t ctxListen(void* ctx, int dev, void* handle, void** listenComm) {
  return trace::on() ? recorded<V, Impl, hook::ctxListen>(ctx, dev, handle, listenComm)
                     : Impl(ctx, dev, handle, listenComm);
}

template <int V, ncclResult_t (*Impl)(int, void*, void**, DevHandle**)>
ncclResult_t connect(int dev, void* handle, void** sendComm, DevHandle** sendDevComm) {
  return trace::on() ? recorded<V, Impl, hook::connect>(dev, handle, sendComm, sendDevComm)
                     : Impl(dev, handle, sendComm, sendDevComm);
}

template <int V, ncclResult_t (*Impl)(int, ncclNetCommConfig_v10_t*, void*, void**, DevHandle**)>
ncclResult_t connectCfg(int dev, ncclNetCommConfig_v10_t* config, void* handle, void** sendComm,
                        DevHandle** sendDevComm) {
  return trace::on() ? recorded<V, Impl, hook::connectCfg>(dev, config, handle, sendComm, sendDevComm)
                     : Impl(dev, config, handle, sendComm, sendDevComm);
}

template <int V, ncclResult_t (*Impl)(void*, int, void*, void**, DevHandle**)>
ncclResult_t ctxConnect(void* ctx, int dev, void* handle, void** sendComm, DevHandle** sendDevComm) {
  return trace::on() ? recorded<V, Impl, hook::ctxConnect>(ctx, dev, handle, sendComm, sendDevComm)
                     : Impl(ctx, dev, handle, sendComm, sendDevComm);
}

template <int V, ncclResult_t (*Impl)(void*, void**, DevHandle**)>
ncclResult_t accept(void* listenComm, void** recvComm, DevHandle** recvDevComm) {
  return trace::on() ? recorded<V, Impl, hook::accept>(listenComm, recvComm, recvDevComm)
                     : Impl(listenComm, recvComm, recvDevComm);
}

template <int V, ncclResult_t (*Impl)(void*, void*, size_t, int, void**)>
ncclResult_t regMr(void* comm, void* data, size_t size, int type, void** mhandle) {
  return trace::on() ? recorded<V, Impl, hook::regMr>(comm, data, size, type, mhandle)
                     : Impl(comm, data, size, type, mhandle);
}

template <int V, ncclResult_t (*Impl)(void*, void*, size_t, int, uint64_t, int, void**)>
ncclResult_t regMrDmaBuf(void* comm, void* data, size_t size, int type, uint64_t offset, int fd, void** mhandle) {
  return trace::on() ? recorded<V, Impl, hook::regMrDmaBuf>(comm, data, size, type, offset, fd, mhandle)
                     : Impl(comm, data, size, type, offset, fd, mhandle);
}

template <int V, ncclResult_t (*Impl)(void*, void*)>
ncclResult_t deregMr(void* comm, void* mhandle) {
  return trace::on() ? recorded<V, Impl, hook::deregMr>(comm, mhandle) : Impl(comm, mhandle);
}

template <int V, ncclResult_t (*Impl)(void*, void*, int, int, void*, void**)>
ncclResult_t isendInt(void* sendComm, void* data, int size, int tag, void* mhandle, void** request) {
  return trace::on() ? recorded<V, Impl, hook::isendInt>(sendComm, data, size, tag, mhandle, request)
                     : Impl(sendComm, data, size, tag, mhandle, request);
}

template <int V, ncclResult_t (*Impl)(void*, void*, size_t, int, void*, void**)>
ncclResult_t isend(void* sendComm, void* data, size_t size, int tag, void* mhandle, void** request) {
  return trace::on() ? recorded<V, Impl, hook::isend>(sendComm, data, size, tag, mhandle, request)
                     : Impl(sendComm, data, size, tag, mhandle, request);
}

template <int V, ncclResult_t (*Impl)(void*, void*, size_t, int, void*, void*, void**)>
ncclResult_t isendP(void* sendComm, void* data, size_t size, int tag, void* mhandle, void* phandle, void** request) {
  return trace::on() ? recorded<V, Impl, hook::isendP>(sendComm, data, size, tag, mhandle, phandle, request)
                     : Impl(sendComm, data, size, tag, mhandle, phandle, request);
}

template <int V, ncclResult_t (*Impl)(void*, int, void**, int*, int*, void**, void**)>
ncclResult_t irecvInt(void* recvComm, int n, void** data, int* sizes, int* tags, void** mhandles, void** request) {
  return trace::on() ? recorded<V, Impl, hook::irecvInt>(recvComm, n, data, sizes, tags, mhandles, request)
                     : Impl(recvComm, n, data, sizes, tags, mhandles, request);
}

template <int V, ncclResult_t (*Impl)(void*, int, void**, size_t*, int*, void**, void**)>
ncclResult_t irecv(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhandles, void** request) {
  return trace::on() ? recorded<V, Impl, hook::irecv>(recvComm, n, data, sizes, tags, mhandles, request)
                     : Impl(recvComm, n, data, sizes, tags, mhandles, request);
}

template <int V, ncclResult_t (*Impl)(void*, int, void**, size_t*, int*, void**, void**, void**)>
ncclResult_t irecvP(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhandles, void** phandles,
                    void** request) {
  return trace::on() ? recorded<V, Impl, hook::irecvP>(recvComm, n, data, sizes, tags, mhandles, phandles, request)
                     : Impl(recvComm, n, data, sizes, tags, mhandles, phandles, request);
}

template <int V, ncclResult_t (*Impl)(void*, int, void**, int*, void**, void**)>
ncclResult_t iflush(void* recvComm, int n, void** data, int* sizes, void** mhandles, void** request) {
  return trace::on() ? recorded<V, Impl, hook::iflush>(recvComm, n, data, sizes, mhandles, request)
                     : Impl(recvComm, n, data, sizes, mhandles, request);
}

template <int V, ncclResult_t (*Impl)(void*, int*, int*)>
ncclResult_t test(void* request, int* done, int* sizes) {
  return trace::on() ? recorded<V, Impl, hook::test>(request, done, sizes) : Impl(request, done, sizes);
}

template <int V, ncclResult_t (*Impl)(void*, void*, void**)>
ncclResult_t getDeviceMr(void* comm, void* mhandle, void** dptr) {
  return trace::on() ? recorded<V, Impl, hook::getDeviceMr>(comm, mhandle, dptr) : Impl(comm, mhandle, dptr);
}

template <int V, ncclResult_t (*Impl)(void*, int, void*)>
ncclResult_t irecvConsumed(void* recvComm, int n, void* request) {
  return trace::on() ? recorded<V, Impl, hook::irecvConsumed>(recvComm, n, request) : Impl(recvComm, n, request);
}

template <int V, ncclResult_t (*Impl)(void*, ncclNetAttr_v11_t*)>
ncclResult_t setNetAttr(void* ctx, ncclNetAttr_v11_t* attr) {
  return trace::on() ? recorded<V, Impl, hook::setNetAttr>(ctx, attr) : Impl(ctx, attr);
}

template <int V, typename Props, ncclResult_t (*Impl)(int, Props*)>
ncclResult_t getProperties(int dev, Props* props) {
  return trace::on() ? recorded<V, Impl, hook::props<Props>>(dev, props) : Impl(dev, props);
}

template <int V, trace::Call Which, ncclResult_t (*Impl)(void*)>
ncclResult_t close(void* comm) {
  return trace::on() ? recorded<V, Impl, hook::close<Which>>(comm) : Impl(comm);
}

}  // namespace traced
}  // namespace mesh
