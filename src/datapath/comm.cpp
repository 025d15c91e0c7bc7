// SPDX-License-Identifier: Apache-2.0
// Comm lifecycle shared by both directions: resources, activation, completion polling,
// error reporting, teardown. The per-direction protocol is in datapath_send/recv.cpp.
#include "mesh/datapath/comm.h"

#include <arpa/inet.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "mesh/datapath/async_events.h"
#include "mesh/datapath/barrier.h"
#include "mesh/datapath/chunk_plan.h"
#include "mesh/platform/check.h"
#include "mesh/platform/log.h"
#include "mesh/platform/page.h"

namespace mesh {

namespace {
// Comm::test: how long a request may still complete after the peer's connection closed (its
// NIC's last ACK behind the close: software NICs, loaded or emulated hosts).
constexpr int kPeerGoneGraceMs = 200;

// The MTU this end offers for a link (enum ibv_mtu): the port's, capped by NCCL_MESH_IB_MTU.
int offeredMtu(const MeshPort& port, int mtuCapBytes) {
  return mtuCapBytes > 0 ? std::min(port.activeMtu, bytesToMtu(mtuCapBytes)) : port.activeMtu;
}

}  // namespace

int resolveTrafficClass(int envTrafficClass, int commTrafficClass) {
  if (envTrafficClass >= 0) return envTrafficClass;
  if (commTrafficClass >= 0) return commTrafficClass;
  return 0;
}

Comm::Comm(bool sender, const Discovery* disc, CommSettings settings)
    : sender_(sender), disc_(disc), settings_(settings), tuning_(settings.tuning) {
  for (stats::LinkSlot*& l : linkStats_) l = &sinkLink_;
  for (int i = 0; i < kRequestPool; ++i) {
    reqs_[i].index = static_cast<uint16_t>(i);
    reqs_[i].comm = this;
    freeList_[nfree_++] = &reqs_[kRequestPool - 1 - i];
  }
}

Comm::~Comm() { close(); }

Request* Comm::allocRequest(Request::Kind kind) {
  if (nfree_ == 0) return nullptr;
  Request* r = freeList_[--nfree_];
  r->kind = kind;
  r->gen = static_cast<uint16_t>(r->gen + 1);
  r->pending = 0;
  r->n = 1;
  r->viaSizes = false;
  r->twinned = false;
  return r;
}

void Comm::freeRequest(Request* r) {
  r->kind = Request::Kind::Free;
  freeList_[nfree_++] = r;
}

// --- setup -------------------------------------------------------------------------------

std::vector<int> Comm::localPorts() const {
  std::vector<int> out;
  for (const Link& l : links_) {
    if (std::find(out.begin(), out.end(), l.route.localNic) == out.end()) out.push_back(l.route.localNic);
  }
  return out;
}

std::vector<int> Comm::deviceIndexes() const {
  std::vector<int> out;
  for (int s = 0; s < ndevs_; ++s) out.push_back(devs_[s].deviceIndex);
  return out;
}

ncclResult_t Comm::prepare(const std::vector<Route>& routes, int trafficClass, HsMessage* local) {
  MESH_REQUIRE(!routes.empty() && routes.size() <= static_cast<size_t>(kMaxLinks), ncclInternalError,
               "connection needs 1..%d links, got %zu", kMaxLinks, routes.size());
  tuning_.trafficClass = trafficClass;
  for (const Route& r : routes) {
    Link l;
    l.route = r;
    l.port = &disc_->ports.at(static_cast<size_t>(r.localNic));
    if (settings_.gidIndex >= 0) {
      // A forced GID index: send from whatever GID sits there on this port.
      const VerbsDevice& dev = *disc_->devices.at(static_cast<size_t>(l.port->deviceIndex));
      ibv_gid gid{};
      MESH_REQUIRE(dev.api().queryGid(dev.context(), static_cast<uint8_t>(l.port->port), settings_.gidIndex, &gid) == 0,
                   ncclInvalidUsage, "NCCL_MESH_GID_INDEX=%d: cannot read that GID on %s: %s", settings_.gidIndex,
                   l.port->label().c_str(), strerror(errno));
      l.route.gidIndex = settings_.gidIndex;
      memcpy(l.gid, gid.raw, 16);
    }
    for (const PortAddress& a : l.port->addrs) {
      if (settings_.gidIndex < 0 && a.gidIndex == r.gidIndex) memcpy(l.gid, a.gid, 16);
    }
    if (settings_.gidIndex < 0) MESH_CHECK(refreshGid(&l));
    links_.push_back(l);
  }
  uint32_t peerAddr = routes[0].peerAddr;
  for (size_t i = 0; i < links_.size(); ++i) {
    const Route& r = links_[i].route;
    stats::LinkSlot* slot = stats::Publisher::link(links_[i].port->device, links_[i].port->port, r.local.addr, r.peerAddr);
    linkStats_[i] = slot != nullptr ? slot : &sinkLink_;
    peerAddr = std::min(peerAddr, r.peerAddr);
  }
  peerAddr_ = peerAddr;  // the comm's flow is claimed when it opens (markOpen, countAs)
  MESH_CHECK(allocCtrl());
  MESH_CHECK(createDevSlots());
  MESH_CHECK(createQps());
  if (sender_ && settings_.ece) MESH_CHECK(offerEce());
  MESH_CHECK(createExtra());
  describe(local);
  return ncclSuccess;
}

// The link's GID index as the port's table has it now, not as it was at init (GidNow).
ncclResult_t Comm::refreshGid(Link* l) const {
  const VerbsDevice& dev = *disc_->devices.at(static_cast<size_t>(l->port->deviceIndex));
  GidNow now = gidNow(dev.api(), dev.context(), dev.name(), l->port->port, l->route.local.addr, l->route.gidIndex, l->gid);
  if (now.state == GidNow::State::Gone) {
    MESH_WARN("%s: %s has no RoCEv2 GID in the port's GID table any more (its GID index was %d at init): was the "
              "address removed from %s? Connections from it fail until it is back",
              l->port->label().c_str(), formatIpv4(l->route.local.addr).c_str(), l->route.gidIndex,
              l->port->netdev.c_str());
    return ncclSystemError;
  }
  if (now.state == GidNow::State::Moved) {
    MESH_INFO(NCCL_INIT | NCCL_NET, "%s: the RoCEv2 GID of %s moved from index %d to %d since init; using %d",
              l->port->label().c_str(), formatIpv4(l->route.local.addr).c_str(), l->route.gidIndex, now.index,
              now.index);
    l->route.gidIndex = now.index;
    memcpy(l->gid, now.gid, 16);
  }
  return ncclSuccess;
}

// Control memory the NICs read and write. Whole pages of the system's size (64 KiB on some
// aarch64 kernels), page-aligned: with ibv_fork_init rdma-core marks registered pages
// MADV_DONTFORK, and a page shared with other heap data would vanish from a forked child
// under that data.
size_t Comm::ctrlBytes() const { return std::max(sizeof(SendCtrl), sizeof(RecvCtrl)); }

ncclResult_t Comm::allocCtrl() {
  size_t need = ctrlBytes();
  ctrlMem_ = allocPages(need, systemPageSize(), &ctrlSize_);
  MESH_REQUIRE(ctrlMem_ != nullptr, ncclSystemError, "cannot allocate %zu bytes of control memory", need);
  return ncclSuccess;
}

void Comm::describe(HsMessage* local) const {
  uint64_t ctrlAddr = 0;
  describeCtrl(&ctrlAddr);
  local->qpsPerLink = settings_.qpsPerLink;
  local->trafficClass = tuning_.trafficClass;
  local->serviceLevel = tuning_.serviceLevel;
  local->links.clear();
  local->qps.clear();
  for (const Link& l : links_) {
    HsLink hl = linkForRoute(l.route);
    hl.ctrlAddr = ctrlAddr;
    hl.ctrlRkey = devs_[l.devSlot].ctrlMr->rkey;
    hl.hasEce = sender_ && l.hasEce;  // a receiver's is added in activate()
    hl.eceVendor = hl.hasEce ? l.ece.vendorId : 0;
    hl.eceOptions = hl.hasEce ? l.ece.options : 0;
    local->links.push_back(hl);
  }
  for (int q = 0; q < nqps_; ++q) {
    const Link& l = links_[qps_[q].link];
    HsQp hq;
    hq.qpn = qps_[q].qp.qpn();
    hq.psn = qps_[q].qp.psn();
    memcpy(hq.gid, l.gid, 16);
    hq.gidIndex = static_cast<uint8_t>(l.route.gidIndex);
    hq.mtu = static_cast<uint8_t>(offeredMtu(*l.port, settings_.mtuCap));
    local->qps.push_back(hq);
  }
}

ncclResult_t Comm::createDevSlots() {
  for (size_t i = 0; i < links_.size(); ++i) {
    int dev = links_[i].port->deviceIndex;
    int slot = -1;
    for (int s = 0; s < ndevs_; ++s) {
      if (devs_[s].deviceIndex == dev) slot = s;
    }
    if (slot < 0) {
      slot = ndevs_++;
      devs_[slot].deviceIndex = dev;
      devs_[slot].firstLink = static_cast<int>(i);
      devs_[slot].dev = disc_->devices.at(static_cast<size_t>(dev)).get();
    }
    links_[i].devSlot = slot;
  }
  for (int s = 0; s < ndevs_; ++s) {
    DevSlot& d = devs_[s];
    int qpsHere = 0;
    for (const Link& l : links_) qpsHere += l.devSlot == s ? settings_.qpsPerLink : 0;
    // Every queue of every QP on this device can complete at once: the CQ is sized so it
    // can never overflow, whatever the posting pattern.
    int perQp = sender_ ? kSendQueueDepth + 1 : kCtrlQueueDepth + kRecvQueueDepth;
    int flush = sender_ ? 0 : kFlushQueueDepth + 1;
    MESH_REQUIRE(!d.dev->fatal(), ncclSystemError,
                 "%s reported a fatal error earlier in this process (IBV_EVENT_DEVICE_FATAL): no connection is built "
                 "on it until the process restarts", d.dev->name().c_str());
    MESH_CHECK(d.cq.create(d.dev, qpsHere * perQp + flush + 16, this));
    int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    d.ctrlMr = d.dev->api().regMr(d.dev->pd(), ctrlMem_, ctrlSize_, access);
    MESH_REQUIRE(d.ctrlMr != nullptr, ncclSystemError,
                 "registering %zu bytes of control memory on %s failed: %s (check `ulimit -l`)",
                 ctrlSize_, d.dev->name().c_str(), strerror(errno));
  }
  return ncclSuccess;
}

ncclResult_t Comm::createQps() {
  int total = settings_.qpsPerLink * static_cast<int>(links_.size());
  MESH_REQUIRE(total <= kMaxQps, ncclInvalidUsage,
               "%d links x NCCL_MESH_QPS_PER_CONN=%d = %d QPs exceeds the per-comm limit of %d",
               static_cast<int>(links_.size()), settings_.qpsPerLink, total, kMaxQps);
  QpCaps caps;
  caps.maxSendWr = sender_ ? kSendQueueDepth : kCtrlQueueDepth;
  caps.maxRecvWr = sender_ ? 1 : kRecvQueueDepth;
  // Link-major, so a receiver's QP k pairs with the sender's QP k.
  for (size_t l = 0; l < links_.size(); ++l) {
    for (int i = 0; i < settings_.qpsPerLink; ++i) {
      Qp& q = qps_[nqps_++];
      q.link = static_cast<int>(l);
      q.devSlot = links_[l].devSlot;
      q.credits = caps.maxSendWr;
      MESH_CHECK(q.qp.create(devs_[q.devSlot].dev, links_[l].port->port, devs_[q.devSlot].cq.get(), caps, this));
      MESH_CHECK(q.qp.toInit());
    }
  }
  return ncclSuccess;
}

ncclResult_t Comm::activate(const HsMessage& remote, HsMessage* reply) {
  if (!sender_) {
    originAddr_ = remote.originAddr;
    twinLeg_ = remote.twinLeg;
  }
  MESH_REQUIRE(remote.links.size() == links_.size() && remote.qpsPerLink == settings_.qpsPerLink &&
                   remote.qps.size() == static_cast<size_t>(nqps_),
               ncclRemoteError,
               "peer %s describes %zu links x %d QPs, we have %zu x %d (NCCL_MESH_QPS_PER_CONN must "
               "match on all ranks)",
               peer.c_str(), remote.links.size(), remote.qpsPerLink, links_.size(), settings_.qpsPerLink);
  MESH_REQUIRE(sender_ || reply == nullptr || reply->links.size() == links_.size(), ncclInternalError,
               "accept reply describes %zu links, the comm has %zu", reply->links.size(), links_.size());
  // The connector chose the classes for both ends (a HELLO from a peer that predates this
  // carries none: keep our own).
  if (!sender_ && remote.trafficClass >= 0) {
    tuning_.trafficClass = remote.trafficClass;
    tuning_.serviceLevel = remote.serviceLevel;
  }
  for (size_t l = 0; l < links_.size(); ++l) {
    links_[l].remoteCtrl = remote.links[l].ctrlAddr;
    links_[l].remoteRkey = remote.links[l].ctrlRkey;
    MESH_CHECK(setEce(l, remote.links[l]));
  }
  for (int q = 0; q < nqps_; ++q) MESH_CHECK(connectQp(q, remote.qps[q]));
  for (size_t l = 0; l < links_.size(); ++l) {
    if (!sender_) MESH_CHECK(settleEce(l, reply));
    logLink(l, remote.qps[l * static_cast<size_t>(settings_.qpsPerLink)].mtu);
  }
  return activateExtra();
}

// ECE as NCCL's IB transport negotiates it (NCCL_IB_ECE_ENABLE, default 1; 2.28.9 net_ib.cc
// ncclIbConnect / ncclIbAccept, 2.30.7 net_ib/connect.cc): the connector queries its new QPs
// and sends what they offer; the acceptor sets that on its QPs before RTR and, after RTS,
// queries what they settled on and sends it back; the connector sets that before its own
// RTR. Only the connector's setting decides whether ECE is offered. Providers without ECE
// (rxe, siw, an rdma-core before 31) answer "unsupported" and the connection goes on without.
ncclResult_t Comm::offerEce() {
  for (size_t i = 0; i < links_.size(); ++i) {
    Link& l = links_[i];
    EceResult r = qps_[i * static_cast<size_t>(settings_.qpsPerLink)].qp.queryEce(&l.ece);  // link-major
    MESH_REQUIRE(r != EceResult::Failed, ncclSystemError, "cannot read the ECE options of the QPs on %s",
                 l.port->label().c_str());
    l.hasEce = r == EceResult::Ok;
  }
  return ncclSuccess;
}

ncclResult_t Comm::setEce(size_t link, const HsLink& remote) {
  Link& l = links_[link];
  // A sender sets only what answers its own offer (2.30.7 checks its QP's eceSupported too).
  bool offered = !sender_ || l.hasEce;
  l.hasEce = false;
  if (!remote.hasEce || !offered) return ncclSuccess;
  Ece want{remote.eceVendor, remote.eceOptions};
  bool all = true;
  for (int q = 0; q < nqps_; ++q) {
    if (qps_[q].link != static_cast<int>(link)) continue;
    EceResult r = qps_[q].qp.setEce(want);
    MESH_REQUIRE(r != EceResult::Failed, ncclSystemError, "cannot set the ECE options %s on the QPs of %s",
                 sender_ ? "the peer's QPs settled on" : "the peer offered", l.port->label().c_str());
    all = all && r == EceResult::Ok;
  }
  l.hasEce = all;
  l.ece = want;
  return ncclSuccess;
}

ncclResult_t Comm::settleEce(size_t link, HsMessage* reply) {
  Link& l = links_[link];
  if (l.hasEce) {
    EceResult r = qps_[link * static_cast<size_t>(settings_.qpsPerLink)].qp.queryEce(&l.ece);
    MESH_REQUIRE(r != EceResult::Failed, ncclSystemError, "cannot read the ECE options the QPs on %s settled on",
                 l.port->label().c_str());
    l.hasEce = r == EceResult::Ok;
  }
  if (reply != nullptr) {
    HsLink& hl = reply->links[link];
    hl.hasEce = l.hasEce;
    hl.eceVendor = l.hasEce ? l.ece.vendorId : 0;
    hl.eceOptions = l.hasEce ? l.ece.options : 0;
  }
  return ncclSuccess;
}

ncclResult_t Comm::connectQp(int q, const HsQp& r) {
  const Link& l = links_[qps_[q].link];
  QpRemote rem;
  rem.qpn = r.qpn;
  rem.psn = r.psn;
  memcpy(rem.gid, r.gid, 16);
  rem.localGidIndex = l.route.gidIndex;
  rem.mtu = negotiatedMtu(offeredMtu(*l.port, settings_.mtuCap), r.mtu);
  MESH_CHECK(qps_[q].qp.toRtr(rem, qpTuning()));
  MESH_CHECK(qps_[q].qp.toRts(qpTuning()));
  return ncclSuccess;
}

// A receiver's data QPs send its credits (the FIFO entries) and its ACKs: NCCL_IB_FIFO_TC's
// counterpart gives them their own class, decided by the receiving node alone (NCCL 2.28.9
// net_ib.cc ncclIbRtrQp(fifoTc=true) in ncclIbAccept only; 2.30.7 net_ib/connect.cc
// ncclIbAccept). The flush QP keeps the connection's class, as there.
QpTuning Comm::qpTuning() const {
  QpTuning tuning = tuning_;
  if (!sender_ && settings_.fifoTrafficClass >= 0) tuning.trafficClass = settings_.fifoTrafficClass;
  return tuning;
}

void Comm::logLink(size_t link, int peerMtu) const {
  const Link& l = links_[link];
  const Qp& q = qps_[link * static_cast<size_t>(settings_.qpsPerLink)];
  int localMtu = offeredMtu(*l.port, settings_.mtuCap);
  std::string ece = l.hasEce ? " ece=" + eceText(l.ece) : "";
  MESH_INFO(NCCL_INIT | NCCL_NET,
            "conn %s peer=%s link=%zu local=%s addr=%s gid_index=%d qpn=%u mtu=%d qps=%d tc=%d%s%s",
            sender_ ? "send" : "recv", formatIpv4(l.route.peerAddr).c_str(), link, l.port->label().c_str(),
            formatIpv4(l.route.local.addr).c_str(), l.route.gidIndex, q.qp.qpn(),
            mtuToBytes(negotiatedMtu(localMtu, peerMtu)), settings_.qpsPerLink, qpTuning().trafficClass, ece.c_str(),
            peerMtuNote(localMtu, peerMtu).c_str());
}

// --- completions and errors --------------------------------------------------------------

ncclResult_t Comm::postBatch(int q, int count, bool signal) {
  // A failed comm posts nothing more. The callers move their cursors as they build a batch
  // (SendComm::postShare, postRelayed): after a post refused part of one, a completion that
  // pumped the group again would skip the refused WRs and post the final immediate, and the
  // receiver would report a message done with pieces never written.
  if (failure_ != ncclSuccess) return failure_;
  if (count == 0) return ncclSuccess;
  for (int i = 0; i < count; ++i) wrs_[i].next = i + 1 < count ? &wrs_[i + 1] : nullptr;
  if (signal) wrs_[count - 1].send_flags |= IBV_SEND_SIGNALED;
  Qp& qp = qps_[q];
  // What the WRs point at (staged FIFO entries, the sizes array, NCCL's send buffers) was
  // written with plain stores: make them visible before the post can be. Providers add a
  // device barrier before the doorbell; this covers the compiler and rxe's kernel thread.
  beforePostFence();
  ibv_send_wr* bad = nullptr;
  int rc = settings_.ops->postSend(qp.qp.get(), wrs_, &bad);
  if (rc != 0) {
    fail("ibv_post_send on " + qp.qp.deviceName() + " QPN " + std::to_string(qp.qp.qpn()) + " failed: " +
             strerror(rc),
         ncclSystemError);
    return failure_;
  }
  qp.credits -= count;
  uint64_t bytes = 0;
  for (int i = 0; i < count; ++i) {
    for (int k = 0; k < wrs_[i].num_sge; ++k) bytes += wrs_[i].sg_list[k].length;
  }
  stats::LinkSlot* ls = linkStats_[qp.link];
  stats::add(&ls->txBytes, bytes);
  stats::add(&ls->txOps, static_cast<uint64_t>(count));
  if (relayTx_[qp.link] != nullptr) stats::add(relayTx_[qp.link], bytes);
  uint32_t batchBytes = static_cast<uint32_t>(std::min<uint64_t>(bytes, UINT32_MAX));
  qp.bytesInFlight += batchBytes;
  if (!signal) {
    qp.unsignaled += count;
    qp.unsignaledBytes += batchBytes;
    return ncclSuccess;
  }
  qp.batches[qp.batchTail] = static_cast<uint16_t>(count + qp.unsignaled);
  qp.batchBytes[qp.batchTail] = batchBytes + qp.unsignaledBytes;
  qp.unsignaled = 0;
  qp.unsignaledBytes = 0;
  qp.batchTail = (qp.batchTail + 1) % kSendQueueDepth;
  return ncclSuccess;
}

ncclResult_t Comm::postCtrlWrite(const void* local, uint32_t len, uint64_t remoteOffset, uint16_t index,
                                  bool signal) {
  ibv_send_wr& wr = wrs_[0];
  ibv_sge& sge = sges_[0];
  sge.addr = reinterpret_cast<uintptr_t>(local);
  sge.length = len;
  sge.lkey = devs_[qps_[0].devSlot].ctrlMr->lkey;
  wr = ibv_send_wr();
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.wr.rdma.remote_addr = links_[0].remoteCtrl + remoteOffset;
  wr.wr.rdma.rkey = links_[0].remoteRkey;
  wr.wr_id = encodeWrId(WrId{WrKind::Ctrl, 0, index, 0});
  return postBatch(0, 1, signal);
}

int Comm::pickRelayQp(uint64_t rr, int need) const {
  int turn = static_cast<int>(rr % static_cast<uint64_t>(nqps_));
  int pick = -1;
  for (int i = 0; i < nqps_; ++i) {
    int q = (turn + i) % nqps_;
    if (qps_[q].credits < need) continue;
    if (pick < 0 || qps_[q].bytesInFlight < qps_[pick].bytesInFlight) pick = q;
  }
  return pick;
}

void Comm::returnCredits(int q) {
  Qp& qp = qps_[q];
  qp.credits += qp.batches[qp.batchHead];
  qp.bytesInFlight -= qp.batchBytes[qp.batchHead];
  qp.batchHead = (qp.batchHead + 1) % kSendQueueDepth;
}

void Comm::fail(const std::string& why, ncclResult_t code) {
  if (failure_ != ncclSuccess) return;
  failure_ = code;
  failureText_ = why;
  stats::add(&flowStats_->errors, 1);
  if (open_) stats::Publisher::event(stats::kCommErrors);
  MESH_WARN("%s comm with %s failed: %s", sender_ ? "send" : "recv", peer.c_str(), why.c_str());
}

ncclResult_t Comm::completionError(const ibv_wc& wc) {
  WrId id = decodeWrId(wc.wr_id);
  const Qp* qp = nullptr;
  for (int q = 0; q < nqps_; ++q) {
    if (qps_[q].qp.qpn() == wc.qp_num) qp = &qps_[q];
  }
  if (qp != nullptr && wc.status != IBV_WC_WR_FLUSH_ERR) stats::add(&linkStats_[qp->link]->errors, 1);
  std::string where = qp != nullptr ? links_[qp->link].port->label() + " local GID " +
                                          gidText(links_[qp->link].gid)
                                    : std::string("flush QP");
  char buf[512];
  snprintf(buf, sizeof(buf),
           "work completion error '%s' (status %d, vendor error 0x%x) for wr kind %d on QPN %u (%s), "
           "peer %s",
           disc_->devices.empty() ? "?" : disc_->devices[0]->api().wcStatusStr(wc.status), wc.status,
           wc.vendor_err, static_cast<int>(id.kind), wc.qp_num, where.c_str(), peer.c_str());
  bool flushed = wc.status == IBV_WC_WR_FLUSH_ERR;
  bool remote = wc.status == IBV_WC_RETRY_EXC_ERR || wc.status == IBV_WC_RNR_RETRY_EXC_ERR ||
                wc.status == IBV_WC_REM_ACCESS_ERR || wc.status == IBV_WC_REM_OP_ERR ||
                wc.status == IBV_WC_REM_INV_REQ_ERR || flushed;
  ncclResult_t code = remote ? ncclRemoteError : ncclSystemError;
  if (failure_ == ncclSuccess) {
    fail(buf, code);
    failureIsFlush_ = flushed;
  } else if (failureIsFlush_ && !flushed) {
    // A flush only says that the QP is in the error state; the WR that put it there can
    // complete after the flushed ones (providers order the queues' completions freely).
    // Report the cause, once.
    failure_ = code;
    failureText_ = buf;
    failureIsFlush_ = false;
    MESH_WARN("%s comm with %s: the cause of the flushed work requests: %s", sender_ ? "send" : "recv",
              peer.c_str(), buf);
  }
  return failure_;
}

ncclResult_t Comm::checkEvents() {
  int event = asyncEvent_.load(std::memory_order_acquire);
  if (event >= 0 && failure_ == ncclSuccess) {
    fail(std::string("fatal asynchronous event on ") + (event == IBV_EVENT_CQ_ERR ? "its completion queue: " : "one of its QPs: ") +
             fatalQpEventName(event), ncclSystemError);
  }
  for (int s = 0; s < ndevs_ && failure_ == ncclSuccess; ++s) {
    if (devs_[s].dev->fatal()) fail(devs_[s].dev->name() + " reported a fatal error (IBV_EVENT_DEVICE_FATAL)", ncclSystemError);
  }
  return failure_;
}

ncclResult_t Comm::progress() {
  checkEvents();
  ibv_wc wcs[16];
  for (int s = 0; s < ndevs_; ++s) {
    for (;;) {
      int n = settings_.ops->pollCq(devs_[s].cq.get(), 16, wcs);
      if (n < 0) {
        fail("ibv_poll_cq failed on " + devs_[s].dev->name(), ncclSystemError);
        return failure_;
      }
      // A CQE is how the NIC publishes what it wrote before it (sizes[], received data):
      // no later load may be satisfied before the CQE was seen. Providers put a device read
      // barrier in poll_cq; this fence also stops the compiler and orders against rxe's
      // kernel thread. A dmb on aarch64, nothing on x86.
      if (n > 0) afterCompletionFence();
      for (int i = 0; i < n; ++i) {
        if (wcs[i].status != IBV_WC_SUCCESS) {
          if (!closed_) completionError(wcs[i]);
          continue;
        }
        onCompletion(wcs[i]);
      }
      if (n < 16) break;
    }
  }
  if (failure_ == ncclSuccess) afterPoll();
  return failure_;
}

ncclResult_t Comm::health(const Request* waiting) const {
  (void)waiting;
  return failure_;
}

ncclResult_t Comm::test(Request* req, int* done, size_t* sizes) {
  *done = 0;
  // Read the peer's liveness before polling: a completion of what the peer received before
  // it closed is then found by this poll, or (a software NIC's late ACK) within the grace below.
  bool peerGone = control != nullptr && control->closed.load(std::memory_order_acquire);
  // A request an earlier poll completed is reported without polling again, as NCCL's IB
  // transport does (2.28.9 ncclIbTest): NCCL's proxy tests only each connection's oldest
  // request, one per pass, so polling here delayed every pass's next post (sendrecv on the
  // fabric: 0.86-0.93 of NCCL IB with it, 0.96-1.02 without; docs/figures.md).
  bool already = req->pending == 0 && req->kind != Request::Kind::Free;
  ncclResult_t r = already ? ncclSuccess : progress();
  if (req->pending == 0 && req->kind != Request::Kind::Free) {
    *done = 1;
    if (sizes != nullptr) {
      for (int i = 0; i < req->n; ++i) sizes[i] = req->sizes[i];
    }
    if (peerGoneAt_ && !lateNoted_) {
      lateNoted_ = true;
      double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - *peerGoneAt_).count();
      MESH_INFO(NCCL_NET, "%s comm with %s: a request completed %.1f ms after the peer closed its connection "
                "(the close arrived before the NIC's last acknowledgement)", sender_ ? "send" : "recv",
                peer.c_str(), ms);
    }
    countDone(*req);
    freeRequest(req);
    return ncclSuccess;
  }
  if (r != ncclSuccess) return r;
  if (!peerGone) return ncclSuccess;
  // The peer's close (a TCP FIN through both kernels) can overtake its NIC's last ACKs where
  // the NIC is software (rxe's kernel thread, the test fabric's NIC thread on a loaded host):
  // a receiver that saw its data and closed had acknowledged it, but the ACK may not be here
  // yet. So a request still pending is called lost only kPeerGoneGraceMs after this end first
  // saw the close; until then test() says "not done" (NCCL calls it again), never blocking.
  auto now = std::chrono::steady_clock::now();
  if (!peerGoneAt_) peerGoneAt_ = now;
  if (now - *peerGoneAt_ < std::chrono::milliseconds(kPeerGoneGraceMs)) return ncclSuccess;
  return checkPeer("with a request pending");
}

