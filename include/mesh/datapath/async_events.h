// SPDX-License-Identifier: Apache-2.0
// RDMA asynchronous events (ibv_get_async_event), handled on the reactor thread, as NCCL's
// IB transport handles them (ncclIbAsyncThreadMain): a fatal QP event or a CQ error fails
// the comm that owns the QP or CQ (found through its context); a device's fatal error fails
// every comm on the device (VerbsDevice::markFatal); a port error is logged (the QPs on it
// fail through their completions).
#pragma once

#include <infiniband/verbs.h>

#include <string>

namespace mesh {

enum class AsyncAction { FailedComm, FailedDevice, Warned, Info };

class VerbsDevice;

// Handles one event of device `device` (`dev`: the device, marked fatal on
// IBV_EVENT_DEVICE_FATAL; may be null); `what` is its name (ibv_event_type_str). Does not
// acknowledge it.
AsyncAction handleAsyncEvent(const std::string& device, const char* what, const ibv_async_event& ev,
                             VerbsDevice* dev = nullptr);

// "QP fatal error", "CQ error" and the like for the event types that fail a comm; "asynchronous event
// <n>" for any other.
std::string fatalQpEventName(int type);

}  // namespace mesh
