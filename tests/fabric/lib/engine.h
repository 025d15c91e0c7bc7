// SPDX-License-Identifier: Apache-2.0
// The RC engine (see engine.cpp for the protocol it runs), shared by its three files:
// engine_requester.cpp (sending WRs as packets; ACKs, NAKs and READ responses arriving;
// go-back-N), engine_responder.cpp (executing requests; queueing and streaming responses)
// and engine.cpp (the rings, the progress pass and the timers that drive both). Private to
// tests/fabric/lib: everything here runs under Fabric::mu.
#pragma once

#include <algorithm>
#include <cstring>

#include "fabric.h"

namespace meshfab {

constexpr size_t kHdr = sizeof(Packet);
constexpr size_t kMaxQueuedResponses = 4096;  // then the responder stops reading requests

inline uint64_t mtuBytes(const Qp* qp) { return 128u << qp->attr.path_mtu; }

inline uint32_t packets(uint64_t len, uint64_t mtu) {
  return static_cast<uint32_t>(std::max<uint64_t>(1, (len + mtu - 1) / mtu));
}

inline bool hasImm(ibv_wr_opcode op) { return op == IBV_WR_RDMA_WRITE_WITH_IMM || op == IBV_WR_SEND_WITH_IMM; }

inline bool outstanding(const Qp* qp) { return qp->sqDone < qp->txIdx || qp->txOff > 0; }

// Largest payload of one packet from device d: smaller on a capped port, so that the QPs and
// flows sharing it take turns at a finer grain, as a NIC's packet scheduler does.
inline uint64_t segmentOf(const Fabric* f, const Device* d) {
  return d->pacer.capped() ? std::min(f->settings.segment, f->settings.pacedSegment) : f->settings.segment;
}

// Where a packet leaving device d at `now` arrives (Packet::arriveNs): 0 = at once.
inline int64_t arrivalOf(const Device* d, int64_t now) {
  return d->pacer.delayNs() > 0 ? now + d->pacer.delayNs() : 0;
}

// The reader leaves a packet that has not reached this end of its cable yet in the ring.
inline bool notArrived(Fabric* f, Conn* c, const Packet& h, int64_t now) {
  if (h.arriveNs <= now || c->draining) return false;
  f->waitUntil(&c->rxReadyAt, h.arriveNs);
  return true;
}

inline void count(Fabric* f, Device* d, StatsCounter c, uint64_t n = 1) {
  f->devStats(d)->counters[c].fetch_add(n, std::memory_order_relaxed);
}

// For the counters that are maxima (kMaxPassedOver).
inline void raiseTo(Fabric* f, Device* d, StatsCounter c, uint64_t v) {
  std::atomic<uint64_t>& m = f->devStats(d)->counters[c];
  uint64_t cur = m.load(std::memory_order_relaxed);
  while (cur < v && !m.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
  }
}

// --- rings (the packets' way between two processes) -----------------------------------------

// Ring <-> application memory through the DMA functions (see fabric.h).
inline void ringToApp(const RingView& r, uint64_t off, char* dst, size_t n) {
  uint64_t pos = (r.ctl->tail.load(std::memory_order_relaxed) + off) & (r.size - 1);
  size_t first = std::min<size_t>(n, r.size - pos);
  dmaWrite(dst, r.data + pos, first);
  dmaWrite(dst + first, r.data, n - first);
}

inline void appToRing(RingView& r, uint64_t off, const char* src, size_t n) {
  uint64_t pos = (r.ctl->head.load(std::memory_order_relaxed) + off) & (r.size - 1);
  size_t first = std::min<size_t>(n, r.size - pos);
  dmaRead(r.data + pos, src, first);
  dmaRead(r.data, src + first, n - first);
}

inline void publish(Conn* c, uint64_t bytes) {
  c->tx.ctl->head.store(c->tx.ctl->head.load(std::memory_order_relaxed) + bytes, std::memory_order_seq_cst);
  c->kick = true;
}

inline void consume(Conn* c, uint64_t bytes) {
  c->rx.ctl->tail.store(c->rx.ctl->tail.load(std::memory_order_relaxed) + bytes, std::memory_order_seq_cst);
  if (c->rx.ctl->writerWaiting.load(std::memory_order_seq_cst) &&
      c->rx.ctl->writerWaiting.exchange(0, std::memory_order_seq_cst)) {
    c->kick = true;  // the peer's writer sleeps until we freed space
  }
}

// Returns true if there is room for `need` bytes; otherwise asks the reader to ring our
// doorbell when it frees space.
inline bool room(Conn* c, size_t need) {
  if (c->tx.space() >= need) {
    c->waitingSpace = false;
    return true;
  }
  c->waitingSpace = true;
  c->needSpace = need;
  c->tx.ctl->writerWaiting.store(1, std::memory_order_seq_cst);
  return false;
}

// --- requester (engine_requester.cpp) --------------------------------------------------------

void armTimer(Fabric* f, Qp* qp, Clock::time_point now);
// Restart transmission at the oldest unacknowledged WR.
void goBack(Qp* qp);
// Fails the oldest outstanding WR with `st` and moves the QP to ERR (which flushes the rest).
void failOldest(Fabric* f, Qp* qp, ibv_wc_status st);
void writeRequests(Fabric* f, Conn* c);
void readResponses(Fabric* f, Conn* c);

// --- responder (engine_responder.cpp) --------------------------------------------------------

void readRequests(Fabric* f, Conn* c);
void writeResponses(Fabric* f, Conn* c);

}  // namespace meshfab
