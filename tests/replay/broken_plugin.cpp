// SPDX-License-Identifier: Apache-2.0
// A deliberately broken plugin, for the replay's own tests: built as
// broken/libnccl-net-mesh.so, it loads the real plugin of the same build folder (REAL_PLUGIN)
// and exports its tables with one behaviour broken, chosen by MESH_BROKEN_FAULT, in the
// manner of tests/e2e's stand-in plugin (FAKE_* faults). The real plugin keeps no fault
// hook of its own: its data path stays as NCCL runs it.
//   null-error   isend/irecv return ncclInternalError where the plugin said "not yet" (NULL)
//   stall-zero   a 0-byte isend is "not yet" forever (a message that never goes out)
//   size         test() reports one byte more for a finished receive of at least one byte
//   corrupt      test() flips the last byte a finished receive reported
// The replay of a trace against it must fail, naming the call. One behaviour is legal, not a
// fault, and a replay must pass against it:
//   lazy-connect a connect does nothing at its first call and starts at the next (a plugin
//                may move a connect only inside NCCL's connect() calls, as the relay's
//                connect does; NCCL calls every pending connect again while it waits)
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>

#include "net_v12.h"

namespace {

enum class Fault { None, NullError, StallZero, Size, Corrupt, LazyConnect };

Fault gFault = Fault::None;
const ncclNet_v8_t* gV8 = nullptr;
const ncclNet_v9_t* gV9 = nullptr;
const ncclNet_v10_t* gV10 = nullptr;
const ncclNet_v11_t* gV11 = nullptr;
const ncclNet_v12_t* gV12 = nullptr;

// Receives in flight: request -> (first buffer, its posted size), for size/corrupt.
std::mutex gMutex;
std::map<void*, char*>* gRecvs = nullptr;

void injected(const char* what) { fprintf(stderr, "broken plugin: fault injected: %s\n", what); }

// lazy-connect: the handles (NCCL's buffers) whose connect had its first call, until it
// returns a comm; then the next connect to that buffer starts lazily again.
std::set<void*>* gConnects = nullptr;

// lazy-connect: true when this call is a connect's first, which does nothing.
bool lazyFirstCall(void* handle, void** sendComm) {
  if (gFault != Fault::LazyConnect) return false;
  std::lock_guard<std::mutex> lock(gMutex);
  if (!gConnects->insert(handle).second) return false;
  *sendComm = nullptr;
  return true;
}

ncclResult_t afterConnect(ncclResult_t r, void* handle, void** sendComm) {
  if (gFault == Fault::LazyConnect && (r != ncclSuccess || *sendComm != nullptr)) {
    std::lock_guard<std::mutex> lock(gMutex);
    gConnects->erase(handle);
  }
  return r;
}

template <typename Table, const Table** T, typename DevComm>
ncclResult_t connectV8(int dev, void* handle, void** sendComm, DevComm** devComm) {
  if (lazyFirstCall(handle, sendComm)) return ncclSuccess;
  return afterConnect((*T)->connect(dev, handle, sendComm, devComm), handle, sendComm);
}
ncclResult_t connect10(int dev, ncclNetCommConfig_v10_t* config, void* handle, void** sendComm,
                       ncclNetDeviceHandle_v10_t** devComm) {
  if (lazyFirstCall(handle, sendComm)) return ncclSuccess;
  return afterConnect(gV10->connect(dev, config, handle, sendComm, devComm), handle, sendComm);
}
template <typename Table, const Table** T, typename DevComm>
ncclResult_t connectCtx(void* ctx, int dev, void* handle, void** sendComm, DevComm** devComm) {
  if (lazyFirstCall(handle, sendComm)) return ncclSuccess;
  return afterConnect((*T)->connect(ctx, dev, handle, sendComm, devComm), handle, sendComm);
}

ncclResult_t afterPost(ncclResult_t r, void** request, const char* what) {
  if (gFault == Fault::NullError && r == ncclSuccess && request != nullptr && *request == nullptr) {
    injected(what);
    return ncclInternalError;
  }
  return r;
}

void rememberRecv(ncclResult_t r, void** data, void** request) {
  if (r != ncclSuccess || request == nullptr || *request == nullptr || data == nullptr) return;
  std::lock_guard<std::mutex> lock(gMutex);
  (*gRecvs)[*request] = static_cast<char*>(data[0]);
}

template <typename Table>
ncclResult_t test(const Table* t, void* request, int* done, int* sizes) {
  ncclResult_t r = t->test(request, done, sizes);
  if (r != ncclSuccess || done == nullptr || !*done) return r;
  std::lock_guard<std::mutex> lock(gMutex);
  auto it = gRecvs->find(request);
  if (it == gRecvs->end()) return r;
  char* data = it->second;
  gRecvs->erase(it);
  if (sizes == nullptr || sizes[0] < 1) return r;
  if (gFault == Fault::Size) {
    injected("test: one byte more");
    sizes[0] += 1;
  } else if (gFault == Fault::Corrupt) {
    injected("test: last byte flipped");
    data[sizes[0] - 1] ^= 0x5a;
  }
  return r;
}

ncclResult_t isend8(void* c, void* d, int size, int tag, void* mh, void** req) {
  if (gFault == Fault::StallZero && size == 0) return *req = nullptr, ncclSuccess;
  return afterPost(gV8->isend(c, d, size, tag, mh, req), req, "isend v8");
}
ncclResult_t irecv8(void* c, int n, void** d, int* s, int* t, void** mh, void** req) {
  ncclResult_t r = afterPost(gV8->irecv(c, n, d, s, t, mh, req), req, "irecv v8");
  rememberRecv(r, d, req);
  return r;
}
ncclResult_t test8(void* req, int* done, int* sizes) { return test(gV8, req, done, sizes); }

ncclResult_t isend9(void* c, void* d, size_t size, int tag, void* mh, void** req) {
  if (gFault == Fault::StallZero && size == 0) return *req = nullptr, ncclSuccess;
  return afterPost(gV9->isend(c, d, size, tag, mh, req), req, "isend v9");
}
ncclResult_t irecv9(void* c, int n, void** d, size_t* s, int* t, void** mh, void** req) {
  ncclResult_t r = afterPost(gV9->irecv(c, n, d, s, t, mh, req), req, "irecv v9");
  rememberRecv(r, d, req);
  return r;
}
ncclResult_t test9(void* req, int* done, int* sizes) { return test(gV9, req, done, sizes); }

// v10, v11 and v12 share these signatures.
template <typename Table, const Table** T>
ncclResult_t isendP(void* c, void* d, size_t size, int tag, void* mh, void* ph, void** req) {
  if (gFault == Fault::StallZero && size == 0) return *req = nullptr, ncclSuccess;
  return afterPost((*T)->isend(c, d, size, tag, mh, ph, req), req, "isend");
}
template <typename Table, const Table** T>
ncclResult_t irecvP(void* c, int n, void** d, size_t* s, int* t, void** mh, void** ph, void** req) {
  ncclResult_t r = afterPost((*T)->irecv(c, n, d, s, t, mh, ph, req), req, "irecv");
  rememberRecv(r, d, req);
  return r;
}
template <typename Table, const Table** T>
ncclResult_t testP(void* req, int* done, int* sizes) {
  return test(*T, req, done, sizes);
}

}  // namespace

