// SPDX-License-Identifier: Apache-2.0
// The RC responder (engine.cpp says what it does, engine.h what it shares): requests executed
// in PSN order (WRITE, SEND, READ), duplicates acknowledged again, sequence and RNR NAKs,
// remote access errors; ACKs and READ responses queued and streamed back.
#include <algorithm>
#include <cstring>
#include <utility>

#include "engine.h"

namespace meshfab {

// --- responder ----------------------------------------------------------------------------------

namespace {

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
  count(f, qp->dev, kExecutedReads);
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

}  // namespace

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
      if (it.qp->inbound != nullptr) it.qp->inbound->chargeAnyway(wireBytes(0, 1, kAethBytes), now);
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
    if ((pacer.capped() || qp->inbound != nullptr) &&
        !pacer.tryTransmit(wireBytes(seg, packets(seg, mtu), kAethBytes), now, &at, qp->inbound,
                           &qp->respInboundSlot)) {
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

}  // namespace meshfab
