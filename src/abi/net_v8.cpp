// The ncclNet v8 ABI: the only code that knows NCCL's structs. Each entry point validates
// its pointers, calls the core, catches everything, and maps the outcome to ncclResult_t.
// Nothing thrown or aborted may cross into NCCL's process.
#include <cstring>
#include <exception>
#include <new>

#include "mesh/log.h"
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

ncclResult_t v8NotYet(const char* what) {
  MESH_WARN("%s is not implemented yet", what);
  return ncclInternalError;
}

ncclResult_t v8Listen(int, void*, void**) { return v8NotYet("listen"); }
ncclResult_t v8Connect(int, void*, void**, ncclNetDeviceHandle_v8_t**) { return v8NotYet("connect"); }
ncclResult_t v8Accept(void*, void**, ncclNetDeviceHandle_v8_t**) { return v8NotYet("accept"); }
ncclResult_t v8RegMr(void*, void*, size_t, int, void**) { return v8NotYet("regMr"); }
ncclResult_t v8RegMrDmaBuf(void*, void*, size_t, int, uint64_t, int, void**) {
  return v8NotYet("regMrDmaBuf");
}
ncclResult_t v8DeregMr(void*, void*) { return v8NotYet("deregMr"); }
ncclResult_t v8Isend(void*, void*, int, int, void*, void**) { return v8NotYet("isend"); }
ncclResult_t v8Irecv(void*, int, void**, int*, int*, void**, void**) { return v8NotYet("irecv"); }
ncclResult_t v8Iflush(void*, int, void**, int*, void**, void**) { return v8NotYet("iflush"); }
ncclResult_t v8Test(void*, int*, int*) { return v8NotYet("test"); }
ncclResult_t v8CloseSend(void*) { return v8NotYet("closeSend"); }
ncclResult_t v8CloseRecv(void*) { return v8NotYet("closeRecv"); }
ncclResult_t v8CloseListen(void*) { return v8NotYet("closeListen"); }

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