extern "C" {
__attribute__((visibility("default"))) ncclNet_v8_t ncclNetPlugin_v8;
__attribute__((visibility("default"))) ncclNet_v9_t ncclNetPlugin_v9;
__attribute__((visibility("default"))) ncclNet_v10_t ncclNetPlugin_v10;
__attribute__((visibility("default"))) ncclNet_v11_t ncclNetPlugin_v11;
__attribute__((visibility("default"))) ncclNet_v12_t ncclNetPlugin_v12;
}

namespace {

template <typename Table>
const Table* bindTable(void* lib, const char* symbol, Table* exported) {
  const Table* real = static_cast<const Table*>(dlsym(lib, symbol));
  if (real != nullptr) *exported = *real;
  return real;
}

__attribute__((constructor)) void loadRealPlugin() {
  const char* f = getenv("MESH_BROKEN_FAULT");
  std::string fault = f ? f : "";
  gFault = fault == "null-error"     ? Fault::NullError
           : fault == "stall-zero"   ? Fault::StallZero
           : fault == "size"         ? Fault::Size
           : fault == "corrupt"      ? Fault::Corrupt
           : fault == "lazy-connect" ? Fault::LazyConnect
                                     : Fault::None;
  if (gFault == Fault::None) fprintf(stderr, "broken plugin: MESH_BROKEN_FAULT='%s' names no fault\n", fault.c_str());
  gRecvs = new std::map<void*, char*>();  // never freed: the real plugin's threads may outlive us
  gConnects = new std::set<void*>();
  void* lib = dlopen(REAL_PLUGIN, RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    fprintf(stderr, "broken plugin: cannot load %s: %s\n", REAL_PLUGIN, dlerror());
    return;
  }
  if ((gV8 = bindTable(lib, "ncclNetPlugin_v8", &ncclNetPlugin_v8)) != nullptr) {
    ncclNetPlugin_v8.isend = isend8;
    ncclNetPlugin_v8.irecv = irecv8;
    ncclNetPlugin_v8.test = test8;
    ncclNetPlugin_v8.connect = connectV8<ncclNet_v8_t, &gV8, ncclNetDeviceHandle_v8_t>;
  }
  if ((gV9 = bindTable(lib, "ncclNetPlugin_v9", &ncclNetPlugin_v9)) != nullptr) {
    ncclNetPlugin_v9.isend = isend9;
    ncclNetPlugin_v9.irecv = irecv9;
    ncclNetPlugin_v9.test = test9;
    ncclNetPlugin_v9.connect = connectV8<ncclNet_v9_t, &gV9, ncclNetDeviceHandle_v9_t>;
  }
  if ((gV10 = bindTable(lib, "ncclNetPlugin_v10", &ncclNetPlugin_v10)) != nullptr) {
    ncclNetPlugin_v10.isend = isendP<ncclNet_v10_t, &gV10>;
    ncclNetPlugin_v10.irecv = irecvP<ncclNet_v10_t, &gV10>;
    ncclNetPlugin_v10.test = testP<ncclNet_v10_t, &gV10>;
    ncclNetPlugin_v10.connect = connect10;
  }
  if ((gV11 = bindTable(lib, "ncclNetPlugin_v11", &ncclNetPlugin_v11)) != nullptr) {
    ncclNetPlugin_v11.isend = isendP<ncclNet_v11_t, &gV11>;
    ncclNetPlugin_v11.irecv = irecvP<ncclNet_v11_t, &gV11>;
    ncclNetPlugin_v11.test = testP<ncclNet_v11_t, &gV11>;
    ncclNetPlugin_v11.connect = connectCtx<ncclNet_v11_t, &gV11, ncclNetDeviceHandle_v11_t>;
  }
  if ((gV12 = bindTable(lib, "ncclNetPlugin_v12", &ncclNetPlugin_v12)) != nullptr) {
    ncclNetPlugin_v12.isend = isendP<ncclNet_v12_t, &gV12>;
    ncclNetPlugin_v12.irecv = irecvP<ncclNet_v12_t, &gV12>;
    ncclNetPlugin_v12.test = testP<ncclNet_v12_t, &gV12>;
    ncclNetPlugin_v12.connect = connectCtx<ncclNet_v12_t, &gV12, ncclNetDeviceHandle_v12_t>;
  }
}

}  // namespace
