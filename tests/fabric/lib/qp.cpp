// SPDX-License-Identifier: Apache-2.0
// RC queue pairs: creation with the device's limits, the state machine with the attribute
// masks the kernel requires for each transition (ib_modify_qp_is_ok), address resolution at
// RTR as RoCE does it (the destination must be reachable from the port), posting with the
// checks a provider makes, and the ibv_qp_ex builder API (ibv_wr_*).
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "fabric.h"

namespace meshfab {

void purgeCqes(Qp* qp);
void freeCq(Fabric* f, Cq* cq);

namespace {

constexpr uint32_t kMaxWr = 16384;
constexpr uint32_t kMaxSge = 32;
constexpr uint32_t kMaxInline = 512;
constexpr int kMaxRdAtomic = 128;

struct Transition {
  ibv_qp_state from, to;
  int required, optional;
};

const Transition kTransitions[] = {
    {IBV_QPS_RESET, IBV_QPS_RESET, 0, 0},
    {IBV_QPS_RESET, IBV_QPS_INIT, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, 0},
    {IBV_QPS_INIT, IBV_QPS_INIT, 0, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS},
    {IBV_QPS_INIT, IBV_QPS_RTR,
     IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
         IBV_QP_MIN_RNR_TIMER,
     IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX},
    {IBV_QPS_RTR, IBV_QPS_RTS,
     IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC,
     IBV_QP_CUR_STATE | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER | IBV_QP_PATH_MIG_STATE},
    {IBV_QPS_RTS, IBV_QPS_RTS, 0,
     IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE | IBV_QP_MIN_RNR_TIMER},
    {IBV_QPS_RTS, IBV_QPS_SQD, 0, IBV_QP_EN_SQD_ASYNC_NOTIFY},
    {IBV_QPS_SQD, IBV_QPS_RTS, 0,
     IBV_QP_CUR_STATE | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER | IBV_QP_PATH_MIG_STATE},
    {IBV_QPS_SQD, IBV_QPS_SQD, 0,
     IBV_QP_AV | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX | IBV_QP_MIN_RNR_TIMER |
         IBV_QP_PATH_MIG_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
         IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_PATH_MTU},
    {IBV_QPS_SQE, IBV_QPS_RTS, 0, IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS},
};

bool transitionOk(ibv_qp_state from, ibv_qp_state to, int mask) {
  int attrs = mask & ~IBV_QP_STATE;
  if (to == IBV_QPS_RESET || to == IBV_QPS_ERR) return attrs == 0 || (mask & IBV_QP_STATE);
  for (const Transition& t : kTransitions) {
    if (t.from == from && t.to == to) {
      return (attrs & t.required) == t.required && (attrs & ~(t.required | t.optional)) == 0;
    }
  }
  return false;
}

// The range checks rdma-core's providers and ib_core make on the values.
int checkValues(const Qp* qp, const ibv_qp_attr* a, int mask) {
  const Port& port = qp->dev->port;
  if ((mask & IBV_QP_PORT) && a->port_num != 1) return EINVAL;
  if ((mask & IBV_QP_PKEY_INDEX) && a->pkey_index != 0) return EINVAL;
  if ((mask & IBV_QP_TIMEOUT) && a->timeout > 31) return EINVAL;
  if ((mask & IBV_QP_RETRY_CNT) && a->retry_cnt > 7) return EINVAL;
  if ((mask & IBV_QP_RNR_RETRY) && a->rnr_retry > 7) return EINVAL;
  if ((mask & IBV_QP_MIN_RNR_TIMER) && a->min_rnr_timer > 31) return EINVAL;
  if ((mask & IBV_QP_MAX_QP_RD_ATOMIC) && a->max_rd_atomic > kMaxRdAtomic) return EINVAL;
  if ((mask & IBV_QP_MAX_DEST_RD_ATOMIC) && a->max_dest_rd_atomic > kMaxRdAtomic) return EINVAL;
  if ((mask & IBV_QP_DEST_QPN) && a->dest_qp_num > 0xffffff) return EINVAL;
  if ((mask & IBV_QP_PATH_MTU) && (a->path_mtu < IBV_MTU_256 || a->path_mtu > port.activeMtu())) return EINVAL;
  if ((mask & IBV_QP_ACCESS_FLAGS) &&
      (a->qp_access_flags & ~(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                              IBV_ACCESS_REMOTE_ATOMIC)) != 0) {
    return EINVAL;
  }
  if (mask & IBV_QP_AV) {
    const ibv_ah_attr& ah = a->ah_attr;
    static const uint8_t zero[16] = {};
    // RoCE has no LIDs: the GRH carries the address.
    if (!ah.is_global || ah.port_num != 1 || ah.grh.sgid_index >= port.gids.size() ||
        memcmp(ah.grh.dgid.raw, zero, 16) == 0) {
      return EINVAL;
    }
  }
  return 0;
}

void applyAttrs(Qp* qp, const ibv_qp_attr* a, int mask) {
  ibv_qp_attr& s = qp->attr;
  if (mask & IBV_QP_PKEY_INDEX) s.pkey_index = a->pkey_index;
  if (mask & IBV_QP_PORT) s.port_num = a->port_num;
  if (mask & IBV_QP_ACCESS_FLAGS) s.qp_access_flags = a->qp_access_flags;
  if (mask & IBV_QP_AV) s.ah_attr = a->ah_attr;
  if (mask & IBV_QP_PATH_MTU) s.path_mtu = a->path_mtu;
  if (mask & IBV_QP_DEST_QPN) s.dest_qp_num = a->dest_qp_num;
  if (mask & IBV_QP_RQ_PSN) {
    s.rq_psn = a->rq_psn & 0xffffff;
    qp->expectedPsn = s.rq_psn;
  }
  if (mask & IBV_QP_MAX_DEST_RD_ATOMIC) s.max_dest_rd_atomic = a->max_dest_rd_atomic;
  if (mask & IBV_QP_MIN_RNR_TIMER) s.min_rnr_timer = a->min_rnr_timer;
  if (mask & IBV_QP_TIMEOUT) s.timeout = a->timeout;
  if (mask & IBV_QP_RETRY_CNT) {
    s.retry_cnt = a->retry_cnt;
    qp->retriesLeft = a->retry_cnt;
  }
  if (mask & IBV_QP_RNR_RETRY) {
    s.rnr_retry = a->rnr_retry;
    qp->rnrRetriesLeft = a->rnr_retry;
  }
  if (mask & IBV_QP_SQ_PSN) {
    s.sq_psn = a->sq_psn & 0xffffff;
    qp->nextPsn = s.sq_psn;
  }
  if (mask & IBV_QP_MAX_QP_RD_ATOMIC) s.max_rd_atomic = a->max_rd_atomic;
  if (mask & IBV_QP_ALT_PATH) {
    s.alt_ah_attr = a->alt_ah_attr;
    s.alt_pkey_index = a->alt_pkey_index;
    s.alt_port_num = a->alt_port_num;
    s.alt_timeout = a->alt_timeout;
  }
  if (mask & IBV_QP_PATH_MIG_STATE) s.path_mig_state = a->path_mig_state;
  if (mask & IBV_QP_EN_SQD_ASYNC_NOTIFY) s.en_sqd_async_notify = a->en_sqd_async_notify;
}

bool isLinkLocal(const uint8_t g[16]) { return g[0] == 0xfe && (g[1] & 0xc0) == 0x80; }

bool ipv4Of(const uint8_t g[16], uint32_t* a) {
  static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  if (memcmp(g, prefix, 12) != 0) return false;
  *a = (uint32_t{g[12]} << 24) | (uint32_t{g[13]} << 16) | (uint32_t{g[14]} << 8) | g[15];
  return true;
}

// Whether `gid` is one of device d's own.
bool ownGid(const Device* d, const uint8_t gid[16]) {
  for (const ibv_gid& g : d->port.gids) {
    if (memcmp(g.raw, gid, 16) == 0) return true;
  }
  return false;
}

}  // namespace

bool gidSubnets(Fabric* f, const uint8_t gid[16], std::vector<Ipv4Net>* nets);

// What the kernel's RoCE address resolution (rdma_addr_find_l2_eth_by_grh) decides at RTR:
// the destination must be on a subnet of the port (there are no routes between cables) and
// answer there (here: registered in the fabric directory by a process that opened it), or
// be this port itself.
bool reachable(Fabric* f, Device* d, const uint8_t dgid[16]) {
  if (ownGid(d, dgid)) return true;
  std::vector<Ipv4Net> theirs;
  uint32_t v4 = 0;
  if (ipv4Of(dgid, &v4)) {
    bool onLink = false;
    for (const Ipv4Net& n : d->port.addrs) onLink = onLink || n.contains(v4);
    return onLink && gidSubnets(f, dgid, &theirs);
  }
  if (!isLinkLocal(dgid) || !gidSubnets(f, dgid, &theirs)) return false;
  for (const Ipv4Net& mine : d->port.addrs) {
    for (const Ipv4Net& t : theirs) {
      if (t.prefix == mine.prefix && mine.contains(t.addr)) return true;
    }
  }
  return false;
}

namespace {

Qp* newQp(Fabric* f, Pd* pd, ibv_qp_init_attr* ia, bool ex) {
  const ibv_qp_cap& c = ia->cap;
  if (ia->qp_type != IBV_QPT_RC) {
    errno = EOPNOTSUPP;  // RC only
    return nullptr;
  }
  if (ia->send_cq == nullptr || ia->recv_cq == nullptr || ia->srq != nullptr || c.max_send_wr > kMaxWr ||
      c.max_recv_wr > kMaxWr || c.max_send_sge > kMaxSge || c.max_recv_sge > kMaxSge ||
      c.max_inline_data > kMaxInline) {
    errno = EINVAL;
    return nullptr;
  }
  auto* qp = new Qp();
  memset(&qp->qpx, 0, sizeof(qp->qpx));
  qp->ctx = pd->ctx;
  qp->dev = pd->ctx->dev;
  qp->pd = pd;
  qp->scq = reinterpret_cast<Cq*>(ia->send_cq);
  qp->rcq = reinterpret_cast<Cq*>(ia->recv_cq);
  qp->cap = c;
  qp->cap.max_send_sge = std::max<uint32_t>(c.max_send_sge, 1);
  qp->cap.max_recv_sge = std::max<uint32_t>(c.max_recv_sge, 1);
  qp->sigAll = ia->sq_sig_all != 0;
  qp->sq.resize(std::max<uint32_t>(c.max_send_wr, 1));
  qp->sqSge.resize(qp->sq.size() * qp->cap.max_send_sge);
  qp->sqInline.resize(qp->sq.size() * c.max_inline_data);
  qp->rq.resize(std::max<uint32_t>(c.max_recv_wr, 1));
  qp->rqSge.resize(qp->rq.size() * qp->cap.max_recv_sge);
  std::string path;
  uint32_t qpn = f->allocQpn(qp->dev, &path);
  if (qpn == 0) {
    delete qp;
    errno = ENOSPC;
    return nullptr;
  }
  qp->regPath = path;
  ibv_qp& q = qp->qpx.qp_base;
  q.context = pd->pd.context;
  q.qp_context = ia->qp_context;
  q.pd = &pd->pd;
  q.send_cq = ia->send_cq;
  q.recv_cq = ia->recv_cq;
  q.handle = qpn;
  q.qp_num = qpn;
  q.state = IBV_QPS_RESET;
  q.qp_type = IBV_QPT_RC;
  pthread_mutex_init(&q.mutex, nullptr);
  pthread_cond_init(&q.cond, nullptr);
  qp->attr.qp_state = IBV_QPS_RESET;
  qp->attr.cap = qp->cap;
  (void)ex;
  f->qps[(uint64_t(qp->dev->index) << 32) | qpn] = qp;
  pd->users++;
  qp->scq->users++;
  qp->rcq->users++;
  f->devStats(qp->dev)->res[kResQp]++;
  return qp;
}

void installExOps(Qp* qp);

}  // namespace

Qp* Fabric::findQp(const Device* d, uint32_t qpn) const {
  auto it = qps.find((uint64_t(d->index) << 32) | qpn);
  return it == qps.end() ? nullptr : it->second;
}

// Frees a QP (caller holds mu; async events for it have been acknowledged).
void freeQp(Fabric* f, Qp* qp) {
  f->forgetQp(qp);
  purgeCqes(qp);
  for (Context* c : qp->dev->contexts) {
    auto& q = c->events;
    q.erase(std::remove_if(q.begin(), q.end(), [qp](const ibv_async_event& ev) {
              return ev.element.qp == qp->ibv() && ev.event_type != IBV_EVENT_PORT_ERR &&
                     ev.event_type != IBV_EVENT_PORT_ACTIVE && ev.event_type != IBV_EVENT_CQ_ERR &&
                     ev.event_type != IBV_EVENT_DEVICE_FATAL;
            }),
            q.end());
  }
  unlink(qp->regPath.c_str());
  f->qps.erase((uint64_t(qp->dev->index) << 32) | qp->qpn());
  qp->pd->users--;
  qp->scq->users--;
  qp->rcq->users--;
  f->devStats(qp->dev)->res[kResQp]--;
  pthread_mutex_destroy(&qp->ibv()->mutex);
  pthread_cond_destroy(&qp->ibv()->cond);
  delete qp;
}

// ibv_close_device with objects still open: release them as the kernel would.
void closeContextObjects(Fabric* f, Context* c) {
  std::vector<Qp*> qps;
  for (auto& kv : f->qps) {
    if (kv.second->ctx == c) qps.push_back(kv.second);
  }
  for (Qp* qp : qps) freeQp(f, qp);
  std::vector<Cq*> cqs;
  for (Cq* cq : f->cqs) {
    if (cq->ctx == c) cqs.push_back(cq);
  }
  for (Cq* cq : cqs) freeCq(f, cq);
  std::vector<Mr*> mrs;
  for (auto& kv : f->mrs) {
    if (kv.second->pd->ctx == c) mrs.push_back(kv.second);
  }
  for (Mr* mr : mrs) {
    f->forgetMr(mr);
    delete mr;
  }
}

// --- posting ------------------------------------------------------------------------------------

int postSend(ibv_qp* iqp, ibv_send_wr* wr, ibv_send_wr** bad) {
  Fabric* f = Fabric::get();
  Qp* qp = reinterpret_cast<Qp*>(iqp);
  std::lock_guard<std::mutex> lk(f->mu);
  ibv_qp_state st = qp->state();
  bool any = false;
  for (; wr != nullptr; wr = wr->next) {
    int err = 0;
    if (st == IBV_QPS_RESET || st == IBV_QPS_INIT || st == IBV_QPS_RTR) err = EINVAL;
    else if (wr->num_sge < 0 || static_cast<uint32_t>(wr->num_sge) > qp->cap.max_send_sge) err = EINVAL;
    else if (qp->sqHead - qp->sqFree >= qp->cap.max_send_wr) err = ENOMEM;
    switch (wr->opcode) {
      case IBV_WR_RDMA_WRITE:
      case IBV_WR_RDMA_WRITE_WITH_IMM:
      case IBV_WR_SEND:
      case IBV_WR_SEND_WITH_IMM:
      case IBV_WR_RDMA_READ: break;
      default: err = err ? err : EINVAL;  // atomics, invalidate, bind, TSO: not emulated
    }
    uint64_t len = 0;
    for (int i = 0; i < wr->num_sge && err == 0; ++i) len += wr->sg_list[i].length;
    bool inl = (wr->send_flags & IBV_SEND_INLINE) && wr->opcode != IBV_WR_RDMA_READ;
    if (err == 0 && inl && len > qp->cap.max_inline_data) err = EINVAL;
    if (err != 0) {
      *bad = wr;
      if (any) f->scheduleTx(qp);
      return err;
    }
    uint64_t idx = qp->sqHead++;
    SendWqe& w = qp->swqe(idx);
    w = SendWqe();
    w.wrId = wr->wr_id;
    w.opcode = wr->opcode;
    w.signaled = (wr->send_flags & IBV_SEND_SIGNALED) != 0;
    w.solicited = (wr->send_flags & IBV_SEND_SOLICITED) != 0;
    w.inlined = inl;
    w.imm = wr->imm_data;
    w.raddr = wr->wr.rdma.remote_addr;
    w.rkey = wr->wr.rdma.rkey;
    w.nsge = static_cast<uint32_t>(wr->num_sge);
    w.len = len;
    if (inl) {
      uint8_t* p = qp->inlineData(idx);
      for (int i = 0; i < wr->num_sge; ++i) {
        memcpy(p, reinterpret_cast<void*>(wr->sg_list[i].addr), wr->sg_list[i].length);
        p += wr->sg_list[i].length;
      }
    } else {
      std::copy(wr->sg_list, wr->sg_list + wr->num_sge, qp->sges(idx));
    }
    uint64_t mtu = 128u << qp->attr.path_mtu;
    w.npsn = static_cast<uint32_t>(std::max<uint64_t>(1, (len + mtu - 1) / mtu));
    w.psn = qp->nextPsn;
    qp->nextPsn = psnAdd(qp->nextPsn, w.npsn);
    any = true;
    if (st == IBV_QPS_ERR) {  // posted to a QP in error: completed at once, flushed
      f->completeSend(qp, idx, IBV_WC_WR_FLUSH_ERR);
      qp->sqDone = qp->txIdx = qp->sqHead;
    }
  }
  if (any && st == IBV_QPS_RTS) f->scheduleTx(qp);
  return 0;
}

int postRecv(ibv_qp* iqp, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  Fabric* f = Fabric::get();
  Qp* qp = reinterpret_cast<Qp*>(iqp);
  std::lock_guard<std::mutex> lk(f->mu);
  for (; wr != nullptr; wr = wr->next) {
    int err = 0;
    if (qp->state() == IBV_QPS_RESET) err = EINVAL;
    else if (wr->num_sge < 0 || static_cast<uint32_t>(wr->num_sge) > qp->cap.max_recv_sge) err = EINVAL;
    else if (qp->rqHead - qp->rqFree >= qp->cap.max_recv_wr) err = ENOMEM;
    if (err != 0) {
      *bad = wr;
      return err;
    }
    uint64_t idx = qp->rqHead++;
    RecvWqe& r = qp->rwqe(idx);
    r.wrId = wr->wr_id;
    r.nsge = static_cast<uint32_t>(wr->num_sge);
    std::copy(wr->sg_list, wr->sg_list + wr->num_sge, qp->rsges(idx));
    if (qp->state() == IBV_QPS_ERR) {
      f->completeRecv(qp, idx, IBV_WC_WR_FLUSH_ERR, 0, IBV_WC_RECV, false, 0, false);
      qp->rqNext = qp->rqHead;
    }
  }
  return 0;
}

ibv_qp* createQpEx(ibv_context* ctx, ibv_qp_init_attr_ex* ax) {
  const uint32_t known = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
  const uint64_t ops = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_SEND |
                       IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_READ;
  if ((ax->comp_mask & ~known) != 0 || !(ax->comp_mask & IBV_QP_INIT_ATTR_PD) ||
      ((ax->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) && (ax->send_ops_flags & ~ops) != 0)) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  Fabric* f = Fabric::get();
  Pd* pd = reinterpret_cast<Pd*>(ax->pd);
  if (pd->pd.context != ctx) {
    errno = EINVAL;
    return nullptr;
  }
  ibv_qp_init_attr ia{};
  ia.qp_context = ax->qp_context;
  ia.send_cq = ax->send_cq;
  ia.recv_cq = ax->recv_cq;
  ia.srq = ax->srq;
  ia.cap = ax->cap;
  ia.qp_type = ax->qp_type;
  ia.sq_sig_all = ax->sq_sig_all;
  std::lock_guard<std::mutex> lk(f->mu);
  Qp* qp = newQp(f, pd, &ia, true);
  if (qp == nullptr) return nullptr;
  ax->cap = qp->cap;
  installExOps(qp);
  return qp->ibv();
}

// --- ibv_qp_ex: WRs are built in the QP and posted at wr_complete --------------------------------
namespace {

Qp* exQp(ibv_qp_ex* x) { return reinterpret_cast<Qp*>(x); }

void exNew(ibv_qp_ex* x, ibv_wr_opcode op, uint32_t rkey, uint64_t raddr, uint32_t imm) {
  Qp* qp = exQp(x);
  ibv_send_wr w{};
  w.wr_id = x->wr_id;
  w.send_flags = x->wr_flags;
  w.opcode = op;
  w.wr.rdma.rkey = rkey;
  w.wr.rdma.remote_addr = raddr;
  w.imm_data = imm;
  qp->exWrs.push_back(w);
  qp->exSges.push_back(ibv_sge{});  // exSges[i] is WR i's SGE (one at most in this builder)
  qp->exInline.emplace_back();
}

void exSge(ibv_qp_ex* x, uint32_t lkey, uint64_t addr, uint32_t len) {
  Qp* qp = exQp(x);
  if (qp->exWrs.empty()) {
    qp->exError = EINVAL;
    return;
  }
  qp->exWrs.back().num_sge = 1;
  qp->exSges.back() = {addr, len, lkey};
}

void installExOps(Qp* qp) {
  ibv_qp_ex& x = qp->qpx;
  x.comp_mask = 0;
  x.wr_rdma_write = [](ibv_qp_ex* q, uint32_t rkey, uint64_t raddr) { exNew(q, IBV_WR_RDMA_WRITE, rkey, raddr, 0); };
  x.wr_rdma_write_imm = [](ibv_qp_ex* q, uint32_t rkey, uint64_t raddr, __be32 imm) {
    exNew(q, IBV_WR_RDMA_WRITE_WITH_IMM, rkey, raddr, imm);
  };
  x.wr_rdma_read = [](ibv_qp_ex* q, uint32_t rkey, uint64_t raddr) { exNew(q, IBV_WR_RDMA_READ, rkey, raddr, 0); };
  x.wr_send = [](ibv_qp_ex* q) { exNew(q, IBV_WR_SEND, 0, 0, 0); };
  x.wr_send_imm = [](ibv_qp_ex* q, __be32 imm) { exNew(q, IBV_WR_SEND_WITH_IMM, 0, 0, imm); };
  x.wr_set_sge = exSge;
  x.wr_set_sge_list = [](ibv_qp_ex* q, size_t n, const ibv_sge* l) {
    Qp* p = exQp(q);
    if (p->exWrs.empty() || n > 1) {  // one SGE per WR in this builder
      p->exError = EINVAL;
      return;
    }
    if (n == 1) exSge(q, l[0].lkey, l[0].addr, l[0].length);
  };
  x.wr_set_inline_data = [](ibv_qp_ex* q, void* addr, size_t len) {
    Qp* p = exQp(q);
    if (p->exWrs.empty()) {
      p->exError = EINVAL;
      return;
    }
    auto* b = static_cast<uint8_t*>(addr);
    p->exInline.back().assign(b, b + len);
    p->exWrs.back().send_flags |= IBV_SEND_INLINE;
  };
  x.wr_start = [](ibv_qp_ex* q) {
    Qp* p = exQp(q);
    p->exWrs.clear();
    p->exSges.clear();
    p->exInline.clear();
    p->exError = 0;
  };
  x.wr_abort = [](ibv_qp_ex* q) {
    Qp* p = exQp(q);
    p->exWrs.clear();
    p->exSges.clear();
    p->exInline.clear();
  };
  x.wr_complete = [](ibv_qp_ex* q) -> int {
    Qp* p = exQp(q);
    if (p->exError != 0) return p->exError;
    if (p->exWrs.empty()) return 0;
    std::vector<ibv_sge> inl(p->exWrs.size());
    for (size_t i = 0; i < p->exWrs.size(); ++i) {
      ibv_send_wr& w = p->exWrs[i];
      w.next = i + 1 < p->exWrs.size() ? &p->exWrs[i + 1] : nullptr;
      if (!p->exInline[i].empty()) {
        inl[i] = {reinterpret_cast<uintptr_t>(p->exInline[i].data()), static_cast<uint32_t>(p->exInline[i].size()), 0};
        w.sg_list = &inl[i];
        w.num_sge = 1;
      } else {
        w.sg_list = &p->exSges[i];
      }
    }
    ibv_send_wr* bad = nullptr;
    int rc = postSend(&q->qp_base, p->exWrs.data(), &bad);
    p->exWrs.clear();
    p->exSges.clear();
    p->exInline.clear();
    return rc;
  };
}

}  // namespace

}  // namespace meshfab