// A request's payload into the live counters. A send's bytes are counted per link as they
// are posted (postBatch); a receive sees no work request of the sender's, so its bytes are
// put on the links the way the sender splits them (qpShare, with our NCCL_MESH_SPLIT_MIN:
// the job's settings are the same on every node). A relay's pieces do not follow that
// split; its own counters are exact (RelayLegComm counts every ticket where it lands).
void Comm::countDone(const Request& r) {
  if (r.kind == Request::Kind::Send) {
    stats::add(&flowStats_->txBytes, r.size);
  } else if (r.kind == Request::Kind::Recv) {
    uint64_t total = 0;
    for (int i = 0; i < r.n; ++i) total += r.sizes[i];
    stats::add(&flowStats_->rxBytes, total);
    if (total == 0) return;
    for (int q = 0; q < nqps_; ++q) {
      uint64_t bytes = 0;
      for (int i = 0; i < r.n; ++i) {
        Span span = qpShare(r.sizes[i], q, nqps_, settings_.splitMin, r.slot);
        bytes += span.hi - span.lo;
      }
      if (bytes != 0) stats::add(&linkStats_[qps_[q].link]->rxBytes, bytes);
    }
  }
}

ncclResult_t Comm::checkPeer(const char* doing) {
  if (failure_ != ncclSuccess) return failure_;
  if (control == nullptr || !control->closed.load(std::memory_order_acquire)) return ncclSuccess;
  int err = control->error.load(std::memory_order_relaxed);
  std::string why;
  if (err == 0) {
    // A clean TCP close (FIN) of the control connection: the peer closed its comm, or its
    // process ended (exit, or a kill; the kernel closes its sockets alike). Nothing tells which.
    why = "the peer closed its end of the connection (it closed the comm, or its process ended) ";
  } else if (err == ETIMEDOUT) {
    why = "the peer stopped answering on its connection (no heartbeat or keepalive reply within "
          "NCCL_MESH_PEER_TIMEOUT_MS: process stopped or hung, host down, link down or cable pulled) ";
  } else {
    why = std::string("the connection to the peer failed (") + strerror(err) + ") ";
  }
  fail(why + doing, ncclRemoteError);
  return failure_;
}

