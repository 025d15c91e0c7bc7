// SPDX-License-Identifier: Apache-2.0
#include "mesh/datapath/async_events.h"

#include "mesh/datapath/comm.h"
#include "mesh/discovery/nic_discovery.h"
#include "mesh/platform/log.h"

namespace mesh {

std::string fatalQpEventName(int type) {
  switch (type) {
    case IBV_EVENT_QP_FATAL: return "QP fatal error";
    case IBV_EVENT_QP_REQ_ERR: return "QP invalid request error";
    case IBV_EVENT_QP_ACCESS_ERR: return "QP access error";
    case IBV_EVENT_PATH_MIG_ERR: return "path migration error";
    case IBV_EVENT_CQ_ERR: return "CQ error";
    default: return "asynchronous event " + std::to_string(type);
  }
}

AsyncAction handleAsyncEvent(const std::string& device, const char* what, const ibv_async_event& ev,
                             VerbsDevice* dev) {
  switch (ev.event_type) {
    case IBV_EVENT_QP_FATAL:
    case IBV_EVENT_QP_REQ_ERR:
    case IBV_EVENT_QP_ACCESS_ERR:
    case IBV_EVENT_PATH_MIG_ERR:
      MESH_WARN("%s: %s on QPN %u", device.c_str(), what, ev.element.qp->qp_num);
      if (ev.element.qp->qp_context == nullptr) return AsyncAction::Warned;
      static_cast<Comm*>(ev.element.qp->qp_context)->markAsyncError(ev.event_type);
      return AsyncAction::FailedComm;
    case IBV_EVENT_PORT_ERR:
      MESH_WARN("%s: %s (port %d)", device.c_str(), what, ev.element.port_num);
      return AsyncAction::Warned;
    case IBV_EVENT_DEVICE_FATAL:  // the element carries nothing for device events
      MESH_WARN("%s: %s: every connection on the device fails; restart the process once the device is back",
                device.c_str(), what);
      if (dev == nullptr) return AsyncAction::Warned;
      dev->markFatal();
      return AsyncAction::FailedDevice;
    case IBV_EVENT_CQ_ERR:  // the CQs cannot overflow by their sizing: a provider fault
      MESH_WARN("%s: %s", device.c_str(), what);
      if (ev.element.cq == nullptr || ev.element.cq->cq_context == nullptr) return AsyncAction::Warned;
      static_cast<Comm*>(ev.element.cq->cq_context)->markAsyncError(ev.event_type);
      return AsyncAction::FailedComm;
    default:
      MESH_INFO(NCCL_NET, "%s: async event %s", device.c_str(), what);
      return AsyncAction::Info;
  }
}

}  // namespace mesh
