// SPDX-License-Identifier: Apache-2.0
// The ncclNet v12 ABI (NCCL 2.30, which looks for it first). The same 21 entry points as
// v11 (comm_context.h) with the v12 properties: 8 virtual-device slots, railId and planeId
// (net_devices.h says why every mesh device reports rail 0, plane 0).
// makeVDevice stays NULL, as in v9 (see net_v9.cpp).
#include "abi_common.h"
#include "traced.h"
#include "comm_context.h"
#include "net_v12.h"

extern "C" __attribute__((visibility("default"))) const ncclNet_v12_t ncclNetPlugin_v12 = {
    "Mesh",
    mesh::traced::ctxInit<12, mesh::abi::ctxInitAs<12>>,
    mesh::traced::devices<12, mesh::abi::devices>,
    mesh::traced::getProperties<12, ncclNetProperties_v12_t, mesh::abi::getProperties<ncclNetProperties_v12_t>>,
    mesh::traced::ctxListen<12, mesh::abi::ctxListen>,
    mesh::traced::ctxConnect<12, mesh::abi::ctxConnect>,
    mesh::traced::accept<12, mesh::abi::accept>,
    mesh::traced::regMr<12, mesh::abi::regMr>,
    mesh::traced::regMrDmaBuf<12, mesh::abi::regMrDmaBuf>,
    mesh::traced::deregMr<12, mesh::abi::deregMr>,
    mesh::traced::isendP<12, mesh::abi::ctxIsend>,
    mesh::traced::irecvP<12, mesh::abi::ctxIrecv>,
    mesh::traced::iflush<12, mesh::abi::iflush>,
    mesh::traced::test<12, mesh::abi::test>,
    mesh::traced::close<12, mesh::trace::Call::CloseSend, mesh::abi::closeSend>,
    mesh::traced::close<12, mesh::trace::Call::CloseRecv, mesh::abi::closeRecv>,
    mesh::traced::close<12, mesh::trace::Call::CloseListen, mesh::abi::closeListen>,
    mesh::traced::getDeviceMr<12, mesh::abi::getDeviceMr>,
    mesh::traced::irecvConsumed<12, mesh::abi::irecvConsumed>,
    nullptr,  // makeVDevice
    mesh::traced::finalize<12, mesh::abi::ctxFinalize>,
    mesh::traced::setNetAttr<12, mesh::abi::ctxSetNetAttr>,
};
