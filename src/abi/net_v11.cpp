// SPDX-License-Identifier: Apache-2.0
// The ncclNet v11 ABI (NCCL 2.28, 2.29; NCCL 2.30 prefers v12). A thin table over
// abi_common.h and the per-communicator contexts of comm_context.h.
// makeVDevice stays NULL, as in v9 (see net_v9.cpp).
#include "abi_common.h"
#include "traced.h"
#include "comm_context.h"
#include "net_v11.h"

extern "C" __attribute__((visibility("default"))) const ncclNet_v11_t ncclNetPlugin_v11 = {
    "Mesh",
    mesh::traced::ctxInit<11, mesh::abi::ctxInitAs<11>>,
    mesh::traced::devices<11, mesh::abi::devices>,
    mesh::traced::getProperties<11, ncclNetProperties_v11_t, mesh::abi::getProperties<ncclNetProperties_v11_t>>,
    mesh::traced::ctxListen<11, mesh::abi::ctxListen>,
    mesh::traced::ctxConnect<11, mesh::abi::ctxConnect>,
    mesh::traced::accept<11, mesh::abi::accept>,
    mesh::traced::regMr<11, mesh::abi::regMr>,
    mesh::traced::regMrDmaBuf<11, mesh::abi::regMrDmaBuf>,
    mesh::traced::deregMr<11, mesh::abi::deregMr>,
    mesh::traced::isendP<11, mesh::abi::ctxIsend>,
    mesh::traced::irecvP<11, mesh::abi::ctxIrecv>,
    mesh::traced::iflush<11, mesh::abi::iflush>,
    mesh::traced::test<11, mesh::abi::test>,
    mesh::traced::close<11, mesh::trace::Call::CloseSend, mesh::abi::closeSend>,
    mesh::traced::close<11, mesh::trace::Call::CloseRecv, mesh::abi::closeRecv>,
    mesh::traced::close<11, mesh::trace::Call::CloseListen, mesh::abi::closeListen>,
    mesh::traced::getDeviceMr<11, mesh::abi::getDeviceMr>,
    mesh::traced::irecvConsumed<11, mesh::abi::irecvConsumed>,
    nullptr,  // makeVDevice
    mesh::traced::finalize<11, mesh::abi::ctxFinalize>,
    mesh::traced::setNetAttr<11, mesh::abi::ctxSetNetAttr>,
};
