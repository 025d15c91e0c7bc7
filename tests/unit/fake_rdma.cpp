// SPDX-License-Identifier: Apache-2.0
// The fake RDMA devices and wire of fake_rdma.h.
#include "fake_rdma.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace mesh {
namespace fake {
namespace {

FakeRdma* gFake = nullptr;

FakeRdma& F() {
  if (gFake == nullptr) abort();  // a verbs call with no FakeRdma alive: a test bug
  return *gFake;
}

// --- control calls ------------------------------------------------------------------------

int queryDevice(ibv_context*, ibv_device_attr* attr) {
  *attr = ibv_device_attr{};
  attr->max_qp = 4096;
  attr->max_qp_wr = 16384;
  attr->max_cq = 4096;
  attr->max_cqe = 1 << 20;
  attr->max_sge = 4;
  attr->phys_port_cnt = 1;
  attr->node_guid = 0x1122334455667788ull;
  return 0;
}

int closeDevice(ibv_context* ctx) {
  auto it = F().devices_.find(ctx);
  if (it == F().devices_.end()) return EINVAL;
  for (const auto& pd : it->second->pds) {
    if (pd != nullptr) ADD_FAILURE() << "ibv_close_device(" << it->second->name << ") with a PD still allocated";
  }
  F().event("close_device " + it->second->name);
  F().devices_.erase(it);
  return 0;
}

ibv_pd* allocPd(ibv_context* ctx) {
  auto it = F().devices_.find(ctx);
  if (it == F().devices_.end()) return nullptr;
  auto pd = std::make_unique<ibv_pd>();
  pd->context = ctx;
  ibv_pd* raw = pd.get();
  it->second->pds.push_back(std::move(pd));
  F().event("alloc_pd " + it->second->name);
  return raw;
}

int deallocPd(ibv_pd* pd) {
  FakeRdma& f = F();
  auto dev = f.devices_.find(pd->context);
  if (dev == f.devices_.end()) return EINVAL;
  for (const auto& kv : f.qps_) {
    if (kv.second->qp.pd == pd) {
      errno = EBUSY;
      return EBUSY;
    }
  }
  for (const auto& kv : f.mrs_) {
    if (kv.second->mr.pd == pd) {
      errno = EBUSY;
      return EBUSY;
    }
  }
  for (auto& p : dev->second->pds) {
    if (p.get() == pd) p.reset();
  }
  f.event("dealloc_pd " + dev->second->name);
  return 0;
}

ibv_mr* regMr(ibv_pd* pd, void* addr, size_t len, int access) {
  FakeRdma& f = F();
  auto m = std::make_unique<FakeRdma::Mr>();
  m->mr.context = pd->context;
  m->mr.pd = pd;
  m->mr.addr = addr;
  m->mr.length = len;
  m->mr.lkey = f.nextKey_++;
  m->mr.rkey = m->mr.lkey | 0x80000000u;  // distinct from every lkey
  m->device = f.deviceOf(pd->context);
  (void)access;
  ibv_mr* raw = &m->mr;
  f.event("reg_mr " + m->device + " " + std::to_string(m->mr.lkey));
  f.mrs_[m->mr.lkey] = std::move(m);
  return raw;
}

int deregMr(ibv_mr* mr) {
  FakeRdma& f = F();
  auto it = f.mrs_.find(mr->lkey);
  if (it == f.mrs_.end() || &it->second->mr != mr) return EINVAL;
  // A queued WR that still names this MR would read or write freed memory on hardware.
  for (const auto& kv : f.qps_) {
    for (const FakeRdma::Wr& wr : kv.second->sq) {
      for (const ibv_sge& s : wr.sges) {
        if (s.lkey == mr->lkey) ADD_FAILURE() << "ibv_dereg_mr of an MR a queued WR still uses (QPN " << kv.first << ")";
      }
    }
  }
  f.event("dereg_mr " + it->second->device + " " + std::to_string(mr->lkey));
  f.mrs_.erase(it);
  return 0;
}

ibv_cq* createCq(ibv_context* ctx, int cqe, void*, ibv_comp_channel*, int) {
  FakeRdma& f = F();
  auto c = std::make_unique<FakeRdma::Cq>();
  c->cq.context = ctx;
  c->cq.cqe = cqe;
  ibv_cq* raw = &c->cq;
  f.cqs_[raw] = std::move(c);
  f.event("create_cq " + f.deviceOf(ctx));
  return raw;
}

int destroyCq(ibv_cq* cq) {
  FakeRdma& f = F();
  auto it = f.cqs_.find(cq);
  if (it == f.cqs_.end()) return EINVAL;
  for (const auto& kv : f.qps_) {
    if (kv.second->qp.send_cq == cq || kv.second->qp.recv_cq == cq) {
      errno = EBUSY;
      return EBUSY;
    }
  }
  f.event("destroy_cq " + f.deviceOf(cq->context));
  f.cqs_.erase(it);
  return 0;
}

ibv_qp* createQp(ibv_pd* pd, ibv_qp_init_attr* init) {
  FakeRdma& f = F();
  auto q = std::make_unique<FakeRdma::Qp>();
  q->qp.context = pd->context;
  q->qp.pd = pd;
  q->qp.qp_context = init->qp_context;
  q->qp.send_cq = init->send_cq;
  q->qp.recv_cq = init->recv_cq;
  q->qp.qp_type = init->qp_type;
  q->qp.qp_num = f.nextQpn_++;
  q->qp.state = IBV_QPS_RESET;
  q->device = f.deviceOf(pd->context);
  q->maxSend = static_cast<int>(init->cap.max_send_wr);
  q->maxRecv = static_cast<int>(init->cap.max_recv_wr);
  ibv_qp* raw = &q->qp;
  f.event("create_qp " + q->device + " " + std::to_string(raw->qp_num));
  f.qps_[raw->qp_num] = std::move(q);
  return raw;
}

int modifyQp(ibv_qp* qp, ibv_qp_attr* attr, int mask) {
  FakeRdma& f = F();
  FakeRdma::Qp* q = f.qpOf(qp);
  if (q == nullptr || !(mask & IBV_QP_STATE)) return EINVAL;
  if (attr->qp_state == IBV_QPS_INIT && (mask & IBV_QP_PORT)) q->port = attr->port_num;
  if (attr->qp_state == IBV_QPS_RTR) {
    q->dest = attr->dest_qp_num;
    q->trafficClass = attr->ah_attr.grh.traffic_class;
    q->serviceLevel = attr->ah_attr.sl;
    auto ece = f.ece_.find(q->device);
    if (ece != f.ece_.end() && q->eceSet) q->eceAtRtr = q->eceOptions & ece->second.caps;
  }
  q->state = attr->qp_state;
  qp->state = attr->qp_state;
  if (attr->qp_state == IBV_QPS_ERR) {
    f.event("qp_err " + std::to_string(qp->qp_num));
    f.toError(q);
  }
  return 0;
}

int queryEce(ibv_qp* qp, ibv_ece* out) {
  FakeRdma& f = F();
  FakeRdma::Qp* q = f.qpOf(qp);
  if (q == nullptr) return EINVAL;
  auto it = f.ece_.find(q->device);
  if (it == f.ece_.end()) return EOPNOTSUPP;
  out->vendor_id = it->second.vendor;
  out->options = q->state >= IBV_QPS_RTR && q->eceSet ? q->eceOptions & it->second.caps : it->second.caps;
  out->comp_mask = 0;
  return 0;
}

int setEce(ibv_qp* qp, ibv_ece* ece) {
  FakeRdma& f = F();
  FakeRdma::Qp* q = f.qpOf(qp);
  if (q == nullptr) return EINVAL;
  auto it = f.ece_.find(q->device);
  if (it == f.ece_.end()) return EOPNOTSUPP;
  ++q->eceSets;
  if (it->second.setErrno != 0) return it->second.setErrno;
  if (ece->vendor_id != it->second.vendor || ece->comp_mask != 0) return EINVAL;
  q->eceSet = true;
  q->eceOptions = ece->options;
  return 0;
}

int destroyQp(ibv_qp* qp) {
  FakeRdma& f = F();
  auto it = f.qps_.find(qp->qp_num);
  if (it == f.qps_.end() || &it->second->qp != qp) return EINVAL;
  f.event("destroy_qp " + std::to_string(qp->qp_num));
  int unpolled = static_cast<int>(it->second->sq.size() + it->second->rq.size());
  for (const auto& kv : f.cqs_) {
    for (const ibv_wc& wc : kv.second->wcs) unpolled += wc.qp_num == qp->qp_num ? 1 : 0;
  }
  f.unpolledAtDestroy_[qp->qp_num] = unpolled;
  f.qps_.erase(it);
  return 0;
}

int queryGid(ibv_context* ctx, uint8_t, int index, ibv_gid* gid) {
  memset(gid, 0, sizeof(*gid));
  FakeRdma::Device* d = F().deviceByContext(ctx);
  if (d == nullptr) return 0;
  auto it = d->gids.find(index);
  if (it != d->gids.end()) *gid = it->second.gid;
  return 0;
}

int queryGidEx(ibv_context* ctx, uint32_t port, uint32_t index, ibv_gid_entry* entry, uint32_t flags, size_t size) {
  if (flags != 0 || size < sizeof(ibv_gid_entry) || port != 1) return EINVAL;
  FakeRdma::Device* d = F().deviceByContext(ctx);
  if (d == nullptr) return EINVAL;
  auto it = d->gids.find(static_cast<int>(index));
  if (it == d->gids.end()) return ENODATA;
  *entry = it->second;
  return 0;
}

ssize_t queryGidTable(ibv_context* ctx, ibv_gid_entry* entries, size_t max, uint32_t flags, size_t size) {
  if (flags != 0 || size < sizeof(ibv_gid_entry)) return -EINVAL;
  // As rdma-core: the buffer's length travels in a 16-bit ioctl attribute, and a longer one
  // fails with EINVAL before the kernel is asked (libibverbs/cmd_ioctl.h fill_attr_out).
  if (max > UINT16_MAX / size) return -EINVAL;
  FakeRdma::Device* d = F().deviceByContext(ctx);
  if (d == nullptr) return -EINVAL;
  if (max < d->gids.size()) return -EINVAL;
  ssize_t n = 0;
  for (const auto& kv : d->gids) entries[n++] = kv.second;
  return n;
}

int queryPort(ibv_context*, uint8_t port, ibv_port_attr* attr) {
  if (port != 1) return EINVAL;
  memset(attr, 0, sizeof(*attr));
  attr->state = IBV_PORT_ACTIVE;
  attr->active_mtu = IBV_MTU_4096;
  attr->gid_tbl_len = F().gidTableLen;
  return 0;
}

const char* wcStatusStr(ibv_wc_status status) {
  switch (status) {
    case IBV_WC_SUCCESS: return "success";
    case IBV_WC_WR_FLUSH_ERR: return "Work Request Flushed Error";
    case IBV_WC_REM_ACCESS_ERR: return "remote access error";
    case IBV_WC_LOC_PROT_ERR: return "local protection error";
    default: return "fake error";
  }
}

// --- data path ------------------------------------------------------------------------------

int postSend(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) {
  FakeRdma& f = F();
  FakeRdma::Qp* q = f.qpOf(qp);
  if (q == nullptr) return EINVAL;
  int accept = f.postAcceptsThenRefuses;
  f.postAcceptsThenRefuses = -1;
  for (ibv_send_wr* w = wr; w != nullptr; w = w->next) {
    if (accept >= 0 && accept-- == 0) {
      *bad = w;
      return EINVAL;  // the test's refusal (postAcceptsThenRefuses)
    }
    if (static_cast<int>(q->sq.size()) >= q->maxSend) {
      *bad = w;
      return ENOMEM;  // the send queue is full: the caller's credits were wrong
    }
    FakeRdma::Wr copy;
    copy.wrId = w->wr_id;
    copy.opcode = w->opcode;
    copy.signaled = (w->send_flags & IBV_SEND_SIGNALED) != 0;
    ++f.posted_[q->qp.qp_num];
    if (copy.signaled) ++f.signaledPosted_[q->qp.qp_num];
    copy.immData = w->imm_data;
    copy.remoteAddr = w->wr.rdma.remote_addr;
    copy.rkey = w->wr.rdma.rkey;
    for (int i = 0; i < w->num_sge; ++i) copy.sges.push_back(w->sg_list[i]);
    q->sq.push_back(copy);
  }
  if (q->state == IBV_QPS_ERR) f.toError(q);
  return 0;
}

int postRecv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  FakeRdma::Qp* q = F().qpOf(qp);
  if (q == nullptr) return EINVAL;
  for (ibv_recv_wr* w = wr; w != nullptr; w = w->next) {
    if (static_cast<int>(q->rq.size()) >= q->maxRecv) {
      *bad = w;
      return ENOMEM;
    }
    q->rq.push_back(w->wr_id);
  }
  return 0;
}

int pollCq(ibv_cq* cq, int n, ibv_wc* wc) {
  FakeRdma::Cq* c = F().cqOf(cq);
  if (c == nullptr) return -1;
  ++F().polls_;
  int got = 0;
  while (got < n && !c->wcs.empty()) {
    wc[got++] = c->wcs.front();
    c->wcs.pop_front();
  }
  return got;
}

}  // namespace

