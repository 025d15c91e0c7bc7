// SPDX-License-Identifier: Apache-2.0
// The ncclNet v11 ABI (NCCL 2.28, 2.29; NCCL 2.30 prefers v12). A thin table over
// abi_common.h and the per-communicator contexts of comm_context.h.
// makeVDevice stays NULL, as in v9 (see net_v9.cpp).
#include "abi_common.h"
#include "comm_context.h"
#include "net_v11.h"

extern "C" __attribute__((visibility("default"))) const ncclNet_v11_t ncclNetPlugin_v11 = {
    "Mesh",
    mesh::abi::ctxInitAs<11>,
    mesh::abi::devices,
    mesh::abi::getProperties<ncclNetProperties_v11_t>,
    mesh::abi::ctxListen,
    mesh::abi::ctxConnect,
    mesh::abi::accept,
    mesh::abi::regMr,
    mesh::abi::regMrDmaBuf,
    mesh::abi::deregMr,
    mesh::abi::ctxIsend,
    mesh::abi::ctxIrecv,
    mesh::abi::iflush,
    mesh::abi::test,
    mesh::abi::closeSend,
    mesh::abi::closeRecv,
    mesh::abi::closeListen,
    mesh::abi::getDeviceMr,
    mesh::abi::irecvConsumed,
    nullptr,  // makeVDevice
    mesh::abi::ctxFinalize,
    mesh::abi::ctxSetNetAttr,
};
