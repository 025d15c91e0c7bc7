// SPDX-License-Identifier: Apache-2.0
// The RC transport protocol, as a RoCE NIC runs it:
//   requester  sends each WR as packets of at most MESHFAB_SEGMENT_KB payload, in order,
//              round robin between the QPs that share a connection; keeps every WR until
//              it is acknowledged; a completion is generated only then (a READ when its
//              data arrived); retransmits from the oldest unacknowledged WR (go-back-N) on
//              ACK timeout or a sequence NAK, counting QP retry_cnt; backs off on RNR NAKs
//              for the responder's min_rnr_timer, counting rnr_retry (7 = forever).
//   responder  executes requests in PSN order; a duplicate (PSN below the expected one) is
//              acknowledged again, not executed again (a READ is); a request ahead of it
//              gets one sequence NAK, then is dropped until the expected PSN arrives;
//              requests for a QP that is not RTR/RTS, not connected to the sender, or on a
//              port that is down, are dropped silently, so the requester times out (retry
//              exceeded), as on the wire.
// Packets that cannot be delivered (port down, peer process gone, no such QP) are
// "lost": the requester's ACK timer runs and ends in IBV_WC_RETRY_EXC_ERR after
// timeout * (retry_cnt + 1), as on a real fabric.
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "fabric.h"

namespace meshfab {

void purgeCqes(Qp* qp);

namespace {

constexpr size_t kHdr = sizeof(Packet);
constexpr size_t kMaxQueuedResponses = 4096;  // then the responder stops reading requests

uint64_t mtuBytes(const Qp* qp) { return 128u << qp->attr.path_mtu; }

uint32_t packets(uint64_t len, uint64_t mtu) {
  return static_cast<uint32_t>(std::max<uint64_t>(1, (len + mtu - 1) / mtu));
}

bool hasImm(ibv_wr_opcode op) { return op == IBV_WR_RDMA_WRITE_WITH_IMM || op == IBV_WR_SEND_WITH_IMM; }

bool outstanding(const Qp* qp) { return qp->sqDone < qp->txIdx || qp->txOff > 0; }

// Largest payload of one packet from device d: smaller on a capped port, so that the QPs and
// flows sharing it take turns at a finer grain, as a NIC's packet scheduler does.
uint64_t segmentOf(const Fabric* f, const Device* d) {
  return d->pacer.capped() ? std::min(f->settings.segment, f->settings.pacedSegment) : f->settings.segment;
}

// Where a packet leaving device d at `now` arrives (Packet::arriveNs): 0 = at once.
int64_t arrivalOf(const Device* d, int64_t now) {
  return d->pacer.delayNs() > 0 ? now + d->pacer.delayNs() : 0;
}

// The reader leaves a packet that has not reached this end of its cable yet in the ring.
bool notArrived(Fabric* f, Conn* c, const Packet& h, int64_t now) {
  if (h.arriveNs <= now || c->draining) return false;
  f->waitUntil(&c->rxReadyAt, h.arriveNs);
  return true;
}

void count(Fabric* f, Device* d, StatsCounter c, uint64_t n = 1) {
  f->devStats(d)->counters[c].fetch_add(n, std::memory_order_relaxed);
}

}  // namespace

Clock::duration ackTimeout(const Fabric* f, const Qp* qp) {
  if (qp->attr.timeout == 0) return Clock::duration::max();
  double us = 4.096 * std::ldexp(1.0, qp->attr.timeout) * f->settings.timeoutScale;
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::micro>(us));
}

uint32_t rnrDelayUs(uint8_t code) {
  static const uint32_t kTable[32] = {655360, 10,    20,    30,    40,    60,     80,     120,
                                      160,    240,   320,   480,   640,   960,    1280,   1920,
                                      2560,   3840,  5120,  7680,  10240, 15360,  20480,  30720,
                                      40960,  61440, 81920, 122880, 163840, 245760, 327680, 491520};
  return kTable[code & 31];
}

// --- rings --------------------------------------------------------------------------------------

// The wake-up protocol between two processes is a Dekker pair on each side (publish,
// then look at the other's flag; set one's flag, then look at the other's progress), so
// those stores and loads are seq_cst: their single total order guarantees that at least
// one side sees the other. (No fences: ThreadSanitizer does not model them.)
uint64_t RingView::avail() const {
  return ctl->head.load(std::memory_order_seq_cst) - ctl->tail.load(std::memory_order_relaxed);
}

uint64_t RingView::space() const {
  return size - (ctl->head.load(std::memory_order_relaxed) - ctl->tail.load(std::memory_order_seq_cst));
}

void RingView::peek(uint64_t off, void* dst, size_t n) const {
  uint64_t pos = (ctl->tail.load(std::memory_order_relaxed) + off) & (size - 1);
  size_t first = std::min<size_t>(n, size - pos);
  memcpy(dst, data + pos, first);
  memcpy(static_cast<char*>(dst) + first, data, n - first);
}

void RingView::put(uint64_t off, const void* src, size_t n) {
  uint64_t pos = (ctl->head.load(std::memory_order_relaxed) + off) & (size - 1);
  size_t first = std::min<size_t>(n, size - pos);
  memcpy(data + pos, src, first);
  memcpy(data, static_cast<const char*>(src) + first, n - first);
}

