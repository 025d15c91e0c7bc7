// The ncclNet v8 ABI: the only code that knows NCCL's structs. Each entry point validates
// its pointers, calls the core, catches everything, and maps the outcome to ncclResult_t.
// Nothing thrown or aborted may cross into NCCL's process.
#include <cstring>
#include <exception>
#include <new>

#include "mesh/check.h"
#include "mesh/log.h"
#include "mesh/net.h"
#include "mesh/plugin.h"
#include "net_v8.h"

namespace mesh {
namespace {

template <typename Fn>
ncclResult_t guarded(const char* what, Fn&& fn) {
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

ncclResult_t requireInit(const char* what) {
  if (Plugin::instance().initialized()) return ncclSuccess;
  MESH_WARN("%s called before init", what);
  return ncclInvalidUsage;
}

ncclResult_t v8Init(ncclDebugLogger_t logFunction) {
  return guarded("init", [&] { return Plugin::instance().init(logFunction); });
}

ncclResult_t v8Devices(int* ndev) {
  MESH_ABI_NOT_NULL(ndev, "devices");
  return guarded("devices", [&] {
    ncclResult_t r = requireInit("devices");
    if (r != ncclSuccess) return r;
    *ndev = Plugin::instance().deviceCount();
    return ncclSuccess;
  });
}

ncclResult_t v8GetProperties(int dev, ncclNetProperties_v8_t* props) {
  MESH_ABI_NOT_NULL(props, "getProperties");
  return guarded("getProperties", [&] {
    ncclResult_t r = requireInit("getProperties");
    if (r != ncclSuccess) return r;
    const NetDevice* d = nullptr;
    r = Plugin::instance().device(dev, &d);
    if (r != ncclSuccess) return r;
    memset(props, 0, sizeof(*props));
    // NCCL keeps these pointers: they point into the device table, which lives until
    // the library is unloaded.
    props->name = const_cast<char*>(d->name.c_str());
    props->pciPath = d->pciPath.empty() ? nullptr : const_cast<char*>(d->pciPath.c_str());
    props->guid = d->guid;
    props->ptrSupport = d->ptrSupport;
    props->regIsGlobal = d->regIsGlobal ? 1 : 0;
    props->speed = d->speedMbps;
    props->port = d->port;
    props->latency = d->latencyUs;
    props->maxComms = d->maxComms;
    props->maxRecvs = d->maxRecvs;
    props->netDeviceType = NCCL_NET_DEVICE_HOST;
    props->netDeviceVersion = 0;
    return ncclSuccess;
  });
}

// v8 passes sizes as int; negative sizes are caller bugs.
ncclResult_t v8Listen(int dev, void* handle, void** listenComm) {
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

ncclResult_t v8Connect(int dev, void* handle, void** sendComm, ncclNetDeviceHandle_v8_t** sendDevComm) {
  MESH_ABI_NOT_NULL(handle, "connect");
  MESH_ABI_NOT_NULL(sendComm, "connect");
  return guarded("connect", [&] {
    *sendComm = nullptr;
    if (sendDevComm != nullptr) *sendDevComm = nullptr;  // HOST device type
    MESH_CHECK(requireInit("connect"));
    SendComm* sc = nullptr;
    MESH_CHECK(netConnect(dev, handle, ConnOptions(), &sc));
    *sendComm = sc;
    return ncclSuccess;
  });
}

ncclResult_t v8Accept(void* listenComm, void** recvComm, ncclNetDeviceHandle_v8_t** recvDevComm) {
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

ncclResult_t v8RegMr(void* comm, void* data, size_t size, int type, void** mhandle) {
  MESH_ABI_NOT_NULL(mhandle, "regMr");
  return guarded("regMr", [&] {
    MrHandle* mh = nullptr;
    MESH_CHECK(netRegMr(comm, data, size, type, -1, 0, &mh));
    *mhandle = mh;
    return ncclSuccess;
  });
}

ncclResult_t v8RegMrDmaBuf(void* comm, void* data, size_t size, int type, uint64_t offset, int fd,
                           void** mhandle) {
  MESH_ABI_NOT_NULL(mhandle, "regMrDmaBuf");
  return guarded("regMrDmaBuf", [&] {
    MrHandle* mh = nullptr;
    MESH_CHECK(netRegMr(comm, data, size, type, fd, offset, &mh));
    *mhandle = mh;
    return ncclSuccess;
  });
}

ncclResult_t v8DeregMr(void*, void* mhandle) {
  MESH_ABI_NOT_NULL(mhandle, "deregMr");
  return guarded("deregMr", [&] { return netDeregMr(static_cast<MrHandle*>(mhandle)); });
}

ncclResult_t v8Isend(void* sendComm, void* data, int size, int tag, void* mhandle, void** request) {
  MESH_ABI_NOT_NULL(sendComm, "isend");
  MESH_ABI_NOT_NULL(request, "isend");
  if (size < 0) {
    MESH_WARN("isend: negative size %d", size);
    return ncclInvalidArgument;
  }
  return guarded("isend", [&] {
    Request* req = nullptr;
    ncclResult_t r = netIsend(static_cast<SendComm*>(sendComm), data, static_cast<size_t>(size), tag,
                              static_cast<MrHandle*>(mhandle), &req);
    *request = req;
    return r;
  });
}

ncclResult_t v8Irecv(void* recvComm, int n, void** data, int* sizes, int* tags, void** mhandles,
                     void** request) {
  MESH_ABI_NOT_NULL(recvComm, "irecv");
  MESH_ABI_NOT_NULL(request, "irecv");
  if (n < 1 || n > kMaxRecvs || data == nullptr || sizes == nullptr || tags == nullptr || mhandles == nullptr) {
    MESH_WARN("irecv: invalid arguments (n=%d, arrays must be non-NULL)", n);
    return ncclInvalidArgument;
  }
  return guarded("irecv", [&] {
    size_t wide[kMaxRecvs];
    for (int i = 0; i < n; ++i) {
      if (sizes[i] < 0) {
        MESH_WARN("irecv: negative size %d", sizes[i]);
        return ncclInvalidArgument;
      }
      wide[i] = static_cast<size_t>(sizes[i]);
    }
    Request* req = nullptr;
    ncclResult_t r = netIrecv(static_cast<RecvComm*>(recvComm), n, data, wide, tags,
                              reinterpret_cast<MrHandle* const*>(mhandles), &req);
    *request = req;
    return r;
  });
}

ncclResult_t v8Iflush(void* recvComm, int n, void** data, int* sizes, void** mhandles, void** request) {
  MESH_ABI_NOT_NULL(recvComm, "iflush");
  MESH_ABI_NOT_NULL(request, "iflush");
  if (n < 1 || n > kMaxRecvs || data == nullptr || sizes == nullptr || mhandles == nullptr) {
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

ncclResult_t v8Test(void* request, int* done, int* sizes) {
  MESH_ABI_NOT_NULL(request, "test");
  MESH_ABI_NOT_NULL(done, "test");
  return guarded("test", [&] {
    size_t wide[kMaxRecvs] = {};
    int n = 0;
    ncclResult_t r = netTest(static_cast<Request*>(request), done, wide, &n);
    // NCCL passes one int for a send and n for a grouped receive: write exactly n. v8 sizes
    // are int on both sides, so they fit.
    if (r == ncclSuccess && *done && sizes != nullptr) {
      for (int i = 0; i < n; ++i) sizes[i] = static_cast<int>(wide[i]);
    }
    return r;
  });
}

ncclResult_t v8CloseSend(void* sendComm) {
  MESH_ABI_NOT_NULL(sendComm, "closeSend");
  return guarded("closeSend", [&] { return netCloseSend(static_cast<SendComm*>(sendComm)); });
}

ncclResult_t v8CloseRecv(void* recvComm) {
  MESH_ABI_NOT_NULL(recvComm, "closeRecv");
  return guarded("closeRecv", [&] { return netCloseRecv(static_cast<RecvComm*>(recvComm)); });
}

ncclResult_t v8CloseListen(void* listenComm) {
  MESH_ABI_NOT_NULL(listenComm, "closeListen");
  return guarded("closeListen", [&] { return netCloseListen(static_cast<ListenComm*>(listenComm)); });
}

ncclResult_t v8GetDeviceMr(void*, void*, void** dptr) {
  // HOST device type: there is no device-side handle.
  if (dptr != nullptr) *dptr = nullptr;
  return ncclSuccess;
}

ncclResult_t v8IrecvConsumed(void*, int, void*) { return ncclSuccess; }

}  // namespace
}  // namespace mesh

extern "C" __attribute__((visibility("default"))) const ncclNet_v8_t ncclNetPlugin_v8 = {
    "Mesh",
    mesh::v8Init,
    mesh::v8Devices,
    mesh::v8GetProperties,
    mesh::v8Listen,
    mesh::v8Connect,
    mesh::v8Accept,
    mesh::v8RegMr,
    mesh::v8RegMrDmaBuf,
    mesh::v8DeregMr,
    mesh::v8Isend,
    mesh::v8Irecv,
    mesh::v8Iflush,
    mesh::v8Test,
    mesh::v8CloseSend,
    mesh::v8CloseRecv,
    mesh::v8CloseListen,
    mesh::v8GetDeviceMr,
    mesh::v8IrecvConsumed,
};