// --- teardown ------------------------------------------------------------------------------

// Flushed WRs complete in error once their QP is in ERR; collect them (bounded: a device
// that stops completing must not hang NCCL's close) so none is outstanding when its QP,
// and then the memory it names, go.
void Comm::drain() {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
  ibv_wc wcs[16];
  for (int s = 0; s < ndevs_; ++s) {
    int idle = 0;
    while (idle < 3 && std::chrono::steady_clock::now() < deadline && devs_[s].cq.get() != nullptr) {
      idle = settings_.ops->pollCq(devs_[s].cq.get(), 16, wcs) > 0 ? 0 : idle + 1;
    }
  }
}

void Comm::close() {
  if (closed_) return;
  closed_ = true;
  if (open_) stats::add(&flowStats_->closed, 1);
  // 1. Every QP, the flush QPs included, to ERR: nothing more is executed.
  for (int q = 0; q < nqps_; ++q) qps_[q].qp.toError();
  for (int s = 0; s < ndevs_; ++s) devs_[s].flushQp.toError();
  // 2. Their outstanding work completes (flushed).
  drain();
  // 3. The QPs, then the memory registrations their WRs named, then the CQs, then the
  //    memory itself. Best effort: each step is logged on failure and the rest still runs.
  for (int q = 0; q < nqps_; ++q) qps_[q].qp.reset();
  for (int s = 0; s < ndevs_; ++s) devs_[s].flushQp.reset();
  releaseExtra();
  for (int s = 0; s < ndevs_; ++s) {
    DevSlot& d = devs_[s];
    // ibv_dereg_mr returns the error (an errno value); it does not set errno.
    int rc = d.ctrlMr != nullptr ? d.dev->api().deregMr(d.ctrlMr) : 0;
    if (rc != 0) MESH_WARN("ibv_dereg_mr (control memory) on %s failed: %s", d.dev->name().c_str(), strerror(rc));
    d.ctrlMr = nullptr;
  }
  for (int s = 0; s < ndevs_; ++s) devs_[s].cq.reset();
  free(ctrlMem_);
  ctrlMem_ = nullptr;
}