namespace {

// Ring <-> application memory through the DMA functions (see fabric.h).
void ringToApp(const RingView& r, uint64_t off, char* dst, size_t n) {
  uint64_t pos = (r.ctl->tail.load(std::memory_order_relaxed) + off) & (r.size - 1);
  size_t first = std::min<size_t>(n, r.size - pos);
  dmaWrite(dst, r.data + pos, first);
  dmaWrite(dst + first, r.data, n - first);
}

void appToRing(RingView& r, uint64_t off, const char* src, size_t n) {
  uint64_t pos = (r.ctl->head.load(std::memory_order_relaxed) + off) & (r.size - 1);
  size_t first = std::min<size_t>(n, r.size - pos);
  dmaRead(r.data + pos, src, first);
  dmaRead(r.data, src + first, n - first);
}

void publish(Conn* c, uint64_t bytes) {
  c->tx.ctl->head.store(c->tx.ctl->head.load(std::memory_order_relaxed) + bytes, std::memory_order_seq_cst);
  c->kick = true;
}

void consume(Conn* c, uint64_t bytes) {
  c->rx.ctl->tail.store(c->rx.ctl->tail.load(std::memory_order_relaxed) + bytes, std::memory_order_seq_cst);
  if (c->rx.ctl->writerWaiting.load(std::memory_order_seq_cst) &&
      c->rx.ctl->writerWaiting.exchange(0, std::memory_order_seq_cst)) {
    c->kick = true;  // the peer's writer sleeps until we freed space
  }
}

// Returns true if there is room for `need` bytes; otherwise asks the reader to ring our
// doorbell when it frees space.
bool room(Conn* c, size_t need) {
  if (c->tx.space() >= need) {
    c->waitingSpace = false;
    return true;
  }
  c->waitingSpace = true;
  c->needSpace = need;
  c->tx.ctl->writerWaiting.store(1, std::memory_order_seq_cst);
  return false;
}

}  // namespace

void Fabric::flushKicks(Conn* c) {
  if (!c->kick || c->state != Conn::State::Up) return;
  c->kick = false;
  if (c->peerStatus->sleeping.load(std::memory_order_seq_cst)) {
    uint64_t one = 1;
    if (write(c->peerDoorbell, &one, sizeof(one)) < 0) trace("doorbell of %s: %s", c->peerEp.c_str(), strerror(errno));
  }
}

// --- requester ----------------------------------------------------------------------------------

namespace {

void armTimer(Fabric* f, Qp* qp, Clock::time_point now) {
  Clock::duration to = ackTimeout(f, qp);
  if (to == Clock::duration::max()) {
    qp->timerArmed = false;
    return;
  }
  qp->ackDeadline = now + to;
  qp->timerArmed = true;
  if (qp->ackDeadline < f->nicWakeAt) f->kickSelf();  // the NIC thread sleeps past it
}

void removeFromTx(Qp* qp) {
  if (!qp->inTxList) return;
  auto& l = qp->conn->txQps;
  l.erase(std::remove(l.begin(), l.end(), qp), l.end());
  qp->inTxList = false;
}

// Everything not yet sent is sent into the void: lost on the wire.
void voidTx(Fabric* f, Qp* qp, Clock::time_point now) {
  while (qp->txIdx < qp->sqHead) {
    SendWqe& w = qp->swqe(qp->txIdx);
    count(f, qp->dev, kUnreachableDrops, w.npsn);
    qp->txIdx++;
    qp->txOff = 0;
  }
  if (!qp->timerArmed) armTimer(f, qp, now);
}

// Restart transmission at the oldest unacknowledged WR.
void goBack(Qp* qp) {
  for (uint64_t i = qp->sqDone; i < qp->txIdx; ++i) {
    SendWqe& w = qp->swqe(i);
    w.readDone = 0;
    w.done = false;
  }
  qp->txIdx = qp->sqDone;
  qp->txOff = 0;
  qp->readsOut = 0;
}

bool canSend(const Qp* qp, Clock::time_point now) {
  if (qp->state() != IBV_QPS_RTS || qp->txIdx >= qp->sqHead) return false;
  if (qp->rnrWait && now < qp->rnrUntil) return false;
  const SendWqe& w = const_cast<Qp*>(qp)->swqe(qp->txIdx);
  if (w.opcode == IBV_WR_RDMA_READ && qp->readsOut >= std::max<int>(1, qp->attr.max_rd_atomic)) return false;
  return true;
}

Packet headerFor(const Qp* qp) {
  Packet h;
  memset(&h, 0, sizeof(h));
  h.destQpn = qp->attr.dest_qp_num;
  h.srcQpn = qp->qpn();
  const auto& gids = qp->dev->port.gids;
  if (qp->attr.ah_attr.grh.sgid_index < gids.size()) memcpy(h.sgid, gids[qp->attr.ah_attr.grh.sgid_index].raw, 16);
  memcpy(h.dgid, qp->attr.ah_attr.grh.dgid.raw, 16);
  return h;
}

struct Piece {
  const char* p;
  size_t n;
};

// The local memory of bytes [off, off+n) of WR `idx`, checked against the lkeys now.
bool gather(Fabric* f, Qp* qp, uint64_t idx, uint64_t off, uint64_t n, std::vector<Piece>* out) {
  const SendWqe& w = qp->swqe(idx);
  if (w.inlined) {
    out->push_back({reinterpret_cast<const char*>(qp->inlineData(idx)) + off, n});
    return true;
  }
  const ibv_sge* s = qp->sges(idx);
  for (uint32_t i = 0; i < w.nsge && n > 0; ++i) {
    if (off >= s[i].length) {
      off -= s[i].length;
      continue;
    }
    uint64_t k = std::min<uint64_t>(n, s[i].length - off);
    char* p = translate(f, qp->pd, s[i].lkey, s[i].addr + off, k, 0);
    if (p == nullptr) return false;
    out->push_back({p, k});
    n -= k;
    off = 0;
  }
  return n == 0;
}

}  // namespace

