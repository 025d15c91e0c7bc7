// SPDX-License-Identifier: Apache-2.0
// The ncclNet v9 ABI (NCCL 2.24, 2.25; newer NCCLs prefer v10/v11). A thin adapter over
// abi_common.h: v8's calls with size_t message sizes and the v9 properties.
//
// makeVDevice is left NULL on purpose. NCCL then uses each device as it is (topo.cc:
// usePhysicalDevices = ... || makeVDevice == NULL). With a non-NULL makeVDevice, NCCL 2.24
// and 2.25 call it for EVERY device, even alone ({ndevs=1}), and abort communicator init
// when it returns ncclInvalidUsage; the plugin has nothing to fuse anyway: a node-mode
// device already spans every mesh port.
#include "abi_common.h"
#include "net_v9.h"

namespace mesh {
namespace {

ncclResult_t v9Connect(int dev, void* handle, void** sendComm, ncclNetDeviceHandle_v9_t** sendDevComm) {
  return abi::connect(dev, handle, ConnOptions(), sendComm, sendDevComm);
}

}  // namespace
}  // namespace mesh

extern "C" __attribute__((visibility("default"))) const ncclNet_v9_t ncclNetPlugin_v9 = {
    "Mesh",
    mesh::abi::initAs<9>,
    mesh::abi::devices,
    mesh::abi::getProperties<ncclNetProperties_v9_t>,
    mesh::abi::listen,
    mesh::v9Connect,
    mesh::abi::accept,
    mesh::abi::regMr,
    mesh::abi::regMrDmaBuf,
    mesh::abi::deregMr,
    mesh::abi::isend,
    mesh::abi::irecv,
    mesh::abi::iflush,
    mesh::abi::test,
    mesh::abi::closeSend,
    mesh::abi::closeRecv,
    mesh::abi::closeListen,
    mesh::abi::getDeviceMr,
    mesh::abi::irecvConsumed,
    nullptr,  // makeVDevice: see above
};