using namespace meshfab;

extern "C" {

ibv_qp* ibv_create_qp(ibv_pd* ipd, ibv_qp_init_attr* ia) {
  Fabric* f = Fabric::get();
  std::lock_guard<std::mutex> lk(f->mu);
  Qp* qp = newQp(f, reinterpret_cast<Pd*>(ipd), ia, false);
  if (qp == nullptr) return nullptr;
  ia->cap = qp->cap;
  installExOps(qp);
  return qp->ibv();
}

ibv_qp_ex* ibv_qp_to_qp_ex(ibv_qp* qp) { return &reinterpret_cast<Qp*>(qp)->qpx; }

int ibv_query_qp(ibv_qp* iqp, ibv_qp_attr* attr, int, ibv_qp_init_attr* init) {
  Fabric* f = Fabric::get();
  Qp* qp = reinterpret_cast<Qp*>(iqp);
  std::lock_guard<std::mutex> lk(f->mu);
  *attr = qp->attr;
  attr->qp_state = qp->state();
  attr->cur_qp_state = qp->state();
  attr->cap = qp->cap;
  attr->sq_psn = qp->nextPsn;
  attr->rq_psn = qp->expectedPsn;
  if (init != nullptr) {
    memset(init, 0, sizeof(*init));
    init->qp_context = iqp->qp_context;
    init->send_cq = iqp->send_cq;
    init->recv_cq = iqp->recv_cq;
    init->cap = qp->cap;
    init->qp_type = IBV_QPT_RC;
    init->sq_sig_all = qp->sigAll;
  }
  return 0;
}

int ibv_modify_qp(ibv_qp* iqp, ibv_qp_attr* attr, int mask) {
  Fabric* f = Fabric::get();
  Qp* qp = reinterpret_cast<Qp*>(iqp);
  std::unique_lock<std::mutex> lk(f->mu);
  ibv_qp_state from = qp->state();
  ibv_qp_state to = (mask & IBV_QP_STATE) ? attr->qp_state : from;
  if ((mask & IBV_QP_CUR_STATE) && attr->cur_qp_state != from) return EINVAL;
  if (!transitionOk(from, to, mask)) return EINVAL;
  if (int rc = checkValues(qp, attr, mask)) return rc;
  if (mask & IBV_QP_AV) {
    // RoCE address resolution: the kernel fails at once without a usable port, and after
    // its 1 s resolution timeout when nothing answers for the destination on this port.
    if (!qp->dev->port.up) return ENETUNREACH;
    if (!reachable(f, qp->dev, attr->ah_attr.grh.dgid.raw)) {
      int ms = f->settings.resolveMs;
      trace("QPN %u: RTR: destination not reachable from %s; failing after %d ms", qp->qpn(),
            qp->dev->port.netdev.c_str(), ms);
      lk.unlock();
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));
      return ETIMEDOUT;
    }
    // Behind a switch, what it sends is held to the destination's port too (pace.h); a QP to
    // its own port (a loopback, the GPUDirect flush's) never reaches the switch.
    uint32_t v4 = 0;
    const uint8_t* dgid = attr->ah_attr.grh.dgid.raw;
    qp->inbound = !ownGid(qp->dev, dgid) && ipv4Of(dgid, &v4) ? f->inboundPacer(v4) : nullptr;
    qp->inboundSlot = qp->respInboundSlot = 0;  // a slot at an earlier destination is not this one's
  }
  applyAttrs(qp, attr, mask);
  qp->eceCleared = false;
  if (to != from) {
    if (to == IBV_QPS_RESET) {
      f->qpReset(qp);
    } else if (to == IBV_QPS_ERR) {
      f->qpError(qp);
    } else {
      qp->ibv()->state = to;
      qp->attr.qp_state = to;
      if (to == IBV_QPS_RTS) f->scheduleTx(qp);
    }
  }
  return 0;
}