void Fabric::qpError(Qp* qp) {
  if (qp->state() == IBV_QPS_ERR) return;
  trace("QPN %u -> ERR", qp->qpn());
  qp->ibv()->state = IBV_QPS_ERR;
  qp->attr.qp_state = IBV_QPS_ERR;
  qp->generation++;
  removeFromTx(qp);
  for (uint64_t i = qp->sqDone; i < qp->sqHead; ++i) completeSend(qp, i, IBV_WC_WR_FLUSH_ERR);
  qp->sqDone = qp->txIdx = qp->sqHead;
  qp->txOff = 0;
  qp->timerArmed = false;
  qp->rnrWait = false;
  qp->readsOut = 0;
  if (qp->in.active && qp->in.haveRq) {
    completeRecv(qp, qp->in.rq, IBV_WC_WR_FLUSH_ERR, 0, IBV_WC_RECV, false, 0, false);
  }
  qp->in = InMsg();
  for (uint64_t i = qp->rqNext; i < qp->rqHead; ++i) {
    completeRecv(qp, i, IBV_WC_WR_FLUSH_ERR, 0, IBV_WC_RECV, false, 0, false);
  }
  qp->rqNext = qp->rqHead;
}

void Fabric::qpReset(Qp* qp) {
  removeFromTx(qp);
  purgeCqes(qp);
  qp->ibv()->state = IBV_QPS_RESET;
  uint32_t qpn = qp->qpn();
  ibv_qp_cap cap = qp->cap;
  qp->attr = ibv_qp_attr();
  qp->attr.qp_state = IBV_QPS_RESET;
  qp->attr.cap = cap;
  (void)qpn;
  qp->generation++;
  qp->sqHead = qp->sqFree = qp->sqDone = qp->txIdx = qp->txOff = 0;
  qp->rqHead = qp->rqFree = qp->rqNext = 0;
  qp->nextPsn = qp->expectedPsn = qp->ackedPsn = 0;
  qp->anyAcked = false;
  qp->timerArmed = qp->rnrWait = qp->nakSent = false;
  qp->readsOut = 0;
  qp->in = InMsg();
  qp->conn = nullptr;
}

void Fabric::forgetQp(Qp* qp) {
  removeFromTx(qp);
  for (auto& c : incoming) {
    auto& q = c->resp;
    q.erase(std::remove_if(q.begin(), q.end(), [qp](const RespItem& it) { return it.qp == qp; }), q.end());
  }
}

namespace {

// Fails the oldest outstanding WR with `st` and moves the QP to ERR (which flushes the rest).
void failOldest(Fabric* f, Qp* qp, ibv_wc_status st) {
  trace("QPN %u: WR %llu failed: %s", qp->qpn(), static_cast<unsigned long long>(qp->sqDone), ibv_wc_status_str(st));
  if (qp->sqDone < qp->sqHead) {
    f->completeSend(qp, qp->sqDone, st);
    qp->sqDone++;
  }
  f->qpError(qp);
}

// Route of a QP's requests: the connection to the process that owns (dgid, dest QPN).
Conn* route(Fabric* f, Qp* qp) {
  if (qp->conn != nullptr && qp->conn->state != Conn::State::Dead) return qp->conn;
  std::string ep;
  Conn* c = f->lookupQp(qp->attr.ah_attr.grh.dgid.raw, qp->attr.dest_qp_num, &ep) ? f->connectTo(ep) : nullptr;
  if (c != qp->conn) {
    removeFromTx(qp);
    qp->conn = c;
  }
  return c;
}

// Writes the next packet of `qp` (room for it was checked by the caller).
void sendOne(Fabric* f, Conn* c, Qp* qp, Clock::time_point now) {
  uint64_t idx = qp->txIdx;
  SendWqe& w = qp->swqe(idx);
  uint64_t mtu = mtuBytes(qp);
  Packet h = headerFor(qp);
  h.raddr = w.raddr + qp->txOff;
  h.rkey = w.rkey;
  h.arriveNs = arrivalOf(qp->dev, toNs(now));
  if (w.opcode == IBV_WR_RDMA_READ) {
    h.op = PktOp::ReadReq;
    h.psn = w.psn;
    h.npsn = w.npsn;
    h.len = w.len;
    c->tx.put(0, &h, kHdr);
    publish(c, kHdr);
    qp->txIdx++;
    qp->readsOut++;
  } else {
    if (w.len > 0x80000000u) {  // the port's max_msg_sz
      failOldest(f, qp, IBV_WC_LOC_LEN_ERR);
      return;
    }
    uint64_t seg = std::min<uint64_t>(segmentOf(f, qp->dev), w.len - qp->txOff);
    std::vector<Piece> pieces;
    if (!gather(f, qp, idx, qp->txOff, seg, &pieces)) {
      // The lkey no longer covers the buffer: a local protection error on this WR.
      while (qp->sqDone < idx) {  // earlier WRs were sent; they fail with the QP
        f->completeSend(qp, qp->sqDone, IBV_WC_WR_FLUSH_ERR);
        qp->sqDone++;
      }
      failOldest(f, qp, IBV_WC_LOC_PROT_ERR);
      return;
    }
    h.op = (w.opcode == IBV_WR_SEND || w.opcode == IBV_WR_SEND_WITH_IMM) ? PktOp::Send : PktOp::Write;
    h.psn = psnAdd(w.psn, static_cast<uint32_t>(qp->txOff / mtu));
    h.npsn = packets(seg, mtu);
    h.len = seg;
    h.flags = (qp->txOff == 0 ? kPktFirst : 0) | (qp->txOff + seg == w.len ? kPktLast : 0) |
              (hasImm(w.opcode) ? kPktImm : 0) | (w.solicited ? kPktSolicited : 0);
    h.imm = w.imm;
    c->tx.put(0, &h, kHdr);
    uint64_t off = kHdr;
    for (const Piece& p : pieces) {
      appToRing(c->tx, off, p.p, p.n);
      off += p.n;
    }
    publish(c, kHdr + seg);
    count(f, qp->dev, kSentBytes, seg);
    qp->txOff += seg;
    if (qp->txOff == w.len) {
      qp->txIdx++;
      qp->txOff = 0;
    }
  }
  count(f, qp->dev, kSentPkts, h.npsn);
  qp->txRingPos = c->tx.ctl->head.load(std::memory_order_relaxed);
  if (!qp->timerArmed) armTimer(f, qp, now);
}

size_t nextPacketBytes(Fabric* f, Qp* qp) {
  const SendWqe& w = qp->swqe(qp->txIdx);
  if (w.opcode == IBV_WR_RDMA_READ) return kHdr;
  return kHdr + std::min<uint64_t>(segmentOf(f, qp->dev), w.len - qp->txOff);
}

// The bytes the next packet of `qp` occupies on the wire (pace.h): its path-MTU packets'
// headers, RETH on a message's first, the immediate on its last.
uint64_t nextWireBytes(Fabric* f, Qp* qp) {
  const SendWqe& w = qp->swqe(qp->txIdx);
  if (w.opcode == IBV_WR_RDMA_READ) return wireBytes(0, 1, kRethBytes);
  uint64_t seg = std::min<uint64_t>(segmentOf(f, qp->dev), w.len - qp->txOff);
  bool write = w.opcode == IBV_WR_RDMA_WRITE || w.opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
  uint64_t extra = (write && qp->txOff == 0 ? kRethBytes : 0) +
                   (hasImm(w.opcode) && qp->txOff + seg == w.len ? kImmBytes : 0);
  return wireBytes(seg, packets(seg, mtuBytes(qp)), extra);
}

// Takes the next packet's bytes from its port's caps; false when the caps are not free yet
// (*retry: the earliest time one of the conn's waiting ports is).
bool paced(Fabric* f, Qp* qp, int64_t now, int64_t* retry) {
  if (!qp->dev->pacer.capped()) return true;
  int64_t at = 0;
  if (qp->dev->pacer.tryTransmit(nextWireBytes(f, qp), now, &at)) return true;
  count(f, qp->dev, kPacedWaits);
  *retry = std::min(*retry, at);
  return false;
}

void writeRequests(Fabric* f, Conn* c) {
  if (c->state != Conn::State::Up) return;
  Clock::time_point now = Clock::now();
  int64_t nowNs = toNs(now), retry = INT64_MAX;
  size_t waiting = 0;  // QPs in a row whose port is at its cap
  c->txReadyAt = 0;
  for (int budget = 64; budget > 0 && !c->txQps.empty(); --budget) {
    Qp* qp = c->txQps.front();
    if (!canSend(qp, now)) {
      c->txQps.pop_front();
      qp->inTxList = false;
      continue;
    }
    if (!qp->dev->port.up) {
      c->txQps.pop_front();
      qp->inTxList = false;
      voidTx(f, qp, now);
      continue;
    }
    if (!room(c, nextPacketBytes(f, qp))) return;
    c->txQps.pop_front();
    if (!paced(f, qp, nowNs, &retry)) {  // its port waits: the others go on, round robin
      c->txQps.push_back(qp);
      if (++waiting >= c->txQps.size()) break;
      continue;
    }
    waiting = 0;
    qp->inTxList = false;
    sendOne(f, c, qp, now);
    if (canSend(qp, now) && qp->conn == c) {
      c->txQps.push_back(qp);
      qp->inTxList = true;
    }
  }
  if (retry != INT64_MAX) f->waitUntil(&c->txReadyAt, retry);
}

}  // namespace

