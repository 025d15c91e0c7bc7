// SPDX-License-Identifier: Apache-2.0
// Verbs loader: rdma-core's libibverbs is dlopen'ed at init (no link-time dependency), so a
// machine without rdma-core loads the plugin fine and just reports zero devices.
// Symbols are bound with dlvsym at rdma-core's version nodes: the core API at IBVERBS_1.1,
// newer calls at the node that introduced them (optional: nullptr when absent).
//
// Only the rdma-core *headers* are used at build time. Calls that verbs.h implements as
// inline wrappers around exported symbols (ibv_query_port, ibv_reg_mr, ...) must go through
// this table instead, or the plugin would link against libibverbs.
#pragma once

#include <infiniband/verbs.h>

#include <string>

#include "err.h"

namespace mesh {

// X(member, symbol, version, required, return type, parameters)
#define MESH_VERBS_SYMBOLS(X)                                                                   \
  X(getDeviceList, "ibv_get_device_list", "IBVERBS_1.1", true, ibv_device**, (int*))            \
  X(freeDeviceList, "ibv_free_device_list", "IBVERBS_1.1", true, void, (ibv_device**))          \
  X(getDeviceName, "ibv_get_device_name", "IBVERBS_1.1", true, const char*, (ibv_device*))      \
  X(getDeviceGuid, "ibv_get_device_guid", "IBVERBS_1.1", true, __be64, (ibv_device*))           \
  X(openDevice, "ibv_open_device", "IBVERBS_1.1", true, ibv_context*, (ibv_device*))            \
  X(closeDevice, "ibv_close_device", "IBVERBS_1.1", true, int, (ibv_context*))                  \
  X(queryDevice, "ibv_query_device", "IBVERBS_1.1", true, int, (ibv_context*, ibv_device_attr*)) \
  X(queryPort, "ibv_query_port", "IBVERBS_1.1", true, int, (ibv_context*, uint8_t, ibv_port_attr*)) \
  X(queryGid, "ibv_query_gid", "IBVERBS_1.1", true, int, (ibv_context*, uint8_t, int, ibv_gid*)) \
  X(allocPd, "ibv_alloc_pd", "IBVERBS_1.1", true, ibv_pd*, (ibv_context*))                      \
  X(deallocPd, "ibv_dealloc_pd", "IBVERBS_1.1", true, int, (ibv_pd*))                           \
  X(regMr, "ibv_reg_mr", "IBVERBS_1.1", true, ibv_mr*, (ibv_pd*, void*, size_t, int))           \
  X(deregMr, "ibv_dereg_mr", "IBVERBS_1.1", true, int, (ibv_mr*))                               \
  X(createCq, "ibv_create_cq", "IBVERBS_1.1", true, ibv_cq*,                                    \
    (ibv_context*, int, void*, ibv_comp_channel*, int))                                         \
  X(destroyCq, "ibv_destroy_cq", "IBVERBS_1.1", true, int, (ibv_cq*))                           \
  X(createQp, "ibv_create_qp", "IBVERBS_1.1", true, ibv_qp*, (ibv_pd*, ibv_qp_init_attr*))      \
  X(modifyQp, "ibv_modify_qp", "IBVERBS_1.1", true, int, (ibv_qp*, ibv_qp_attr*, int))          \
  X(destroyQp, "ibv_destroy_qp", "IBVERBS_1.1", true, int, (ibv_qp*))                           \
  X(getAsyncEvent, "ibv_get_async_event", "IBVERBS_1.1", true, int, (ibv_context*, ibv_async_event*)) \
  X(ackAsyncEvent, "ibv_ack_async_event", "IBVERBS_1.1", true, void, (ibv_async_event*))        \
  X(eventTypeStr, "ibv_event_type_str", "IBVERBS_1.1", true, const char*, (ibv_event_type))     \
  X(wcStatusStr, "ibv_wc_status_str", "IBVERBS_1.1", true, const char*, (ibv_wc_status))        \
  X(forkInit, "ibv_fork_init", "IBVERBS_1.1", false, int, ())                                   \
  X(isForkInitialized, "ibv_is_fork_initialized", "IBVERBS_1.13", false, ibv_fork_status, ())  \
  X(regMrIova2, "ibv_reg_mr_iova2", "IBVERBS_1.8", false, ibv_mr*,                              \
    (ibv_pd*, void*, size_t, uint64_t, unsigned int))                                           \
  X(regDmabufMr, "ibv_reg_dmabuf_mr", "IBVERBS_1.12", false, ibv_mr*,                           \
    (ibv_pd*, uint64_t, size_t, uint64_t, int, int))                                            \
  X(queryEce, "ibv_query_ece", "IBVERBS_1.10", false, int, (ibv_qp*, ibv_ece*))                 \
  X(setEce, "ibv_set_ece", "IBVERBS_1.10", false, int, (ibv_qp*, ibv_ece*))                     \
  X(queryGidEx, "_ibv_query_gid_ex", "IBVERBS_1.11", false, int,                                \
    (ibv_context*, uint32_t, uint32_t, ibv_gid_entry*, uint32_t, size_t))                       \
  X(queryGidTable, "_ibv_query_gid_table", "IBVERBS_1.11", false, ssize_t,                      \
    (ibv_context*, ibv_gid_entry*, size_t, uint32_t, size_t))                                   \
  X(queryPortSpeed, "ibv_query_port_speed", "IBVERBS_1.16", false, int,                        \
    (ibv_context*, uint32_t, uint64_t*))

struct VerbsApi {
#define MESH_VERBS_MEMBER(member, sym, ver, required, ret, params) ret(*member) params = nullptr;
  MESH_VERBS_SYMBOLS(MESH_VERBS_MEMBER)
#undef MESH_VERBS_MEMBER
  void* libHandle = nullptr;
  std::string path;
};

// Opens `path` (e.g. "libibverbs.so.1") and binds every symbol. On failure returns
// ncclSystemError with *why explaining what is missing and how to install it; *api is left
// unloaded. Never aborts.
ncclResult_t loadVerbs(const std::string& path, VerbsApi* api, std::string* why);
// dlclose()s the library (idempotent).
void unloadVerbs(VerbsApi* api);

// ibv_query_port without the inline wrapper in verbs.h: uses the provider's extended
// query_port when present (full ibv_port_attr), else the IBVERBS_1.1 symbol.
// *activeSpeedEx (when given) gets the port's active_speed_ex: rdma-core 49 appended it to
// ibv_port_attr for rates past active_speed's 8 bits (XDR is 0x100). Asked for whatever
// rdma-core these headers are; 0 where the library, provider or kernel does not report it.
int queryPort(const VerbsApi& api, ibv_context* ctx, uint8_t port, ibv_port_attr* attr,
              uint32_t* activeSpeedEx = nullptr);

}  // namespace mesh
