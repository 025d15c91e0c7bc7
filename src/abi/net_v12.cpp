// SPDX-License-Identifier: Apache-2.0
// The ncclNet v12 ABI (NCCL 2.30, which looks for it first). The same 21 entry points as
// v11 (comm_context.h) with the v12 properties: 8 virtual-device slots, railId and planeId
// (net_devices.h says why every mesh device reports rail 0, plane 0).
// makeVDevice stays NULL, as in v9 (see net_v9.cpp).
#include "abi_common.h"
#include "comm_context.h"
#include "net_v12.h"

extern "C" __attribute__((visibility("default"))) const ncclNet_v12_t ncclNetPlugin_v12 = {
    "Mesh",
    mesh::abi::ctxInitAs<12>,
    mesh::abi::devices,
    mesh::abi::getProperties<ncclNetProperties_v12_t>,
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