// --- FakeRdma -------------------------------------------------------------------------------

FakeRdma::FakeRdma() {
  if (gFake != nullptr) abort();
  gFake = this;
  api_.closeDevice = closeDevice;
  api_.queryDevice = queryDevice;
  api_.queryGid = queryGid;
  api_.queryGidEx = queryGidEx;
  api_.queryGidTable = queryGidTable;
  api_.queryPort = queryPort;
  api_.allocPd = allocPd;
  api_.deallocPd = deallocPd;
  api_.regMr = regMr;
  api_.deregMr = deregMr;
  api_.createCq = createCq;
  api_.destroyCq = destroyCq;
  api_.createQp = createQp;
  api_.modifyQp = modifyQp;
  api_.destroyQp = destroyQp;
  api_.queryEce = queryEce;
  api_.setEce = setEce;
  api_.wcStatusStr = wcStatusStr;
  ops_ = DataOps{postSend, postRecv, pollCq};
}

FakeRdma::~FakeRdma() { gFake = nullptr; }

ibv_context* FakeRdma::openDevice(const std::string& name) {
  auto d = std::make_unique<Device>();
  d->name = name;
  ibv_context* raw = &d->ctx;
  devices_[raw] = std::move(d);
  return raw;
}

FakeRdma::Device* FakeRdma::deviceByContext(ibv_context* ctx) {
  auto it = devices_.find(ctx);
  return it == devices_.end() ? nullptr : it->second.get();
}

