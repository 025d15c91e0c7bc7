// SPDX-License-Identifier: Apache-2.0
// The ncclNet v10 ABI (NCCL 2.26, 2.27; NCCL 2.28+ also drives v10 plugins through its shim).
// A thin adapter over abi_common.h: v9 plus NCCL's profiler callback (accepted, not used:
// the plugin emits no profiler events), profiler handles on isend/irecv (ignored), and a
// per-communicator traffic class at connect.
// makeVDevice stays NULL, as in v9 (see net_v9.cpp).
#include "abi_common.h"
#include "traced.h"
#include "net_v10.h"

namespace mesh {
namespace {

ncclResult_t v10Init(ncclDebugLogger_t logFunction, ncclProfilerCallback_t) { return abi::init(logFunction, 10); }

// NCCL passes the communicator's config on every connect call, or NULL (its GPUDirect probe).
ncclResult_t v10Connect(int dev, ncclNetCommConfig_v10_t* config, void* handle, void** sendComm,
                        ncclNetDeviceHandle_v10_t** sendDevComm) {
  ConnOptions opts;
  MESH_CHECK(abi::connOptions(config, "connect", /*reportEveryCall=*/false, &opts));
  return abi::connect(dev, handle, opts, sendComm, sendDevComm);
}

ncclResult_t v10Isend(void* sendComm, void* data, size_t size, int tag, void* mhandle, void*, void** request) {
  return abi::isend(sendComm, data, size, tag, mhandle, request);
}

ncclResult_t v10Irecv(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhandles, void**,
                      void** request) {
  return abi::irecv(recvComm, n, data, sizes, tags, mhandles, request);
}

}  // namespace
}  // namespace mesh

extern "C" __attribute__((visibility("default"))) const ncclNet_v10_t ncclNetPlugin_v10 = {
    "Mesh",
    mesh::traced::initProf<10, mesh::v10Init>,
    mesh::traced::devices<10, mesh::abi::devices>,
    mesh::traced::getProperties<10, ncclNetProperties_v10_t, mesh::abi::getProperties<ncclNetProperties_v10_t>>,
    mesh::traced::listen<10, mesh::abi::listen>,
    mesh::traced::connectCfg<10, mesh::v10Connect>,
    mesh::traced::accept<10, mesh::abi::accept>,
    mesh::traced::regMr<10, mesh::abi::regMr>,
    mesh::traced::regMrDmaBuf<10, mesh::abi::regMrDmaBuf>,
    mesh::traced::deregMr<10, mesh::abi::deregMr>,
    mesh::traced::isendP<10, mesh::v10Isend>,
    mesh::traced::irecvP<10, mesh::v10Irecv>,
    mesh::traced::iflush<10, mesh::abi::iflush>,
    mesh::traced::test<10, mesh::abi::test>,
    mesh::traced::close<10, mesh::trace::Call::CloseSend, mesh::abi::closeSend>,
    mesh::traced::close<10, mesh::trace::Call::CloseRecv, mesh::abi::closeRecv>,
    mesh::traced::close<10, mesh::trace::Call::CloseListen, mesh::abi::closeListen>,
    mesh::traced::getDeviceMr<10, mesh::abi::getDeviceMr>,
    mesh::traced::irecvConsumed<10, mesh::abi::irecvConsumed>,
    nullptr,  // makeVDevice
};