// --- transport ---------------------------------------------------------------------------

RdmaTransport::RdmaTransport(const Discovery* disc, CommSettings settings, std::vector<int> portFilter)
    : disc_(disc), settings_(settings), portFilter_(std::move(portFilter)) {}

std::vector<LocalNic> RdmaTransport::localNics() const {
  std::vector<LocalNic> nics;
  for (size_t i = 0; i < disc_->ports.size(); ++i) {
    if (!portFilter_.empty() &&
        std::find(portFilter_.begin(), portFilter_.end(), static_cast<int>(i)) == portFilter_.end()) {
      continue;
    }
    const MeshPort& p = disc_->ports[i];
    LocalNic nic;
    nic.index = static_cast<int>(i);
    nic.label = p.label();
    for (const PortAddress& a : p.addrs) nic.addrs.push_back(LocalAddress{a.ip, a.gidIndex});
    nics.push_back(nic);
  }
  return nics;
}

ncclResult_t RdmaTransport::prepare(bool sender, const std::vector<Route>& routes, const ConnOptions& opts,
                                    std::unique_ptr<PreparedConn>* out, HsMessage* local) {
  std::unique_ptr<Comm> comm = makeComm(sender);
  int tc = resolveTrafficClass(settings_.envTrafficClass, sender ? opts.trafficClass : -1);
  // A connection has at most kMaxQps QPs: with many QPs per link, the connector uses fewer
  // of the links it found (both functions of a Spark cable are two) rather than failing;
  // the acceptor builds the links the connector's HELLO lists.
  std::vector<Route> use = routes;
  size_t cap = static_cast<size_t>(std::max(1, kMaxQps / std::max(1, settings_.qpsPerLink)));
  if (sender && use.size() > cap) {
    MESH_INFO(NCCL_NET, "connect: %zu links to %s, %zu used: NCCL_MESH_QPS_PER_CONN=%d x %zu links would exceed %d QPs",
              use.size(), formatIpv4(use[0].peerAddr).c_str(), cap, settings_.qpsPerLink, use.size(), kMaxQps);
    use.resize(cap);
  }
  MESH_CHECK(comm->prepare(use, tc, local));
  if (sender) {
    local->originAddr = opts.originAddr;
    local->twinLeg = opts.twinLeg;
  }
  *out = std::move(comm);
  return ncclSuccess;
}

std::unique_ptr<Comm> RdmaTransport::makeComm(bool sender) const {
  if (sender) return std::make_unique<SendComm>(disc_, settings_);
  return std::make_unique<RecvComm>(disc_, settings_);
}

ncclResult_t RdmaTransport::activate(PreparedConn* conn, const HsMessage& remote, HsMessage* reply) {
  return static_cast<Comm*>(conn)->activate(remote, reply);
}

}  // namespace mesh