void FakeRdma::setGid(const std::string& device, int index, const uint8_t gid[16], bool rocev2) {
  for (auto& kv : devices_) {
    if (kv.second->name != device) continue;
    ibv_gid_entry e{};
    memcpy(e.gid.raw, gid, 16);
    e.gid_index = static_cast<uint32_t>(index);
    e.port_num = 1;
    e.gid_type = rocev2 ? IBV_GID_TYPE_ROCE_V2 : IBV_GID_TYPE_ROCE_V1;
    kv.second->gids[index] = e;
  }
}

void FakeRdma::clearGid(const std::string& device, int index) {
  for (auto& kv : devices_) {
    if (kv.second->name == device) kv.second->gids.erase(index);
  }
}

const std::string& FakeRdma::deviceOf(const ibv_context* ctx) const {
  static const std::string kUnknown = "?";
  auto it = devices_.find(const_cast<ibv_context*>(ctx));
  return it == devices_.end() ? kUnknown : it->second->name;
}

FakeRdma::Qp* FakeRdma::qpOf(const ibv_qp* qp) {
  Qp* q = qpByNumber(qp->qp_num);
  return q != nullptr && &q->qp == qp ? q : nullptr;
}

FakeRdma::Qp* FakeRdma::qpByNumber(uint32_t qpn) {
  auto it = qps_.find(qpn);
  return it == qps_.end() ? nullptr : it->second.get();
}

