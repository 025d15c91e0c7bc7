// SPDX-License-Identifier: Apache-2.0
// The rest of rdma-core's libibverbs ABI: string tables, rate conversions, fork support,
// sysfs helpers, and the calls this fabric does not emulate (UD address handles, SRQs,
// multicast, imports), which fail the way rdma-core fails them for a provider that
// lacks them. Also the IBVERBS_PRIVATE_* symbols that rdma-core's providers (libmlx5,
// libefa: perftest links them) reference: providers register themselves from their
// constructors, so those must exist; none of them ever drives a fabric device.
// Which version node each symbol belongs to: libibverbs.map.in.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "fabric.h"

extern "C" {

const char* ibv_node_type_str(ibv_node_type t) {
  switch (t) {
    case IBV_NODE_CA: return "InfiniBand channel adapter";
    case IBV_NODE_SWITCH: return "InfiniBand switch";
    case IBV_NODE_ROUTER: return "InfiniBand router";
    case IBV_NODE_RNIC: return "iWARP NIC";
    case IBV_NODE_USNIC: return "usNIC";
    case IBV_NODE_USNIC_UDP: return "usNIC UDP";
    case IBV_NODE_UNSPECIFIED: return "unspecified";
    default: return "unknown";
  }
}

const char* ibv_port_state_str(ibv_port_state s) {
  static const char* const kNames[] = {"no state change (NOP)", "down", "init", "armed", "active", "active defer"};
  return s >= IBV_PORT_NOP && s <= IBV_PORT_ACTIVE_DEFER ? kNames[s] : "unknown";
}

const char* ibv_event_type_str(ibv_event_type e) {
  static const char* const kNames[] = {
      "CQ error", "local work queue catastrophic error", "invalid request local work queue error",
      "local access violation work queue error", "communication established", "send queue drained",
      "path migrated", "path migration request error", "local catastrophic error", "port active",
      "port error", "LID change", "P_Key change", "SM change", "SRQ catastrophic error",
      "SRQ limit reached", "last WQE reached", "client reregistration", "GID table change", "WQ fatal"};
  return e >= IBV_EVENT_CQ_ERR && e <= IBV_EVENT_WQ_FATAL ? kNames[e] : "unknown";
}

const char* ibv_wc_status_str(ibv_wc_status s) {
  static const char* const kNames[] = {
      "success", "local length error", "local QP operation error", "local EE context operation error",
      "local protection error", "Work Request Flushed Error", "memory management operation error",
      "bad response error", "local access error", "remote invalid request error", "remote access error",
      "remote operation error", "transport retry counter exceeded", "RNR retry counter exceeded",
      "local RDD violation error", "remote invalid RD request", "aborted error", "invalid EE context number",
      "invalid EE context state", "fatal error", "response timeout error", "general error", "TM error",
      "TM software rendezvous"};
  return s >= IBV_WC_SUCCESS && s <= IBV_WC_TM_RNDV_INCOMPLETE ? kNames[s] : "unknown";
}

int ibv_rate_to_mult(ibv_rate r) {
  switch (r) {
    case IBV_RATE_2_5_GBPS: return 1;
    case IBV_RATE_5_GBPS: return 2;
    case IBV_RATE_10_GBPS: return 4;
    case IBV_RATE_20_GBPS: return 8;
    case IBV_RATE_30_GBPS: return 12;
    case IBV_RATE_40_GBPS: return 16;
    case IBV_RATE_60_GBPS: return 24;
    case IBV_RATE_80_GBPS: return 32;
    case IBV_RATE_120_GBPS: return 48;
    default: return -1;
  }
}

ibv_rate mult_to_ibv_rate(int mult) {
  for (int r = IBV_RATE_2_5_GBPS; r <= IBV_RATE_120_GBPS; ++r) {
    if (ibv_rate_to_mult(static_cast<ibv_rate>(r)) == mult) return static_cast<ibv_rate>(r);
  }
  return IBV_RATE_MAX;
}

namespace {
struct RateMbps {
  ibv_rate rate;
  int mbps;
};
const RateMbps kRates[] = {
    {IBV_RATE_2_5_GBPS, 2500},    {IBV_RATE_5_GBPS, 5000},     {IBV_RATE_10_GBPS, 10000},
    {IBV_RATE_20_GBPS, 20000},    {IBV_RATE_30_GBPS, 30000},   {IBV_RATE_40_GBPS, 40000},
    {IBV_RATE_60_GBPS, 60000},    {IBV_RATE_80_GBPS, 80000},   {IBV_RATE_120_GBPS, 120000},
    {IBV_RATE_14_GBPS, 14062},    {IBV_RATE_56_GBPS, 56250},   {IBV_RATE_112_GBPS, 112500},
    {IBV_RATE_168_GBPS, 168750},  {IBV_RATE_25_GBPS, 25781},   {IBV_RATE_100_GBPS, 103125},
    {IBV_RATE_200_GBPS, 206250},  {IBV_RATE_300_GBPS, 309375}, {IBV_RATE_28_GBPS, 28125},
    {IBV_RATE_50_GBPS, 53125},    {IBV_RATE_400_GBPS, 425000}, {IBV_RATE_600_GBPS, 637500},
    {IBV_RATE_800_GBPS, 850000},  {IBV_RATE_1200_GBPS, 1275000}};
}  // namespace

int ibv_rate_to_mbps(ibv_rate r) {
  for (const RateMbps& m : kRates) {
    if (m.rate == r) return m.mbps;
  }
  return -1;
}

ibv_rate mbps_to_ibv_rate(int mbps) {
  for (const RateMbps& m : kRates) {
    if (m.mbps == mbps) return m.rate;
  }
  return IBV_RATE_MAX;
}

// Fork: the fabric needs no MADV_DONTFORK; a forked child never touches its parent's
// fabric (see afterForkInChild in transport.cpp).
int ibv_fork_init(void) { return 0; }
ibv_fork_status ibv_is_fork_initialized(void) { return IBV_FORK_UNNEEDED; }
int ibv_dontfork_range(void*, size_t) { return 0; }
int ibv_dofork_range(void*, size_t) { return 0; }

const char* ibv_get_sysfs_path(void) {
  const char* env = getenv("SYSFS_PATH");
  return env != nullptr && *env != '\0' ? env : "/sys";
}

int ibv_read_sysfs_file(const char* dir, const char* file, char* buf, size_t size) {
  char path[4096];
  snprintf(path, sizeof(path), "%s/%s", dir, file);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t n = read(fd, buf, size);
  close(fd);
  if (n <= 0) return -1;
  if (static_cast<size_t>(n) < size) buf[n] = '\0';
  if (buf[n - 1] == '\n') buf[--n] = '\0';
  return static_cast<int>(n);
}

// IBVERBS_1.0 kernel-struct copies (librdmacm links them; there is no kernel ABI here).
void ibv_copy_qp_attr_from_kern(void*, void*) {}
void ibv_copy_path_rec_from_kern(void*, void*) {}
void ibv_copy_path_rec_to_kern(void*, void*) {}
void ibv_copy_ah_attr_from_kern(void*, void*) {}

void ibv_register_driver(const char*, void*) {}

// --- not emulated ---------------------------------------------------------------------------------
ibv_ah* ibv_create_ah(ibv_pd*, ibv_ah_attr*) {
  errno = EOPNOTSUPP;
  return nullptr;
}
int ibv_destroy_ah(ibv_ah*) { return EOPNOTSUPP; }
int ibv_init_ah_from_wc(ibv_context*, uint8_t, ibv_wc*, ibv_grh*, ibv_ah_attr*) { return EOPNOTSUPP; }
ibv_ah* ibv_create_ah_from_wc(ibv_pd*, ibv_wc*, ibv_grh*, uint8_t) {
  errno = EOPNOTSUPP;
  return nullptr;
}
ibv_srq* ibv_create_srq(ibv_pd*, ibv_srq_init_attr*) {
  errno = EOPNOTSUPP;
  return nullptr;
}
int ibv_modify_srq(ibv_srq*, ibv_srq_attr*, int) { return EOPNOTSUPP; }
int ibv_query_srq(ibv_srq*, ibv_srq_attr*) { return EOPNOTSUPP; }
int ibv_destroy_srq(ibv_srq*) { return EOPNOTSUPP; }
int ibv_attach_mcast(ibv_qp*, const ibv_gid*, uint16_t) { return EOPNOTSUPP; }
int ibv_detach_mcast(ibv_qp*, const ibv_gid*, uint16_t) { return EOPNOTSUPP; }
int ibv_resolve_eth_l2_from_gid(ibv_context*, ibv_ah_attr*, uint8_t*, uint16_t*) { return EOPNOTSUPP; }
ibv_context* ibv_import_device(int) {
  errno = EOPNOTSUPP;
  return nullptr;
}
ibv_pd* ibv_import_pd(ibv_context*, uint32_t) {
  errno = EOPNOTSUPP;
  return nullptr;
}
ibv_mr* ibv_import_mr(ibv_pd*, uint32_t) {
  errno = EOPNOTSUPP;
  return nullptr;
}
ibv_dm* ibv_import_dm(ibv_context*, uint32_t) {
  errno = EOPNOTSUPP;
  return nullptr;
}
void ibv_unimport_pd(ibv_pd*) {}
void ibv_unimport_mr(ibv_mr*) {}
void ibv_unimport_dm(ibv_dm*) {}
int ibv_query_qp_data_in_order(ibv_qp*, ibv_wr_opcode, uint32_t) { return 0; }

// --- IBVERBS_PRIVATE_*: provider-facing symbols -----------------------------------------------------
// Providers' constructors call this; the fabric loads no provider and ignores them.
#define MESHFAB_CAT2(a, b) a##b
#define MESHFAB_CAT(a, b) MESHFAB_CAT2(a, b)
void MESHFAB_CAT(verbs_register_driver_, MESHFAB_PRIVATE_ABI)(const void*) {}
void __verbs_log(void*, int, const char*, ...) {}
void* _verbs_init_and_alloc_context(void) {
  errno = EOPNOTSUPP;
  return nullptr;
}
void* verbs_open_device(void) {
  errno = EOPNOTSUPP;
  return nullptr;
}
void verbs_init_cq(void) {}
void verbs_set_ops(void) {}
void verbs_uninit_context(void) {}
bool verbs_allow_disassociate_destroy(int) { return false; }
int ibv_read_ibdev_sysfs_file(char*, size_t, const char*, const char*, ...) { return -1; }

#define MESHFAB_PRIVATE_STUB(name) \
  int name(void) { return EOPNOTSUPP; }
MESHFAB_PRIVATE_STUB(execute_ioctl)
MESHFAB_PRIVATE_STUB(ibv_cmd_advise_mr)
MESHFAB_PRIVATE_STUB(ibv_cmd_alloc_dm)
MESHFAB_PRIVATE_STUB(ibv_cmd_alloc_mw)
MESHFAB_PRIVATE_STUB(ibv_cmd_alloc_pd)
MESHFAB_PRIVATE_STUB(ibv_cmd_attach_mcast)
MESHFAB_PRIVATE_STUB(ibv_cmd_close_xrcd)
MESHFAB_PRIVATE_STUB(ibv_cmd_create_ah)
MESHFAB_PRIVATE_STUB(ibv_cmd_create_counters)
MESHFAB_PRIVATE_STUB(ibv_cmd_create_cq)
MESHFAB_PRIVATE_STUB(ibv_cmd_create_cq_ex)
MESHFAB_PRIVATE_STUB(ibv_cmd_create_flow)
MESHFAB_PRIVATE_STUB(ibv_cmd_create_flow_action_esp)
MESHFAB_PRIVATE_STUB(ibv_cmd_create_qp)
MESHFAB_PRIVATE_STUB(ibv_cmd_create_qp_ex)
MESHFAB_PRIVATE_STUB(ibv_cmd_create_qp_ex2)
MESHFAB_PRIVATE_STUB(ibv_cmd_create_rwq_ind_table)
MESHFAB_PRIVATE_STUB(ibv_cmd_create_srq)
MESHFAB_PRIVATE_STUB(ibv_cmd_create_srq_ex)
MESHFAB_PRIVATE_STUB(ibv_cmd_create_wq)
MESHFAB_PRIVATE_STUB(ibv_cmd_dealloc_mw)
MESHFAB_PRIVATE_STUB(ibv_cmd_dealloc_pd)
MESHFAB_PRIVATE_STUB(ibv_cmd_dereg_mr)
MESHFAB_PRIVATE_STUB(ibv_cmd_destroy_ah)
MESHFAB_PRIVATE_STUB(ibv_cmd_destroy_counters)
MESHFAB_PRIVATE_STUB(ibv_cmd_destroy_cq)
MESHFAB_PRIVATE_STUB(ibv_cmd_destroy_flow)
MESHFAB_PRIVATE_STUB(ibv_cmd_destroy_flow_action)
MESHFAB_PRIVATE_STUB(ibv_cmd_destroy_qp)
MESHFAB_PRIVATE_STUB(ibv_cmd_destroy_rwq_ind_table)
MESHFAB_PRIVATE_STUB(ibv_cmd_destroy_srq)
MESHFAB_PRIVATE_STUB(ibv_cmd_destroy_wq)
MESHFAB_PRIVATE_STUB(ibv_cmd_detach_mcast)
MESHFAB_PRIVATE_STUB(ibv_cmd_free_dm)
MESHFAB_PRIVATE_STUB(ibv_cmd_get_context)
MESHFAB_PRIVATE_STUB(ibv_cmd_modify_cq)
MESHFAB_PRIVATE_STUB(ibv_cmd_modify_flow_action_esp)
MESHFAB_PRIVATE_STUB(ibv_cmd_modify_qp)
MESHFAB_PRIVATE_STUB(ibv_cmd_modify_qp_ex)
MESHFAB_PRIVATE_STUB(ibv_cmd_modify_srq)
MESHFAB_PRIVATE_STUB(ibv_cmd_modify_wq)
MESHFAB_PRIVATE_STUB(ibv_cmd_open_qp)
MESHFAB_PRIVATE_STUB(ibv_cmd_open_xrcd)
MESHFAB_PRIVATE_STUB(ibv_cmd_poll_cq)
MESHFAB_PRIVATE_STUB(ibv_cmd_post_recv)
MESHFAB_PRIVATE_STUB(ibv_cmd_post_send)
MESHFAB_PRIVATE_STUB(ibv_cmd_post_srq_recv)
MESHFAB_PRIVATE_STUB(ibv_cmd_query_context)
MESHFAB_PRIVATE_STUB(ibv_cmd_query_device_any)
MESHFAB_PRIVATE_STUB(ibv_cmd_query_mr)
MESHFAB_PRIVATE_STUB(ibv_cmd_query_port)
MESHFAB_PRIVATE_STUB(ibv_cmd_query_qp)
MESHFAB_PRIVATE_STUB(ibv_cmd_query_srq)
MESHFAB_PRIVATE_STUB(ibv_cmd_read_counters)
MESHFAB_PRIVATE_STUB(ibv_cmd_reg_dm_mr)
MESHFAB_PRIVATE_STUB(ibv_cmd_reg_dmabuf_mr)
MESHFAB_PRIVATE_STUB(ibv_cmd_reg_mr)
MESHFAB_PRIVATE_STUB(ibv_cmd_req_notify_cq)
MESHFAB_PRIVATE_STUB(ibv_cmd_rereg_mr)
MESHFAB_PRIVATE_STUB(ibv_cmd_resize_cq)
#undef MESHFAB_PRIVATE_STUB

}  // extern "C"
