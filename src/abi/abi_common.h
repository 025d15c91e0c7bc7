// SPDX-License-Identifier: Apache-2.0
// The ABI boundary shared by every ncclNet version the plugin exports (src/abi/net_v*.cpp).
// Owns: the boundary rules — validate NCCL's pointers, call the core (mesh/plugin/net.h), catch
// everything, map the outcome to ncclResult_t — and the entry points whose signature is the
// same in v8 through v12 (v11 and v12's context-taking ones: comm_context.h). A version's
// adapter keeps only what differs: its init, its properties struct, the integer width of
// its sizes, the options it passes to connect.
// Nothing thrown or aborted may cross into NCCL's process.
#pragma once

#include <atomic>
#include <climits>
#include <cstring>
#include <exception>
#include <new>

#include "mesh/connect/transport.h"
#include "mesh/platform/check.h"
#include "mesh/platform/log.h"
#include "mesh/plugin/net.h"
#include "mesh/plugin/plugin.h"
#include "net_v12.h"  // and, through it, v11, v10, v9 and v8

namespace mesh {
namespace abi {

// The largest single isend/irecv advertised to v9+ (maxP2pBytes), the most NCCL accepts.
// The data path has 64-bit sizes and splits every send into WRs below the port's maximum
// message size, so any size NCCL may pass is in range.
constexpr size_t kMaxP2pBytes = NCCL_MAX_NET_SIZE_BYTES;
// maxCollBytes only matters to collective-network plugins (NCCL reads it from the CollNet
// table, which this plugin does not export); it must still be in NCCL's valid range.
constexpr size_t kMaxCollBytes = NCCL_MAX_NET_SIZE_BYTES;
static_assert(kMaxP2pBytes > 0 && kMaxP2pBytes <= NCCL_MAX_NET_SIZE_BYTES, "NCCL's range");

// A child forked after init shares the parent's RDMA objects and has no reactor thread:
// every entry point refuses to run there (a load, no syscall: fine on the data path).
inline ncclResult_t refuseInForkedChild(const char* what) {
  static std::atomic<bool> warned{false};
  if (!warned.exchange(true)) {
    MESH_WARN("%s called in a process forked after the plugin was initialized: its RDMA resources belong "
              "to the parent process; initialize NCCL in the child after exec, or in the parent only",
              what);
  }
  return ncclSystemError;
}

// Runs `fn` (returning ncclResult_t) with every exception turned into a logged result.
template <typename Fn>
ncclResult_t guarded(const char* what, Fn&& fn) {
  if (Plugin::inForkedChild()) return refuseInForkedChild(what);
  try {
    return fn();
  } catch (const std::bad_alloc&) {
    MESH_WARN("%s: out of memory", what);
    return ncclSystemError;
  } catch (const std::exception& e) {
    MESH_WARN("%s: internal error: %s", what, e.what());
    return ncclInternalError;
  } catch (...) {
    MESH_WARN("%s: internal error (unknown exception)", what);
    return ncclInternalError;
  }
}

#define MESH_ABI_NOT_NULL(ptr, what)                                     \
  do {                                                                   \
    if ((ptr) == nullptr) {                                              \
      MESH_WARN("%s: %s is NULL", (what), #ptr);                         \
      return ncclInvalidArgument;                                        \
    }                                                                    \
  } while (0)

inline ncclResult_t requireInit(const char* what) {
  if (Plugin::instance().initialized()) return ncclSuccess;
  MESH_WARN("%s called before init", what);
  return ncclInvalidUsage;
}

// Connection options from a v10+ communicator config (NULL: defaults). The traffic class
// ends up in the GRH's 8-bit field; a class outside 0..255 gets a WARN and the default
// (NCCL_MESH_IB_TC, else the port's), never an error: NCCL takes a failed v11+ init as "this
// plugin is unusable" and quietly runs every later communicator over its own transports
// (2.28.9/2.30.7 src/plugin/net.cc), and NCCL's IB transport uses the value unchecked.
// init (once per communicator) reports at every call; connect reports a class unlike the last
// one reported, as NCCL passes the same config on every try of a connect.
inline ncclResult_t connOptions(const ncclNetCommConfig_v10_t* config, const char* what, bool reportEveryCall,
                                ConnOptions* out) {
  *out = ConnOptions();
  if (config == nullptr || config->trafficClass == NCCL_NET_TRAFFIC_CLASS_UNDEF) return ncclSuccess;
  if (config->trafficClass < 0 || config->trafficClass > 255) {
    static std::atomic<int> lastReported{NCCL_NET_TRAFFIC_CLASS_UNDEF};
    if (lastReported.exchange(config->trafficClass) != config->trafficClass || reportEveryCall) {
      MESH_WARN("%s: traffic class %d is out of range: the communicator's trafficClass must be "
                "0..255 (RoCE GRH traffic class) or unset; using the default (NCCL_MESH_IB_TC, else 0)",
                what, config->trafficClass);
    }
    return ncclSuccess;
  }
  out->trafficClass = config->trafficClass;
  return ncclSuccess;
}

// --- properties -----------------------------------------------------------------------------

// Fields every version has, by name (the structs differ in layout from v9 on).
template <typename Props>
void fillBaseProperties(const NetDevice& d, Props* props) {
  // NCCL keeps these pointers: they point into the device table, which lives until the
  // library is unloaded.
  props->name = const_cast<char*>(d.name.c_str());
  props->pciPath = d.pciPath.empty() ? nullptr : const_cast<char*>(d.pciPath.c_str());
  props->guid = d.guid;
  props->ptrSupport = d.ptrSupport;
  props->regIsGlobal = d.regIsGlobal ? 1 : 0;
  props->speed = d.speedMbps;
  props->port = d.port;
  props->latency = d.latencyUs;
  props->maxComms = d.maxComms;
  props->maxRecvs = d.maxRecvs;
  props->netDeviceType = NCCL_NET_DEVICE_HOST;
  props->netDeviceVersion = 0;
}

inline void fillVersionProperties(const NetDevice&, int, ncclNetProperties_v8_t*) {}

// v9 to v12: each device is its own (physical) device: node mode already spans every mesh
// port, and the tables leave makeVDevice NULL, so NCCL never fuses devices.
template <typename Props>
void fillWideProperties(int dev, Props* props) {
  props->forceFlush = 0;  // the GPUDirect flush is requested per receive, as usual
  props->vProps.ndevs = 1;
  props->vProps.devs[0] = dev;
  props->maxP2pBytes = kMaxP2pBytes;
  props->maxCollBytes = kMaxCollBytes;
}

inline void fillVersionProperties(const NetDevice&, int dev, ncclNetProperties_v9_t* props) {
  fillWideProperties(dev, props);
}

inline void fillVersionProperties(const NetDevice&, int dev, ncclNetProperties_v11_t* props) {
  fillWideProperties(dev, props);
  props->maxMultiRequestSize = 1;  // no multi-requests
}

inline void fillVersionProperties(const NetDevice& d, int dev, ncclNetProperties_v12_t* props) {
  fillWideProperties(dev, props);
  props->maxMultiRequestSize = 1;
  props->railId = static_cast<int16_t>(d.railId);  // see net_devices.h
  props->planeId = static_cast<int16_t>(d.planeId);
}

template <typename Props>
ncclResult_t getProperties(int dev, Props* props) {
  MESH_ABI_NOT_NULL(props, "getProperties");
  return guarded("getProperties", [&] {
    MESH_CHECK(requireInit("getProperties"));
    const NetDevice* d = nullptr;
    MESH_CHECK(Plugin::instance().device(dev, &d));
    memset(props, 0, sizeof(*props));
    fillBaseProperties(*d, props);
    fillVersionProperties(*d, dev, props);
    return ncclSuccess;
  });
}

// --- entry points with one signature in every version ----------------------------------------

// `abi`: the ncclNet version NCCL entered through (the init log line names the NCCL it implies).
inline ncclResult_t init(ncclDebugLogger_t logFunction, int abi) {
  return guarded("init", [&] { return Plugin::instance().init(logFunction, abi); });
}

template <int kAbi>
ncclResult_t initAs(ncclDebugLogger_t logFunction) {
  return init(logFunction, kAbi);
}

inline ncclResult_t devices(int* ndev) {
  MESH_ABI_NOT_NULL(ndev, "devices");
  return guarded("devices", [&] {
    MESH_CHECK(requireInit("devices"));
    *ndev = Plugin::instance().deviceCount();
    return ncclSuccess;
  });
}

inline ncclResult_t listen(int dev, void* handle, void** listenComm) {
  MESH_ABI_NOT_NULL(handle, "listen");
  MESH_ABI_NOT_NULL(listenComm, "listen");
  return guarded("listen", [&] {
    *listenComm = nullptr;
    MESH_CHECK(requireInit("listen"));
    ListenComm* lc = nullptr;
    MESH_CHECK(netListen(dev, handle, &lc));
    *listenComm = lc;
    return ncclSuccess;
  });
}

// The device handle has one layout in every version (NCCL typedefs v9..v12 to v8's).
inline ncclResult_t connect(int dev, void* handle, const ConnOptions& opts, void** sendComm,
                            ncclNetDeviceHandle_v8_t** sendDevComm) {
  MESH_ABI_NOT_NULL(handle, "connect");
  MESH_ABI_NOT_NULL(sendComm, "connect");
  return guarded("connect", [&] {
    *sendComm = nullptr;
    if (sendDevComm != nullptr) *sendDevComm = nullptr;  // HOST device type
    MESH_CHECK(requireInit("connect"));
    SendComm* sc = nullptr;
    MESH_CHECK(netConnect(dev, handle, opts, &sc));
    *sendComm = sc;
    return ncclSuccess;
  });
}

inline ncclResult_t accept(void* listenComm, void** recvComm, ncclNetDeviceHandle_v8_t** recvDevComm) {
  MESH_ABI_NOT_NULL(listenComm, "accept");
  MESH_ABI_NOT_NULL(recvComm, "accept");
  return guarded("accept", [&] {
    *recvComm = nullptr;
    if (recvDevComm != nullptr) *recvDevComm = nullptr;
    RecvComm* rc = nullptr;
    MESH_CHECK(netAccept(static_cast<ListenComm*>(listenComm), &rc));
    *recvComm = rc;
    return ncclSuccess;
  });
}

inline ncclResult_t regMr(void* comm, void* data, size_t size, int type, void** mhandle) {
  MESH_ABI_NOT_NULL(mhandle, "regMr");
  return guarded("regMr", [&] {
    MrHandle* mh = nullptr;
    MESH_CHECK(netRegMr(comm, data, size, type, -1, 0, &mh));
    *mhandle = mh;
    return ncclSuccess;
  });
}

inline ncclResult_t regMrDmaBuf(void* comm, void* data, size_t size, int type, uint64_t offset, int fd,
                                void** mhandle) {
  MESH_ABI_NOT_NULL(mhandle, "regMrDmaBuf");
  return guarded("regMrDmaBuf", [&] {
    MrHandle* mh = nullptr;
    MESH_CHECK(netRegMr(comm, data, size, type, fd, offset, &mh));
    *mhandle = mh;
    return ncclSuccess;
  });
}

inline ncclResult_t deregMr(void*, void* mhandle) {
  MESH_ABI_NOT_NULL(mhandle, "deregMr");
  return guarded("deregMr", [&] { return netDeregMr(static_cast<MrHandle*>(mhandle)); });
}

// A send of `size` bytes; the caller has checked its ABI's integer width.
inline ncclResult_t isend(void* sendComm, void* data, size_t size, int tag, void* mhandle, void** request) {
  MESH_ABI_NOT_NULL(sendComm, "isend");
  MESH_ABI_NOT_NULL(request, "isend");
  return guarded("isend", [&] {
    Request* req = nullptr;
    ncclResult_t r = netIsend(static_cast<SendComm*>(sendComm), data, size, tag,
                              static_cast<MrHandle*>(mhandle), &req);
    *request = req;
    return r;
  });
}

// Everything but the sizes' values (whose width depends on the ABI version).
inline ncclResult_t checkRecvArgs(void* recvComm, int n, void** data, const void* sizes, int* tags,
                                  void** mhandles, void** request) {
  MESH_ABI_NOT_NULL(recvComm, "irecv");
  MESH_ABI_NOT_NULL(request, "irecv");
  if (n < 1 || n > kGroupMax || data == nullptr || sizes == nullptr || tags == nullptr || mhandles == nullptr) {
    MESH_WARN("irecv: invalid arguments (n=%d, arrays must be non-NULL)", n);
    return ncclInvalidArgument;
  }
  return ncclSuccess;
}

// A grouped receive whose arguments passed checkRecvArgs.
inline ncclResult_t postRecv(void* recvComm, int n, void** data, const size_t* sizes, int* tags,
                             void** mhandles, void** request) {
  return guarded("irecv", [&] {
    Request* req = nullptr;
    ncclResult_t r = netIrecv(static_cast<RecvComm*>(recvComm), n, data, sizes, tags,
                              reinterpret_cast<MrHandle* const*>(mhandles), &req);
    *request = req;
    return r;
  });
}

// v9+: sizes are size_t already.
inline ncclResult_t irecv(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhandles,
                          void** request) {
  MESH_CHECK(checkRecvArgs(recvComm, n, data, sizes, tags, mhandles, request));
  return postRecv(recvComm, n, data, sizes, tags, mhandles, request);
}

inline ncclResult_t iflush(void* recvComm, int n, void** data, int* sizes, void** mhandles, void** request) {
  MESH_ABI_NOT_NULL(recvComm, "iflush");
  MESH_ABI_NOT_NULL(request, "iflush");
  if (n < 1 || n > kGroupMax || data == nullptr || sizes == nullptr || mhandles == nullptr) {
    MESH_WARN("iflush: invalid arguments (n=%d)", n);
    return ncclInvalidArgument;
  }
  return guarded("iflush", [&] {
    Request* req = nullptr;
    ncclResult_t r = netIflush(static_cast<RecvComm*>(recvComm), n, data, sizes,
                               reinterpret_cast<MrHandle* const*>(mhandles), &req);
    *request = req;
    return r;
  });
}

// test() reports int sizes in every version, v12 included. NCCL passes one int for a send
// and n for a grouped receive: write exactly the request's count. A size above INT_MAX
// (possible from v9 on) is reported as INT_MAX: NCCL only sums these for its profiler and
// traces, and a wrapped negative count would be worse.
inline ncclResult_t test(void* request, int* done, int* sizes) {
  MESH_ABI_NOT_NULL(request, "test");
  MESH_ABI_NOT_NULL(done, "test");
  return guarded("test", [&] {
    size_t wide[kGroupMax] = {};
    int n = 0;
    ncclResult_t r = netTest(static_cast<Request*>(request), done, wide, &n);
    if (r == ncclSuccess && *done && sizes != nullptr) {
      for (int i = 0; i < n; ++i) {
        sizes[i] = wide[i] > static_cast<size_t>(INT_MAX) ? INT_MAX : static_cast<int>(wide[i]);
      }
    }
    return r;
  });
}

inline ncclResult_t closeSend(void* sendComm) {
  MESH_ABI_NOT_NULL(sendComm, "closeSend");
  return guarded("closeSend", [&] { return netCloseSend(static_cast<SendComm*>(sendComm)); });
}

inline ncclResult_t closeRecv(void* recvComm) {
  MESH_ABI_NOT_NULL(recvComm, "closeRecv");
  return guarded("closeRecv", [&] { return netCloseRecv(static_cast<RecvComm*>(recvComm)); });
}

inline ncclResult_t closeListen(void* listenComm) {
  MESH_ABI_NOT_NULL(listenComm, "closeListen");
  return guarded("closeListen", [&] { return netCloseListen(static_cast<ListenComm*>(listenComm)); });
}

inline ncclResult_t getDeviceMr(void*, void*, void** dptr) {
  // HOST device type: there is no device-side handle.
  if (dptr != nullptr) *dptr = nullptr;
  return ncclSuccess;
}

inline ncclResult_t irecvConsumed(void*, int, void*) { return ncclSuccess; }

}  // namespace abi
}  // namespace mesh
