// SPDX-License-Identifier: Apache-2.0
// RDMA asynchronous events (ibv_get_async_event), handled on the reactor thread. A fatal
// QP event fails the comm that owns the QP (found through the QP's context); port, device
// and CQ errors are logged (the QPs on them then fail through their completions).
#pragma once

#include <infiniband/verbs.h>

#include <string>

namespace mesh {

enum class AsyncAction { FailedComm, Warned, Info };

// Handles one event of device `device`; `what` is its name (ibv_event_type_str). Does not
// acknowledge it.
AsyncAction handleAsyncEvent(const std::string& device, const char* what, const ibv_async_event& ev);

// "QP fatal error" and the like for the event types that fail a comm; "asynchronous event
// <n>" for any other.
std::string fatalQpEventName(int type);

}  // namespace mesh
