// SPDX-License-Identifier: Apache-2.0
#include "mesh/rdma/qp.h"

#include <arpa/inet.h>
#include <sys/random.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <algorithm>
#include <random>

#include "mesh/discovery/nic_discovery.h"
#include "mesh/platform/log.h"

namespace mesh {

int negotiatedMtu(int localMtu, int peerMtu) { return std::min(localMtu, peerMtu); }

std::string peerMtuNote(int localMtu, int peerMtu) {
  if (localMtu == peerMtu) return "";
  return " peer_mtu=" + std::to_string(mtuToBytes(peerMtu)) + " (differs from ours, " +
         std::to_string(mtuToBytes(localMtu)) +
         ": the smaller is used; give both ends' netdevs the same MTU, 9000 for RoCE MTU 4096)";
}

uint32_t randomPsn() {
  uint32_t v = 0;
  if (getrandom(&v, sizeof(v), 0) != static_cast<ssize_t>(sizeof(v))) {
    std::random_device rd;
    v = rd();
  }
  return v & 0xffffffu;
}

std::string gidText(const uint8_t gid[16]) {
  char buf[INET6_ADDRSTRLEN] = {};
  inet_ntop(AF_INET6, gid, buf, sizeof(buf));
  return buf;
}

// --- CompletionQueue -------------------------------------------------------------------

CompletionQueue::~CompletionQueue() { reset(); }

ncclResult_t CompletionQueue::create(const VerbsDevice* dev, int entries, void* context) {
  reset();
  dev_ = dev;
  int cqe = entries;
  if (dev->attr().max_cqe > 0 && cqe > dev->attr().max_cqe) {
    MESH_WARN("%s: a comm needs a completion queue of %d entries, the device holds at most %d (max_cqe); lower "
              "NCCL_MESH_QPS_PER_CONN", dev->name().c_str(), entries, dev->attr().max_cqe);
    return ncclSystemError;
  }
  cq_ = dev->api().createCq(dev->context(), cqe, context, nullptr, 0);
  if (cq_ == nullptr) {
    int e = errno;
    char hint[200] = "";
    if (e == ENOMEM) {
      snprintf(hint, sizeof(hint),
               "; the device's CQ limit (max_cq %d, max_cqe %d) or locked memory may be "
               "exhausted: check `rdma res show cq` and `ulimit -l`",
               dev->attr().max_cq, dev->attr().max_cqe);
    }
    MESH_WARN("ibv_create_cq(%s, %d entries) failed: %s (errno %d)%s", dev->name().c_str(), cqe,
              strerror(e), e, hint);
    return ncclSystemError;
  }
  entries_ = cqe;
  return ncclSuccess;
}

void CompletionQueue::reset() {
  if (cq_ != nullptr && dev_->api().destroyCq(cq_) != 0) {
    MESH_WARN("ibv_destroy_cq on %s failed: %s", dev_->name().c_str(), strerror(errno));
  }
  cq_ = nullptr;
  entries_ = 0;
}

// --- QueuePair -------------------------------------------------------------------------

QueuePair::~QueuePair() { reset(); }

const std::string& QueuePair::deviceName() const {
  static const std::string kNone = "(none)";
  return dev_ != nullptr ? dev_->name() : kNone;
}

ncclResult_t QueuePair::create(const VerbsDevice* dev, int port, ibv_cq* cq, const QpCaps& caps,
                              void* owner) {
  reset();
  dev_ = dev;
  port_ = port;
  ibv_qp_init_attr init{};
  init.qp_context = owner;
  init.send_cq = cq;
  init.recv_cq = cq;
  init.qp_type = IBV_QPT_RC;
  init.sq_sig_all = 0;  // selective signaling: the data path marks the WRs it needs to see
  init.cap.max_send_wr = static_cast<uint32_t>(caps.maxSendWr);
  init.cap.max_recv_wr = static_cast<uint32_t>(caps.maxRecvWr);
  init.cap.max_send_sge = 1;
  init.cap.max_recv_sge = 1;
  qp_ = dev->api().createQp(dev->pd(), &init);
  if (qp_ == nullptr) {
    int e = errno;
    char hint[240] = "";
    if (e == ENOMEM) {
      snprintf(hint, sizeof(hint),
               "; the device's QP limit (max_qp %d) or locked memory may be exhausted: check "
               "`rdma res show qp` and `ulimit -l`, or lower NCCL_MESH_QPS_PER_CONN",
               dev->attr().max_qp);
    } else if (e == EINVAL) {
      snprintf(hint, sizeof(hint), "; %d send / %d recv WRs may exceed the device's max_qp_wr %d",
               caps.maxSendWr, caps.maxRecvWr, dev->attr().max_qp_wr);
    }
    MESH_WARN("ibv_create_qp on %s:%d failed: %s (errno %d)%s", dev->name().c_str(), port,
              strerror(e), e, hint);
    return ncclSystemError;
  }
  psn_ = randomPsn();
  return ncclSuccess;
}

ncclResult_t QueuePair::modify(ibv_qp_attr* attr, int mask, const char* step) {
  if (dev_->api().modifyQp(qp_, attr, mask) == 0) return ncclSuccess;
  int e = errno;
  MESH_WARN("ibv_modify_qp(%s) failed on %s:%d QPN %u: %s (errno %d); remote QPN %u GID %s, "
            "local GID index %d, MTU %d",
            step, dev_->name().c_str(), port_, qpn(), strerror(e), e, remote_.qpn,
            gidText(remote_.gid).c_str(), remote_.localGidIndex, mtuToBytes(remote_.mtu));
  return ncclSystemError;
}

ncclResult_t QueuePair::toInit() {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_INIT;
  attr.pkey_index = 0;
  attr.port_num = static_cast<uint8_t>(port_);
  attr.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  return modify(&attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, "INIT");
}

ncclResult_t QueuePair::toRtr(const QpRemote& remote, const QpTuning& tuning) {
  remote_ = remote;
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_RTR;
  attr.path_mtu = static_cast<ibv_mtu>(remote.mtu);
  attr.dest_qp_num = remote.qpn;
  attr.rq_psn = remote.psn;
  attr.max_dest_rd_atomic = 1;  // the GPUDirect flush is the only RDMA READ we issue
  attr.min_rnr_timer = 12;
  attr.ah_attr.is_global = 1;   // RoCEv2 is routed by GID
  memcpy(attr.ah_attr.grh.dgid.raw, remote.gid, 16);
  attr.ah_attr.grh.sgid_index = static_cast<uint8_t>(remote.localGidIndex);
  attr.ah_attr.grh.hop_limit = 255;
  attr.ah_attr.grh.traffic_class = static_cast<uint8_t>(tuning.trafficClass);
  attr.ah_attr.sl = static_cast<uint8_t>(tuning.serviceLevel);
  attr.ah_attr.port_num = static_cast<uint8_t>(port_);
  return modify(&attr,
                IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                    IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
                "RTR");
}

ncclResult_t QueuePair::toRts(const QpTuning& tuning) {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_RTS;
  attr.timeout = static_cast<uint8_t>(tuning.timeout);
  attr.retry_cnt = static_cast<uint8_t>(tuning.retryCnt);
  attr.rnr_retry = static_cast<uint8_t>(tuning.rnrRetry);
  attr.sq_psn = psn_;
  attr.max_rd_atomic = 1;
  return modify(&attr,
                IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                    IBV_QP_MAX_QP_RD_ATOMIC,
                "RTS");
}

EceResult QueuePair::queryEce(Ece* out) const {
  if (dev_->api().queryEce == nullptr) return EceResult::Unsupported;
  ibv_ece ece{};
  int rc = dev_->api().queryEce(qp_, &ece);
  if (rc == EOPNOTSUPP || rc == ENOTSUP) return EceResult::Unsupported;
  if (rc != 0) {
    MESH_WARN("ibv_query_ece failed on %s:%d QPN %u: %s (errno %d); NCCL_MESH_IB_ECE_ENABLE=0 connects without ECE",
              dev_->name().c_str(), port_, qpn(), strerror(rc), rc);
    return EceResult::Failed;
  }
  if (ece.comp_mask != 0) {
    MESH_INFO(NCCL_NET, "%s:%d: ibv_query_ece says comp_mask 0x%x, which the handshake cannot carry: no ECE",
              dev_->name().c_str(), port_, ece.comp_mask);
    return EceResult::Unsupported;
  }
  out->vendorId = ece.vendor_id;
  out->options = ece.options;
  return EceResult::Ok;
}

EceResult QueuePair::setEce(const Ece& want) {
  if (dev_->api().setEce == nullptr) return EceResult::Unsupported;
  ibv_ece ece{};
  ece.vendor_id = want.vendorId;
  ece.options = want.options;
  int rc = dev_->api().setEce(qp_, &ece);
  if (rc == EOPNOTSUPP || rc == ENOTSUP) return EceResult::Unsupported;
  if (rc != 0) {
    MESH_WARN("ibv_set_ece(vendor 0x%x, options 0x%x) failed on %s:%d QPN %u: %s (errno %d); "
              "NCCL_MESH_IB_ECE_ENABLE=0 on the connecting node connects without ECE",
              want.vendorId, want.options, dev_->name().c_str(), port_, qpn(), strerror(rc), rc);
    return EceResult::Failed;
  }
  return EceResult::Ok;
}

std::string eceText(const Ece& ece) {
  char buf[32];
  snprintf(buf, sizeof(buf), "0x%x:0x%x", ece.vendorId, ece.options);
  return buf;
}

EceResult probeEce(const VerbsDevice* dev, int port, Ece* out) {
  CompletionQueue cq;  // declared first: destroyed after the QP
  QueuePair qp;
  QpCaps caps;
  caps.maxSendWr = 1;
  caps.maxRecvWr = 1;
  if (cq.create(dev, 1) != ncclSuccess || qp.create(dev, port, cq.get(), caps, nullptr) != ncclSuccess ||
      qp.toInit() != ncclSuccess) {
    return EceResult::Failed;
  }
  return qp.queryEce(out);
}

void QueuePair::toError() {
  if (qp_ == nullptr) return;
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_ERR;
  if (dev_->api().modifyQp(qp_, &attr, IBV_QP_STATE) != 0) {
    MESH_WARN("ibv_modify_qp(ERR) failed on %s:%d QPN %u: %s", dev_->name().c_str(), port_, qpn(),
              strerror(errno));
  }
}

void QueuePair::reset() {
  if (qp_ != nullptr && dev_->api().destroyQp(qp_) != 0) {
    MESH_WARN("ibv_destroy_qp on %s:%d QPN %u failed: %s", dev_->name().c_str(), port_, qpn(),
              strerror(errno));
  }
  qp_ = nullptr;
}

}  // namespace mesh