void Fabric::scheduleTx(Qp* qp) {
  Clock::time_point now = Clock::now();
  if (!canSend(qp, now)) {
    if (qp->rnrWait && qp->state() == IBV_QPS_RTS && qp->rnrUntil < nicWakeAt) kickSelf();
    return;
  }
  Conn* c = route(this, qp);
  if (c == nullptr || c->state == Conn::State::Dead || !qp->dev->port.up) {
    voidTx(this, qp, now);
    return;
  }
  if (!qp->inTxList) {
    c->txQps.push_back(qp);
    qp->inTxList = true;
  }
  writeRequests(this, c);
  flushKicks(c);
}

namespace {

// The requester learned that everything up to `psn` was executed.
void ackTo(Fabric* f, Qp* qp, uint32_t psn, Clock::time_point now) {
  if (!outstanding(qp)) return;
  uint32_t base = qp->swqe(qp->sqDone).psn;
  if (psnDiff(psn, base) < -1 || psnDiff(psn, qp->nextPsn) >= 0) return;  // stale or bogus
  bool progress = !qp->anyAcked || psnDiff(psn, qp->ackedPsn) > 0;
  while (qp->sqDone < qp->txIdx) {
    SendWqe& w = qp->swqe(qp->sqDone);
    if (psnDiff(psnAdd(w.psn, w.npsn - 1), psn) > 0) break;
    if (w.opcode == IBV_WR_RDMA_READ && !w.done) break;
    f->completeSend(qp, qp->sqDone, IBV_WC_SUCCESS);
    qp->sqDone++;
    progress = true;
  }
  if (!progress) return;
  qp->ackedPsn = psn;
  qp->anyAcked = true;
  qp->retriesLeft = qp->attr.retry_cnt;
  qp->rnrRetriesLeft = qp->attr.rnr_retry;
  if (outstanding(qp)) {
    armTimer(f, qp, now);
  } else {
    qp->timerArmed = false;
  }
}

// Finds the outstanding READ WR whose PSN range holds `psn`.
bool findRead(Qp* qp, uint32_t psn, uint64_t* idx) {
  for (uint64_t i = qp->sqDone; i < qp->txIdx; ++i) {
    const SendWqe& w = qp->swqe(i);
    int32_t d = psnDiff(psn, w.psn);
    if (w.opcode == IBV_WR_RDMA_READ && d >= 0 && static_cast<uint32_t>(d) < w.npsn) {
      *idx = i;
      return true;
    }
  }
  return false;
}

void placeRead(Fabric* f, Conn* c, Qp* qp, const Packet& h, Clock::time_point now) {
  uint64_t idx;
  if (!findRead(qp, h.psn, &idx)) return;
  SendWqe& w = qp->swqe(idx);
  if (h.raddr != w.readDone || w.readDone + h.len > w.len) return;  // a duplicate response
  const ibv_sge* s = qp->sges(idx);
  uint64_t off = w.readDone, src = kHdr, left = h.len;
  for (uint32_t i = 0; i < w.nsge && left > 0; ++i) {
    if (off >= s[i].length) {
      off -= s[i].length;
      continue;
    }
    uint64_t k = std::min<uint64_t>(left, s[i].length - off);
    char* dst = translate(f, qp->pd, s[i].lkey, s[i].addr + off, k, IBV_ACCESS_LOCAL_WRITE);
    if (dst == nullptr) {
      while (qp->sqDone < idx) {
        f->completeSend(qp, qp->sqDone, IBV_WC_WR_FLUSH_ERR);
        qp->sqDone++;
      }
      failOldest(f, qp, IBV_WC_LOC_PROT_ERR);
      return;
    }
    ringToApp(c->rx, src, dst, k);
    src += k;
    left -= k;
    off = 0;
  }
  w.readDone += h.len;
  if (h.flags & kPktLast) {
    w.done = true;
    qp->readsOut--;
    ackTo(f, qp, psnAdd(w.psn, w.npsn - 1), now);
  } else if (qp->timerArmed) {
    armTimer(f, qp, now);
  }
}

void handleNak(Fabric* f, Qp* qp, const Packet& h, Clock::time_point now) {
  ackTo(f, qp, psnAdd(h.psn, 0xffffff), now);  // a NAK acknowledges everything before it
  if (qp->state() != IBV_QPS_RTS || !outstanding(qp)) return;
  switch (h.nak) {
    case NakCode::Rnr:
      count(f, qp->dev, kRcvdRnrErr);
      if (qp->attr.rnr_retry != 7) {
        if (qp->rnrRetriesLeft == 0) {
          failOldest(f, qp, IBV_WC_RNR_RETRY_EXC_ERR);
          return;
        }
        qp->rnrRetriesLeft--;
      }
      goBack(qp);
      qp->rnrWait = true;
      qp->rnrUntil = now + std::chrono::microseconds(rnrDelayUs(h.rnrTimer));
      armTimer(f, qp, qp->rnrUntil);
      if (qp->rnrUntil < f->nicWakeAt) f->kickSelf();
      return;
    case NakCode::Sequence:
      count(f, qp->dev, kRcvdSeqErr);
      if (qp->retriesLeft == 0) {
        count(f, qp->dev, kRetryExceededErr);
        failOldest(f, qp, IBV_WC_RETRY_EXC_ERR);
        return;
      }
      qp->retriesLeft--;
      count(f, qp->dev, kCompleterRetryErr);
      goBack(qp);
      armTimer(f, qp, now);
      f->scheduleTx(qp);
      return;
    case NakCode::Access: failOldest(f, qp, IBV_WC_REM_ACCESS_ERR); return;
    case NakCode::InvalidReq: failOldest(f, qp, IBV_WC_REM_INV_REQ_ERR); return;
    default: failOldest(f, qp, IBV_WC_REM_OP_ERR); return;
  }
}

void readResponses(Fabric* f, Conn* c) {
  Clock::time_point now = Clock::now();
  c->rxReadyAt = 0;
  for (int budget = 64; budget > 0 && c->state == Conn::State::Up; --budget) {
    if (c->rx.avail() < kHdr) return;
    Packet h;
    c->rx.peek(0, &h, kHdr);
    uint64_t plen = h.op == PktOp::ReadResp ? h.len : 0;
    if (c->rx.avail() < kHdr + plen) return;
    if (notArrived(f, c, h, toNs(now))) return;
    Device* d = f->deviceForGid(h.dgid);
    Qp* qp = d != nullptr ? f->findQp(d, h.destQpn) : nullptr;
    if (qp != nullptr && qp->conn == c && qp->state() == IBV_QPS_RTS && h.srcQpn == qp->attr.dest_qp_num &&
        d->port.up) {
      count(f, d, kRcvdPkts, h.op == PktOp::ReadResp ? h.npsn : 1);
      count(f, d, kRcvdBytes, plen);
      switch (h.op) {
        case PktOp::Ack: ackTo(f, qp, h.psn, now); break;
        case PktOp::Nak: handleNak(f, qp, h, now); break;
        case PktOp::ReadResp: placeRead(f, c, qp, h, now); break;
        default: break;
      }
    }
    consume(c, kHdr + plen);
  }
}

// --- responder ----------------------------------------------------------------------------------

void queueResponse(Conn* c, Qp* qp, const Packet& req, PktOp op, uint32_t psn, NakCode nak) {
  if (op == PktOp::Ack && !c->resp.empty()) {
    RespItem& last = c->resp.back();
    if (last.qp == qp && last.hdr.op == PktOp::Ack) {  // coalesce: one ACK covers all
      // ... but never move it back: a re-acknowledged duplicate (a retransmission) must
      // not replace the ACK of newer requests queued before it.
      if (psnDiff(psn, last.hdr.psn) > 0) last.hdr.psn = psn;
      return;
    }
  }
  RespItem it;
  memset(&it.hdr, 0, sizeof(it.hdr));
  it.hdr.op = op;
  it.hdr.nak = nak;
  it.hdr.rnrTimer = qp->attr.min_rnr_timer;
  it.hdr.destQpn = req.srcQpn;
  it.hdr.srcQpn = qp->qpn();
  it.hdr.psn = psn;
  memcpy(it.hdr.sgid, req.dgid, 16);
  memcpy(it.hdr.dgid, req.sgid, 16);
  it.qp = qp;
  it.gen = qp->generation;
  c->resp.push_back(it);
}

// A request the responder cannot execute: NAK it and move the QP to ERR. Remote access
// errors also raise IBV_EVENT_QP_ACCESS_ERR on the responder (IBA 11.6.3, as mlx5 does).
void responderError(Fabric* f, Conn* c, Qp* qp, const Packet& h, NakCode nak) {
  trace("QPN %u: request psn %u refused (NAK %d)", qp->qpn(), h.psn, static_cast<int>(nak));
  queueResponse(c, qp, h, PktOp::Nak, h.psn, nak);
  if (nak == NakCode::Access) {
    ibv_async_event ev{};
    ev.event_type = IBV_EVENT_QP_ACCESS_ERR;
    ev.element.qp = qp->ibv();
    f->queueAsyncEvent(qp->ctx, ev);
  }
  f->qpError(qp);
}

// Copies `n` payload bytes (ring offset `src`) into the receive WQE's buffers at `off`.
// Returns IBV_WC_SUCCESS or the receive error.
ibv_wc_status scatter(Fabric* f, Conn* c, Qp* qp, uint64_t rq, uint64_t off, uint64_t src, uint64_t n) {
  RecvWqe& r = qp->rwqe(rq);
  const ibv_sge* s = qp->rsges(rq);
  uint64_t cap = 0;
  for (uint32_t i = 0; i < r.nsge; ++i) cap += s[i].length;
  if (off + n > cap) return IBV_WC_LOC_LEN_ERR;
  for (uint32_t i = 0; i < r.nsge && n > 0; ++i) {
    if (off >= s[i].length) {
      off -= s[i].length;
      continue;
    }
    uint64_t k = std::min<uint64_t>(n, s[i].length - off);
    char* dst = translate(f, qp->pd, s[i].lkey, s[i].addr + off, k, IBV_ACCESS_LOCAL_WRITE);
    if (dst == nullptr) return IBV_WC_LOC_PROT_ERR;
    ringToApp(c->rx, src, dst, k);
    src += k;
    n -= k;
    off = 0;
  }
  return IBV_WC_SUCCESS;
}

// A message that needs a receive WQE finds none: RNR NAK (true), or there is one (false).
bool nakIfNoReceive(Fabric* f, Conn* c, Qp* qp, const Packet& h) {
  if (qp->rqNext < qp->rqHead) return false;
  count(f, qp->dev, kSendRnrNak);
  qp->nakSent = true;
  queueResponse(c, qp, h, PktOp::Nak, h.psn, NakCode::Rnr);
  return true;
}

void beginMessage(Qp* qp, PktOp op, uint32_t psn) {
  qp->in = InMsg();
  qp->in.active = true;
  qp->in.op = op;
  qp->in.firstPsn = psn;
}

// A READ response (streamed by writeResponses) for request h.
void queueReadResponse(Conn* c, Qp* qp, const Packet& h) {
  queueResponse(c, qp, h, PktOp::ReadResp, h.psn, NakCode::None);
  RespItem& it = c->resp.back();
  it.hdr.rkey = h.rkey;
  it.hdr.raddr = h.raddr;
  it.hdr.len = h.len;
  it.hdr.npsn = h.npsn;
}

void executeWrite(Fabric* f, Conn* c, Qp* qp, const Packet& h) {
  bool first = h.flags & kPktFirst, last = h.flags & kPktLast, imm = h.flags & kPktImm;
  if (first) {
    if (!(qp->attr.qp_access_flags & IBV_ACCESS_REMOTE_WRITE)) return responderError(f, c, qp, h, NakCode::Access);
    if (imm && nakIfNoReceive(f, c, qp, h)) return;  // WRITE_WITH_IMM needs a receive WQE
    beginMessage(qp, PktOp::Write, h.psn);
  }
  char* dst = translate(f, qp->pd, h.rkey, h.raddr, h.len, IBV_ACCESS_REMOTE_WRITE);
  if (dst == nullptr) return responderError(f, c, qp, h, NakCode::Access);
  ringToApp(c->rx, kHdr, dst, h.len);
  qp->in.offset += h.len;
  qp->expectedPsn = psnAdd(h.psn, h.npsn);
  if (last) {
    if (imm) {
      uint64_t rq = qp->rqNext++;
      f->completeRecv(qp, rq, IBV_WC_SUCCESS, static_cast<uint32_t>(qp->in.offset), IBV_WC_RECV_RDMA_WITH_IMM,
                      true, h.imm, h.flags & kPktSolicited);
    }
    qp->in = InMsg();
  }
  queueResponse(c, qp, h, PktOp::Ack, psnAdd(h.psn, h.npsn - 1), NakCode::None);
}

void executeSend(Fabric* f, Conn* c, Qp* qp, const Packet& h) {
  bool first = h.flags & kPktFirst, last = h.flags & kPktLast;
  if (first) {
    if (nakIfNoReceive(f, c, qp, h)) return;
    beginMessage(qp, PktOp::Send, h.psn);
    qp->in.rq = qp->rqNext++;
    qp->in.haveRq = true;
  }
  ibv_wc_status st = scatter(f, c, qp, qp->in.rq, qp->in.offset, kHdr, h.len);
  if (st != IBV_WC_SUCCESS) {
    f->completeRecv(qp, qp->in.rq, st, 0, IBV_WC_RECV, false, 0, false);
    qp->in = InMsg();
    return responderError(f, c, qp, h, st == IBV_WC_LOC_LEN_ERR ? NakCode::InvalidReq : NakCode::RemoteOp);
  }
  qp->in.offset += h.len;
  qp->expectedPsn = psnAdd(h.psn, h.npsn);
  if (last) {
    f->completeRecv(qp, qp->in.rq, IBV_WC_SUCCESS, static_cast<uint32_t>(qp->in.offset), IBV_WC_RECV,
                    h.flags & kPktImm, h.imm, h.flags & kPktSolicited);
    qp->in = InMsg();
  }
  queueResponse(c, qp, h, PktOp::Ack, psnAdd(h.psn, h.npsn - 1), NakCode::None);
}

void executeRead(Fabric* f, Conn* c, Qp* qp, const Packet& h) {
  if (qp->attr.max_dest_rd_atomic == 0) return responderError(f, c, qp, h, NakCode::InvalidReq);
  if (!(qp->attr.qp_access_flags & IBV_ACCESS_REMOTE_READ) ||
      translate(f, qp->pd, h.rkey, h.raddr, h.len, IBV_ACCESS_REMOTE_READ) == nullptr) {
    return responderError(f, c, qp, h, NakCode::Access);
  }
  qp->expectedPsn = psnAdd(h.psn, h.npsn);
  queueReadResponse(c, qp, h);
}

void handleRequest(Fabric* f, Conn* c, const Packet& h) {
  Device* d = f->deviceForGid(h.dgid);
  Qp* qp = d != nullptr ? f->findQp(d, h.destQpn) : nullptr;
  if (d != nullptr) {
    count(f, d, kRcvdPkts, h.npsn);
    if (h.op == PktOp::Write || h.op == PktOp::Send) count(f, d, kRcvdBytes, h.len);
  }
  ibv_qp_state st = qp != nullptr ? qp->state() : IBV_QPS_RESET;
  if (qp == nullptr || (st != IBV_QPS_RTR && st != IBV_QPS_RTS && st != IBV_QPS_SQD) ||
      h.srcQpn != qp->attr.dest_qp_num || memcmp(h.sgid, qp->attr.ah_attr.grh.dgid.raw, 16) != 0 ||
      !d->port.up) {
    trace("request to QPN %u dropped (no such connected QP in RTR/RTS, or port down)", h.destQpn);
    return;  // silently, as on the wire: the requester's ACK timer decides
  }
  int32_t diff = psnDiff(h.psn, qp->expectedPsn);
  if (diff < 0) {  // a retransmission of something already executed
    count(f, d, kDuplicateRequest);
    if (h.op == PktOp::ReadReq) {
      queueReadResponse(c, qp, h);
    } else if (h.flags & kPktLast) {
      queueResponse(c, qp, h, PktOp::Ack, psnAdd(h.psn, h.npsn - 1), NakCode::None);
    }
    return;
  }
  if (diff > 0 || (!(h.flags & kPktFirst) && !qp->in.active && h.op != PktOp::ReadReq)) {
    count(f, d, kOutOfSeqRequest);
    if (!qp->nakSent) {
      qp->nakSent = true;
      queueResponse(c, qp, h, PktOp::Nak, qp->expectedPsn, NakCode::Sequence);
    }
    return;
  }
  qp->nakSent = false;
  switch (h.op) {
    case PktOp::Write: executeWrite(f, c, qp, h); break;
    case PktOp::Send: executeSend(f, c, qp, h); break;
    case PktOp::ReadReq: executeRead(f, c, qp, h); break;
    default: break;
  }
}

void readRequests(Fabric* f, Conn* c) {
  int64_t now = toNs(Clock::now());
  c->rxReadyAt = 0;
  for (int budget = 64; budget > 0 && c->state == Conn::State::Up; --budget) {
    if (c->resp.size() >= kMaxQueuedResponses) return;
    if (c->rx.avail() < kHdr) return;
    Packet h;
    c->rx.peek(0, &h, kHdr);
    uint64_t plen = (h.op == PktOp::Write || h.op == PktOp::Send) ? h.len : 0;
    if (c->rx.avail() < kHdr + plen) return;
    if (notArrived(f, c, h, now)) return;
    handleRequest(f, c, h);
    consume(c, kHdr + plen);
  }
}

void writeResponses(Fabric* f, Conn* c) {
  int64_t now = toNs(Clock::now());
  c->txReadyAt = 0;
  for (int budget = 64; budget > 0 && c->state == Conn::State::Up && !c->resp.empty(); --budget) {
    RespItem& it = c->resp.front();
    Pacer& pacer = it.qp->dev->pacer;
    it.hdr.arriveNs = arrivalOf(it.qp->dev, now);
    if (it.hdr.op != PktOp::ReadResp) {
      if (!room(c, kHdr)) return;
      if (pacer.capped()) pacer.chargeAnyway(wireBytes(0, 1, kAethBytes), now);  // never held
      c->tx.put(0, &it.hdr, kHdr);
      publish(c, kHdr);
      count(f, it.qp->dev, kSentPkts);
      c->resp.pop_front();
      continue;
    }
    Qp* qp = it.qp;
    if (qp->generation != it.gen || qp->state() == IBV_QPS_ERR) {
      c->resp.pop_front();
      continue;
    }
    uint64_t mtu = mtuBytes(qp);
    uint64_t seg = std::min<uint64_t>(segmentOf(f, qp->dev), it.hdr.len - it.sent);
    char* src = translate(f, qp->pd, it.hdr.rkey, it.hdr.raddr + it.sent, seg, IBV_ACCESS_REMOTE_READ);
    if (src == nullptr) {  // deregistered while the response streamed
      Packet req = it.hdr;
      std::swap(req.sgid, req.dgid);
      req.srcQpn = it.hdr.destQpn;
      c->resp.pop_front();
      responderError(f, c, qp, req, NakCode::Access);
      continue;
    }
    if (!room(c, kHdr + seg)) return;
    int64_t at = 0;
    if (pacer.capped() && !pacer.tryTransmit(wireBytes(seg, packets(seg, mtu), kAethBytes), now, &at)) {
      count(f, qp->dev, kPacedWaits);
      f->waitUntil(&c->txReadyAt, at);
      return;
    }
    Packet h = it.hdr;
    h.psn = psnAdd(it.hdr.psn, static_cast<uint32_t>(it.sent / mtu));
    h.npsn = packets(seg, mtu);
    h.raddr = it.sent;  // offset within the READ
    h.len = seg;
    h.flags = (it.sent == 0 ? kPktFirst : 0) | (it.sent + seg == it.hdr.len ? kPktLast : 0);
    c->tx.put(0, &h, kHdr);
    appToRing(c->tx, kHdr, src, seg);
    publish(c, kHdr + seg);
    count(f, qp->dev, kSentPkts, h.npsn);
    count(f, qp->dev, kSentBytes, seg);
    it.sent += seg;
    if (it.sent == it.hdr.len) c->resp.pop_front();
  }
}

}  // namespace