// ECE as mlx5 answers it (rdma-core providers/mlx5; MESHFAB_ECE, fabric.h): a QP offers the
// device's options until it is set; a set before RTR names options, and from RTR on the QP
// uses and reports them ANDed with its own; between a set and the next modify a query reads
// options 0 (mlx5 clears what it last returned). A set naming another vendor, a comp_mask, or a
// set after RTR is EINVAL. MESHFAB_ECE=off: both calls answer EOPNOTSUPP, as rxe does.
int ibv_query_ece(ibv_qp* iqp, ibv_ece* ece) {
  Fabric* f = Fabric::get();
  Qp* qp = reinterpret_cast<Qp*>(iqp);
  if (!f->settings.ece) return EOPNOTSUPP;
  std::lock_guard<std::mutex> lk(f->mu);
  bool settled = qp->eceSet && qp->state() != IBV_QPS_RESET && qp->state() != IBV_QPS_INIT;
  ece->vendor_id = f->settings.eceVendor;
  ece->options = qp->eceCleared ? 0 : settled ? qp->eceOptions & f->settings.eceOptions : f->settings.eceOptions;
  ece->comp_mask = 0;
  return 0;
}

int ibv_set_ece(ibv_qp* iqp, ibv_ece* ece) {
  Fabric* f = Fabric::get();
  Qp* qp = reinterpret_cast<Qp*>(iqp);
  if (!f->settings.ece) return EOPNOTSUPP;
  std::lock_guard<std::mutex> lk(f->mu);
  if (ece->vendor_id != f->settings.eceVendor || ece->comp_mask != 0) return EINVAL;
  if (qp->state() != IBV_QPS_RESET && qp->state() != IBV_QPS_INIT) return EINVAL;
  qp->eceSet = true;
  qp->eceOptions = ece->options;
  qp->eceCleared = true;
  return 0;
}

int ibv_destroy_qp(ibv_qp* iqp) {
  Fabric* f = Fabric::get();
  Qp* qp = reinterpret_cast<Qp*>(iqp);
  std::unique_lock<std::mutex> lk(f->mu);
  f->cv.wait(lk, [qp] { return qp->asyncOut == 0; });  // as rdma-core: every read event acked
  freeQp(f, qp);
  return 0;
}

}  // extern "C"
