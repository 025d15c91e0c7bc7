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
#include "traced.h"
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
    mesh::traced::init<9, mesh::abi::initAs<9>>,
    mesh::traced::devices<9, mesh::abi::devices>,
    mesh::traced::getProperties<9, ncclNetProperties_v9_t, mesh::abi::getProperties<ncclNetProperties_v9_t>>,
    mesh::traced::listen<9, mesh::abi::listen>,
    mesh::traced::connect<9, mesh::v9Connect>,
    mesh::traced::accept<9, mesh::abi::accept>,
    mesh::traced::regMr<9, mesh::abi::regMr>,
    mesh::traced::regMrDmaBuf<9, mesh::abi::regMrDmaBuf>,
    mesh::traced::deregMr<9, mesh::abi::deregMr>,
    mesh::traced::isend<9, mesh::abi::isend>,
    mesh::traced::irecv<9, mesh::abi::irecv>,
    mesh::traced::iflush<9, mesh::abi::iflush>,
    mesh::traced::test<9, mesh::abi::test>,
    mesh::traced::close<9, mesh::trace::Call::CloseSend, mesh::abi::closeSend>,
    mesh::traced::close<9, mesh::trace::Call::CloseRecv, mesh::abi::closeRecv>,
    mesh::traced::close<9, mesh::trace::Call::CloseListen, mesh::abi::closeListen>,
    mesh::traced::getDeviceMr<9, mesh::abi::getDeviceMr>,
    mesh::traced::irecvConsumed<9, mesh::abi::irecvConsumed>,
    nullptr,  // makeVDevice: see above
};
