// SPDX-License-Identifier: Apache-2.0
// The ncclNet v8 ABI (NCCL 2.20 to 2.23; newer NCCLs use v9+ when the plugin has them).
// A thin adapter over abi_common.h: v8 differs from the shared entry points only in its int
// sizes, which it checks and widens here.
#include "abi_common.h"
#include "traced.h"
#include "net_v8.h"

namespace mesh {
namespace {

ncclResult_t v8Connect(int dev, void* handle, void** sendComm, ncclNetDeviceHandle_v8_t** sendDevComm) {
  return abi::connect(dev, handle, ConnOptions(), sendComm, sendDevComm);
}

// v8 passes sizes as int: negative sizes are caller bugs, and NCCL never gives a v8 plugin
// more than 1 GiB in one message (its own v8 shim refuses larger ones).
ncclResult_t v8Isend(void* sendComm, void* data, int size, int tag, void* mhandle, void** request) {
  if (size < 0) {
    MESH_WARN("isend: negative size %d", size);
    return ncclInvalidArgument;
  }
  if (static_cast<unsigned long long>(size) > NCCL_NET_V8_MAX_SIZE) {
    MESH_WARN("isend: %d bytes is more than the v8 ABI's 1 GiB per message", size);
    return ncclInvalidArgument;
  }
  return abi::isend(sendComm, data, static_cast<size_t>(size), tag, mhandle, request);
}

ncclResult_t v8Irecv(void* recvComm, int n, void** data, int* sizes, int* tags, void** mhandles,
                     void** request) {
  MESH_CHECK(abi::checkRecvArgs(recvComm, n, data, sizes, tags, mhandles, request));
  size_t wide[kGroupMax];
  for (int i = 0; i < n; ++i) {
    if (sizes[i] < 0) {
      MESH_WARN("irecv: negative size %d", sizes[i]);
      return ncclInvalidArgument;
    }
    wide[i] = static_cast<size_t>(sizes[i]);
  }
  return abi::postRecv(recvComm, n, data, wide, tags, mhandles, request);
}

}  // namespace
}  // namespace mesh

extern "C" __attribute__((visibility("default"))) const ncclNet_v8_t ncclNetPlugin_v8 = {
    "Mesh",
    mesh::traced::init<8, mesh::abi::initAs<8>>,
    mesh::traced::devices<8, mesh::abi::devices>,
    mesh::traced::getProperties<8, ncclNetProperties_v8_t, mesh::abi::getProperties<ncclNetProperties_v8_t>>,
    mesh::traced::listen<8, mesh::abi::listen>,
    mesh::traced::connect<8, mesh::v8Connect>,
    mesh::traced::accept<8, mesh::abi::accept>,
    mesh::traced::regMr<8, mesh::abi::regMr>,
    mesh::traced::regMrDmaBuf<8, mesh::abi::regMrDmaBuf>,
    mesh::traced::deregMr<8, mesh::abi::deregMr>,
    mesh::traced::isendInt<8, mesh::v8Isend>,
    mesh::traced::irecvInt<8, mesh::v8Irecv>,
    mesh::traced::iflush<8, mesh::abi::iflush>,
    mesh::traced::test<8, mesh::abi::test>,
    mesh::traced::close<8, mesh::trace::Call::CloseSend, mesh::abi::closeSend>,
    mesh::traced::close<8, mesh::trace::Call::CloseRecv, mesh::abi::closeRecv>,
    mesh::traced::close<8, mesh::trace::Call::CloseListen, mesh::abi::closeListen>,
    mesh::traced::getDeviceMr<8, mesh::abi::getDeviceMr>,
    mesh::traced::irecvConsumed<8, mesh::abi::irecvConsumed>
};
