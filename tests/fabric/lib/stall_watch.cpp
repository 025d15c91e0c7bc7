// SPDX-License-Identifier: Apache-2.0
// MESHFAB_STALL_MS=N (diagnostics, tests/fabric/README.md): a thread that looks at this
// process's transport every 2 ms and prints to stderr (lines start with STALL)
//   - each time it waited over 20 ms for the fabric lock, with what the NIC thread was doing
//     (nicPhase: 0 working, 1 waiting for the lock, 2 sleeping in epoll_wait, 3 yielding);
//   - once per stall, when a ring from a peer held unread packets for N ms: the NIC thread's
//     sleep, every connection's rings and waits, every QP with work queued.
// It found the NIC thread starved of the lock by spinning pollers (lib/cq.cpp, pollCq).
#include <time.h>

#include <cstdio>
#include <map>

#include "engine.h"

namespace meshfab {

namespace {
double relMs(int64_t at, int64_t now) { return at == 0 ? 0.0 : static_cast<double>(at - now) / 1e6; }
}  // namespace

void Fabric::stallWatchLoop(int ms) {
  // Per connection: its rx ring's tail, since when it has not moved with bytes waiting, and
  // whether this stall was printed.
  struct Seen {
    uint64_t tail = 0;
    Clock::time_point since;
    bool reported = false;
  };
  std::map<const Conn*, Seen> seen;
  while (!stallStop.load()) {
    struct timespec ts = {0, 2000000};
    nanosleep(&ts, nullptr);
    Clock::time_point asked = Clock::now();
    int phaseBefore = nicPhase.load();
    std::unique_lock<std::mutex> lk(mu);
    Clock::time_point now = Clock::now();
    double waited = std::chrono::duration<double, std::milli>(now - asked).count();
    if (waited > 20) {
      fprintf(stderr, "STALL pid %d: the watchdog waited %.1f ms for the fabric lock (nic phase before %d, now %d)\n", pid,
              waited, phaseBefore, nicPhase.load());
    }
    bool stuck = false;
    std::string which;
    auto look = [&](const Conn* c) {
      if (c->state != Conn::State::Up || c->rx.ctl == nullptr) return;
      uint64_t tail = c->rx.ctl->tail.load();
      auto it = seen.find(c);
      if (it == seen.end() || it->second.tail != tail || c->rx.avail() < kHdr) {
        seen[c] = Seen{tail, now, false};
        return;
      }
      if (!it->second.reported && now - it->second.since > std::chrono::milliseconds(ms)) {
        it->second.reported = true;
        stuck = true;
        which += " " + c->peerEp;
      }
    };
    for (auto& kv : outgoing) look(kv.second.get());
    for (auto& c : incoming) look(c.get());
    if (!stuck) continue;
    fprintf(stderr, "STALL pid %d: unread bytes from%s for %d ms; nic phase %d\n", pid, which.c_str(), ms, nicPhase.load());
    timespec rt;
    clock_gettime(CLOCK_REALTIME, &rt);
    int64_t nowNs = toNs(Clock::now());
    fprintf(stderr, "STALL pid %d at %ld.%03ld: nic sleeping=%u wakeIn=%.3f ms anyWork=%d\n",
            pid, static_cast<long>(rt.tv_sec), rt.tv_nsec / 1000000,
            status ? status->sleeping.load() : 9u,
            nicWakeAt == Clock::time_point::max() ? -1.0 : relMs(toNs(nicWakeAt), nowNs), anyWork() ? 1 : 0);
    auto conn = [&](const char* kind, const std::string& key, Conn* c) {
      fprintf(stderr,
              "STALL   %s %s state=%d tx: avail=%llu space=%llu writerWaiting=%u | rx: avail=%llu | txQps=%zu waitingSpace=%d "
              "need=%zu txReadyIn=%.3f rxReadyIn=%.3f resp=%zu peerSleeping=%u\n",
              kind, key.c_str(), static_cast<int>(c->state), (unsigned long long)(c->tx.ctl ? c->tx.avail() : 0),
              (unsigned long long)(c->tx.ctl ? c->tx.space() : 0), c->tx.ctl ? c->tx.ctl->writerWaiting.load() : 0u,
              (unsigned long long)(c->rx.ctl ? c->rx.avail() : 0), c->txQps.size(), c->waitingSpace ? 1 : 0, c->needSpace,
              relMs(c->txReadyAt, nowNs), relMs(c->rxReadyAt, nowNs), c->resp.size(),
              c->peerStatus ? c->peerStatus->sleeping.load() : 9u);
    };
    for (auto& kv : outgoing) conn("out", kv.first, kv.second.get());
    for (auto& c : incoming) conn("in ", c->peerEp, c.get());
    for (auto& kv : qps) {
      Qp* q = kv.second;
      if (q->sqDone >= q->sqHead && q->rqNext >= q->rqHead) continue;
      fprintf(stderr,
              "STALL   qp %u dev %s state=%d sqHead=%llu txIdx=%llu txOff=%llu sqDone=%llu timer=%d rnrWait=%d inTxList=%d "
              "conn=%s rq: head=%llu next=%llu\n",
              q->qpn(), q->dev->name.c_str(), static_cast<int>(q->state()), (unsigned long long)q->sqHead,
              (unsigned long long)q->txIdx, (unsigned long long)q->txOff, (unsigned long long)q->sqDone,
              q->timerArmed ? 1 : 0, q->rnrWait ? 1 : 0, q->inTxList ? 1 : 0,
              q->conn ? q->conn->peerEp.c_str() : "-", (unsigned long long)q->rqHead, (unsigned long long)q->rqNext);
    }
  }
}

}  // namespace meshfab