// --- the progress pass and timers -------------------------------------------------------------

void Fabric::drainRx(Conn* c) {
  // Packets the peer published before it died were on the wire: they still arrive.
  c->draining = true;
  for (int rounds = 0; rounds < 1 << 16 && c->state == Conn::State::Up && c->rx.avail() >= kHdr; ++rounds) {
    if (c->initiator) {
      readResponses(this, c);
    } else {
      c->resp.clear();  // nobody reads responses any more: keep executing requests
      readRequests(this, c);
    }
  }
}

void Fabric::progress() {
  for (auto& kv : outgoing) {
    Conn* c = kv.second.get();
    if (c->state != Conn::State::Up) continue;
    readResponses(this, c);
    writeRequests(this, c);
  }
  for (auto& cp : incoming) {
    Conn* c = cp.get();
    if (c->state != Conn::State::Up) continue;
    readRequests(this, c);
    writeResponses(this, c);
  }
  for (auto& kv : outgoing) flushKicks(kv.second.get());
  for (auto& c : incoming) flushKicks(c.get());
}

void Fabric::runTimers(Clock::time_point now) {
  for (auto& kv : qps) {
    Qp* qp = kv.second;
    if (qp->state() != IBV_QPS_RTS) continue;
    if (qp->rnrWait && now >= qp->rnrUntil) {
      qp->rnrWait = false;
      scheduleTx(qp);
    }
    if (!qp->timerArmed || now < qp->ackDeadline) continue;
    if (!outstanding(qp)) {
      qp->timerArmed = false;
      continue;
    }
    // The ACK timer of a packet starts when it leaves the NIC: one still queued in the
    // request ring of a live peer (a slow responder: sanitizers, many ranks on few cores)
    // has not timed out yet. A dead peer's connection is closed, so its packets do.
    Conn* c = qp->conn;
    if (c != nullptr && c->state == Conn::State::Up &&
        c->tx.ctl->tail.load(std::memory_order_relaxed) < qp->txRingPos) {
      armTimer(this, qp, now);
      continue;
    }
    if (qp->retriesLeft == 0) {
      count(this, qp->dev, kRetryExceededErr);
      failOldest(this, qp, IBV_WC_RETRY_EXC_ERR);
      continue;
    }
    qp->retriesLeft--;
    count(this, qp->dev, kCompleterRetryErr);
    trace("QPN %u: ACK timeout, retransmitting from WR %llu (%d retries left)", qp->qpn(),
          static_cast<unsigned long long>(qp->sqDone), qp->retriesLeft);
    goBack(qp);
    armTimer(this, qp, now);
    scheduleTx(qp);
  }
}