FakeRdma::Cq* FakeRdma::cqOf(const ibv_cq* cq) {
  auto it = cqs_.find(const_cast<ibv_cq*>(cq));
  return it == cqs_.end() ? nullptr : it->second.get();
}

const FakeRdma::Mr* FakeRdma::mrByKey(uint32_t key, bool remote) const {
  for (const auto& kv : mrs_) {
    if ((remote ? kv.second->mr.rkey : kv.second->mr.lkey) == key) return kv.second.get();
  }
  return nullptr;
}

void FakeRdma::complete(Qp* q, const Wr& wr, ibv_wc_status status) {
  Cq* c = cqOf(q->qp.send_cq);
  if (c == nullptr) return;
  ibv_wc wc{};
  wc.wr_id = wr.wrId;
  wc.status = status;
  wc.qp_num = q->qp.qp_num;
  wc.opcode = wr.opcode == IBV_WR_RDMA_READ ? IBV_WC_RDMA_READ : IBV_WC_RDMA_WRITE;
  c->wcs.push_back(wc);
}

// Everything queued completes as flushed: send WRs on the send CQ, receive WRs on the
// receive CQ, whether they were signaled or not.
void FakeRdma::toError(Qp* q) {
  q->state = IBV_QPS_ERR;
  q->qp.state = IBV_QPS_ERR;
  while (!q->sq.empty()) {
    complete(q, q->sq.front(), IBV_WC_WR_FLUSH_ERR);
    q->sq.pop_front();
  }
  Cq* rc = cqOf(q->qp.recv_cq);
  while (!q->rq.empty()) {
    ibv_wc wc{};
    wc.wr_id = q->rq.front();
    wc.status = IBV_WC_WR_FLUSH_ERR;
    wc.qp_num = q->qp.qp_num;
    wc.opcode = IBV_WC_RECV;
    if (rc != nullptr) rc->wcs.push_back(wc);
    q->rq.pop_front();
  }
}

