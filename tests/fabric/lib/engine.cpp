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
// Files: the requester is engine_requester.cpp, the responder engine_responder.cpp; this one
// holds the rings, the progress pass and the timers that drive both (engine.h: what the three
// share).
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine.h"

namespace meshfab {

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

void Fabric::flushKicks(Conn* c) {
  if (!c->kick || c->state != Conn::State::Up) return;
  c->kick = false;
  if (c->peerStatus->sleeping.load(std::memory_order_seq_cst)) {
    uint64_t one = 1;
    if (write(c->peerDoorbell, &one, sizeof(one)) < 0) trace("doorbell of %s: %s", c->peerEp.c_str(), strerror(errno));
  }
}

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
