// SPDX-License-Identifier: Apache-2.0
// The RC requester (engine.cpp says what it does, engine.h what it shares): WRs out as packets,
// round robin between the QPs of a connection, under the port's and the wire's rate caps;
// ACKs, NAKs and READ responses in; the ACK timer and go-back-N.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "engine.h"

namespace meshfab {

void purgeCqes(Qp* qp);

// --- requester ----------------------------------------------------------------------------------

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

namespace {

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

}  // namespace

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

namespace {

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
  qp->eceSet = false;
  qp->eceOptions = 0;
  qp->eceCleared = false;
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

// Fails the oldest outstanding WR with `st` and moves the QP to ERR (which flushes the rest).
void failOldest(Fabric* f, Qp* qp, ibv_wc_status st) {
  trace("QPN %u: WR %llu failed: %s", qp->qpn(), static_cast<unsigned long long>(qp->sqDone), ibv_wc_status_str(st));
  if (qp->sqDone < qp->sqHead) {
    f->completeSend(qp, qp->sqDone, st);
    qp->sqDone++;
  }
  f->qpError(qp);
}

namespace {

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

// Takes the next packet's bytes from its port's caps and its destination's inbound ones;
// false when the caps are not free yet (*retry: the earliest time one of the conn's waiting
// ports is).
bool paced(Fabric* f, Qp* qp, int64_t now, int64_t* retry) {
  if (!qp->dev->pacer.capped() && qp->inbound == nullptr) return true;
  int64_t at = 0;
  if (qp->dev->pacer.tryTransmit(nextWireBytes(f, qp), now, &at, qp->inbound, &qp->inboundSlot)) return true;
  count(f, qp->dev, kPacedWaits);
  *retry = std::min(*retry, at);
  return false;
}

}  // namespace

void writeRequests(Fabric* f, Conn* c) {
  if (c->state != Conn::State::Up) return;
  Clock::time_point now = Clock::now();
  int64_t nowNs = toNs(now), retry = INT64_MAX;
  c->txReadyAt = 0;
  // Round robin per port, as a NIC's send scheduler arbitrates its QPs: a QP that sends goes
  // to the back; a QP whose port (or wire) is at its cap keeps its place, so the next free
  // turn of that port is the turn of the QP that has waited longest for it. (Rotating the
  // waiting ones too could put the list back in the same order round after round, and the
  // QP at its head then took every freed turn: on a Spark pair's all-to-all, a receiver's
  // FIFO writes waited behind its own data on the same function until that data ran out.)
  size_t i = 0;
  for (int budget = 64; budget > 0 && i < c->txQps.size(); --budget) {
    Qp* qp = c->txQps[i];
    if (!canSend(qp, now)) {
      c->txQps.erase(c->txQps.begin() + static_cast<std::ptrdiff_t>(i));
      qp->inTxList = false;
      continue;
    }
    if (!qp->dev->port.up) {
      c->txQps.erase(c->txQps.begin() + static_cast<std::ptrdiff_t>(i));
      qp->inTxList = false;
      voidTx(f, qp, now);
      continue;
    }
    if (!room(c, nextPacketBytes(f, qp))) return;
    if (!paced(f, qp, nowNs, &retry)) {  // its port waits: the others go on; it keeps its place
      ++i;
      continue;
    }
    c->txQps.erase(c->txQps.begin() + static_cast<std::ptrdiff_t>(i));
    qp->inTxList = false;
    sendOne(f, c, qp, now);
    // The port's turn went to qp: every other QP of the port that had a packet ready for the
    // same caps (a switch's inbound cap is the destination's) was passed over.
    for (Qp* other : c->txQps) {
      if (other->dev == qp->dev && other->inbound == qp->inbound && canSend(other, now)) {
        raiseTo(f, qp->dev, kMaxPassedOver, ++other->passedOver);
      }
    }
    qp->passedOver = 0;
    if (canSend(qp, now) && qp->conn == c) {
      c->txQps.push_back(qp);
      qp->inTxList = true;
    }
  }
  if (retry != INT64_MAX) f->waitUntil(&c->txReadyAt, retry);
}

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
    qp->passedOver = 0;
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

}  // namespace

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

}  // namespace meshfab