size_t FakeRdma::queued() const {
  size_t n = 0;
  for (const auto& kv : qps_) n += kv.second->sq.size();
  return n;
}

bool FakeRdma::canRun(const Qp& q) const {
  if (q.sq.empty() || q.state != IBV_QPS_RTS) return false;
  if (q.sq.front().opcode != IBV_WR_RDMA_WRITE_WITH_IMM) return true;
  auto peer = qps_.find(q.dest);
  return peer != qps_.end() && !peer->second->rq.empty();
}

bool FakeRdma::step(uint32_t qpn) {
  Qp* q = qpByNumber(qpn);
  if (q == nullptr || !canRun(*q)) return false;
  return execute(q);
}

size_t FakeRdma::run(std::mt19937* rng, size_t maxSteps) {
  size_t steps = 0;
  while (steps < maxSteps) {
    std::vector<Qp*> ready;
    for (auto& kv : qps_) {
      if (canRun(*kv.second)) ready.push_back(kv.second.get());
    }
    if (ready.empty()) break;
    Qp* q = rng != nullptr ? ready[std::uniform_int_distribution<size_t>(0, ready.size() - 1)(*rng)] : ready.front();
    execute(q);
    ++steps;
  }
  return steps;
}

void FakeRdma::splitNextWrite(uint32_t qpn, size_t firstBytes) {
  Qp* q = qpByNumber(qpn);
  ASSERT_NE(q, nullptr);
  ASSERT_FALSE(q->sq.empty());
  Wr whole = q->sq.front();
  ASSERT_EQ(whole.sges.size(), 1u);
  ASSERT_GT(whole.sges[0].length, firstBytes);
  Wr first = whole;
  first.opcode = IBV_WR_RDMA_WRITE;
  first.signaled = false;
  first.sges[0].length = static_cast<uint32_t>(firstBytes);
  Wr rest = whole;
  rest.sges[0].addr += firstBytes;
  rest.sges[0].length -= static_cast<uint32_t>(firstBytes);
  rest.remoteAddr += firstBytes;
  q->sq.pop_front();
  q->sq.push_front(rest);
  q->sq.push_front(first);
}

// Resolves the remote range of a WRITE/READ: false when the rkey is unknown, belongs to
// another device than the one the peer QP is on, or does not cover the range.
bool FakeRdma::copyIn(const Wr& wr, uint8_t** remote, const Mr** rmr, size_t len) const {
  *remote = nullptr;
  *rmr = nullptr;
  if (len == 0) return true;  // a zero-length RDMA operation validates no R_Key
  *rmr = mrByKey(wr.rkey, true);
  if (*rmr == nullptr) return false;
  uint64_t lo = reinterpret_cast<uintptr_t>((*rmr)->mr.addr);
  if (wr.remoteAddr < lo || wr.remoteAddr + len > lo + (*rmr)->mr.length) return false;
  *remote = reinterpret_cast<uint8_t*>(wr.remoteAddr);
  return true;
}