Clock::time_point Fabric::nextTimer() const {
  Clock::time_point t = Clock::time_point::max();
  for (const auto& kv : qps) {
    const Qp* qp = kv.second;
    if (qp->state() != IBV_QPS_RTS) continue;
    if (qp->timerArmed) t = std::min(t, qp->ackDeadline);
    if (qp->rnrWait) t = std::min(t, qp->rnrUntil);
  }
  auto waits = [&t](const Conn* c) {
    if (c->state != Conn::State::Up) return;
    for (int64_t at : {c->txReadyAt, c->rxReadyAt}) {
      if (at != 0) t = std::min(t, fromNs(at));
    }
  };
  for (const auto& kv : outgoing) waits(kv.second.get());
  for (const auto& c : incoming) waits(c.get());
  return t;
}

void Fabric::waitUntil(int64_t* slot, int64_t ns) {
  *slot = *slot == 0 ? ns : std::min(*slot, ns);
  if (fromNs(ns) < nicWakeAt) kickSelf();  // the NIC thread sleeps past it
}

bool Fabric::anyWork() const {
  // A conn waiting for a rate cap or a cable's delay has no work until then: nextTimer()
  // wakes the NIC thread for it.
  int64_t now = toNs(Clock::now());
  auto ready = [now](int64_t at) { return at == 0 || at <= now; };
  for (const auto& kv : outgoing) {
    const Conn* c = kv.second.get();
    if (c->state != Conn::State::Up) continue;
    if (c->rx.avail() >= kHdr && ready(c->rxReadyAt)) return true;
    if (!c->txQps.empty() && ready(c->txReadyAt) && (!c->waitingSpace || c->tx.space() >= c->needSpace)) return true;
  }
  for (const auto& cp : incoming) {
    const Conn* c = cp.get();
    if (c->state != Conn::State::Up) continue;
    if (c->rx.avail() >= kHdr && c->resp.size() < kMaxQueuedResponses && ready(c->rxReadyAt)) return true;
    if (!c->resp.empty() && ready(c->txReadyAt) && (!c->waitingSpace || c->tx.space() >= c->needSpace)) return true;
  }
  return false;
}

}  // namespace meshfab