bool FakeRdma::execute(Qp* q) {
  Wr wr = q->sq.front();
  q->sq.pop_front();
  Qp* peer = qpByNumber(q->dest);
  size_t len = 0;
  for (const ibv_sge& s : wr.sges) {
    const Mr* m = mrByKey(s.lkey, false);
    uint64_t lo = m != nullptr ? reinterpret_cast<uintptr_t>(m->mr.addr) : 0;
    if (m == nullptr || m->device != q->device || s.addr < lo || s.addr + s.length > lo + m->mr.length) {
      lastErrorStatus_ = IBV_WC_LOC_PROT_ERR;
      complete(q, wr, IBV_WC_LOC_PROT_ERR);
      toError(q);
      return true;
    }
    len += s.length;
  }
  uint8_t* remote = nullptr;
  const Mr* rmr = nullptr;
  if (peer == nullptr || !copyIn(wr, &remote, &rmr, len) || (rmr != nullptr && rmr->device != peer->device)) {
    lastErrorStatus_ = IBV_WC_REM_ACCESS_ERR;
    complete(q, wr, IBV_WC_REM_ACCESS_ERR);
    toError(q);
    return true;
  }
  for (const ibv_sge& s : wr.sges) {
    uint8_t* local = reinterpret_cast<uint8_t*>(s.addr);
    if (wr.opcode == IBV_WR_RDMA_READ) {
      memcpy(local, remote, s.length);
    } else {
      memmove(remote, local, s.length);
    }
    remote += s.length;
  }
  if (wr.opcode == IBV_WR_RDMA_READ) ++reads_[q->device];
  if (wr.opcode != IBV_WR_RDMA_READ) written_[q->qp.qp_num] += len;
  if (wr.opcode == IBV_WR_RDMA_WRITE_WITH_IMM) {
    ibv_wc wc{};
    wc.wr_id = peer->rq.front();
    peer->rq.pop_front();
    wc.status = IBV_WC_SUCCESS;
    wc.opcode = IBV_WC_RECV_RDMA_WITH_IMM;
    wc.wc_flags = IBV_WC_WITH_IMM;
    wc.imm_data = wr.immData;
    wc.byte_len = static_cast<uint32_t>(len);
    wc.qp_num = peer->qp.qp_num;
    if (Cq* c = cqOf(peer->qp.recv_cq)) c->wcs.push_back(wc);
  }
  if (wr.signaled) complete(q, wr, IBV_WC_SUCCESS);
  return true;
}

int FakeRdma::eventIndex(const std::string& prefix) const {
  for (size_t i = 0; i < events_.size(); ++i) {
    if (events_[i].compare(0, prefix.size(), prefix) == 0) return static_cast<int>(i);
  }
  return -1;
}

std::vector<uint32_t> FakeRdma::qpns() const {
  std::vector<uint32_t> out;
  for (const auto& kv : qps_) out.push_back(kv.first);
  return out;
}

std::vector<uint32_t> FakeRdma::qpnsOn(const std::string& device) const {
  std::vector<uint32_t> out;
  for (const auto& kv : qps_) {
    if (kv.second->device == device) out.push_back(kv.first);
  }
  return out;
}

uint32_t FakeRdma::destQpn(uint32_t qpn) const {
  auto it = qps_.find(qpn);
  return it == qps_.end() ? 0 : it->second->dest;
}

void FakeRdma::enableEce(const std::string& device, uint32_t vendor, uint32_t caps, int setErrno) {
  ece_[device] = EceDevice{vendor, caps, setErrno};
}

int64_t FakeRdma::eceAtRtr(uint32_t qpn) const {
  auto it = qps_.find(qpn);
  return it == qps_.end() ? -1 : it->second->eceAtRtr;
}

int FakeRdma::eceSets(uint32_t qpn) const {
  auto it = qps_.find(qpn);
  return it == qps_.end() ? 0 : it->second->eceSets;
}

int FakeRdma::trafficClass(uint32_t qpn) const {
  auto it = qps_.find(qpn);
  return it == qps_.end() ? -1 : it->second->trafficClass;
}

int FakeRdma::serviceLevel(uint32_t qpn) const {
  auto it = qps_.find(qpn);
  return it == qps_.end() ? -1 : it->second->serviceLevel;
}

int FakeRdma::readsExecuted(const std::string& device) const {
  auto it = reads_.find(device);
  return it == reads_.end() ? 0 : it->second;
}

size_t FakeRdma::liveQps() const { return qps_.size(); }
size_t FakeRdma::liveCqs() const { return cqs_.size(); }
size_t FakeRdma::liveMrs() const { return mrs_.size(); }

size_t FakeRdma::livePds() const {
  size_t n = 0;
  for (const auto& kv : devices_) {
    for (const auto& pd : kv.second->pds) n += pd != nullptr ? 1 : 0;
  }
  return n;
}

ibv_mr* registerMemory(FakeRdma& fake, ibv_pd* pd, void* addr, size_t len) {
  return fake.api()->regMr(pd, addr, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
}

}  // namespace fake
}  // namespace mesh
