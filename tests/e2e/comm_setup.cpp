// SPDX-License-Identifier: Apache-2.0
#include "comm_setup.h"

#include <cstring>

namespace e2e {

PendingConn* ConnectDriver::addConnect(int peer, int k, const std::string& handle,
                                       const std::string& label) {
  if (handle.size() != NCCL_NET_HANDLE_MAXSIZE) {
    fail("%s: the published handle has %zu bytes, expected %d", label.c_str(), handle.size(),
         NCCL_NET_HANDLE_MAXSIZE);
  }
  items_.emplace_back();
  PendingConn& p = items_.back();
  p.isConnect = true;
  p.peer = peer;
  p.k = k;
  p.label = label;
  memcpy(p.handle, handle.data(), handle.size());
  return &p;
}

PendingConn* ConnectDriver::addAccept(int peer, int k, void* listenComm,
                                      const std::string& label) {
  items_.emplace_back();
  PendingConn& p = items_.back();
  p.isConnect = false;
  p.peer = peer;
  p.k = k;
  p.label = label;
  p.listenComm = listenComm;
  return &p;
}

bool ConnectDriver::sweep() {
  bool progress = false;
  for (PendingConn& p : items_) {
    if (p.finished) continue;
    ++p.calls;
    ncclResult_t rc;
    if (p.isConnect) {
      rc = ctx_.net->connect(p.dev >= 0 ? p.dev : ctx_.dev, p.handle, &p.comm, &p.devComm);
    } else {
      rc = ctx_.net->accept(p.listenComm, &p.comm, &p.devComm);
    }
    if (rc != ncclSuccess) {
      p.finished = true;
      p.finishedAt = Clock::now();
      p.rc = rc;
      p.comm = nullptr;
      progress = true;
      if (!p.mayFail) {
        ctx_.net.check(rc, p.isConnect ? "connect" : "accept",
                       format("%s (after %.2f s, call #%ld)", p.label.c_str(), p.seconds(),
                              p.calls));
      }
    } else if (p.comm != nullptr) {
      p.finished = true;
      p.finishedAt = Clock::now();
      progress = true;
    } else if (p.mayFail && p.giveUp.expired()) {
      p.finished = true;
      p.timedOut = true;
      p.finishedAt = Clock::now();
      progress = true;
    }
  }
  return progress;
}

bool ConnectDriver::allFinished() const {
  for (const PendingConn& p : items_) {
    if (!p.finished) return false;
  }
  return true;
}

std::string ConnectDriver::pendingSummary() const {
  std::string out;
  int shown = 0, pending = 0;
  for (const PendingConn& p : items_) {
    if (p.finished) continue;
    ++pending;
    if (shown++ < 12) out += format("%s%s (%ld calls, %.1f s)", out.empty() ? "" : ", ",
                                    p.label.c_str(), p.calls, p.seconds());
  }
  if (pending > shown) out += format(", ... %d more", pending - shown);
  return format("%d of %zu still pending: %s", pending, items_.size(), out.c_str());
}

void ConnectDriver::timeoutFailure(const Deadline& deadline) const {
  fail("connections not established before the deadline (%s): %s", deadline.what().c_str(),
       pendingSummary().c_str());
}

void* listenAndPublish(Context& ctx, const std::string& name, const std::string& label, int dev) {
  alignas(16) unsigned char handle[NCCL_NET_HANDLE_MAXSIZE] = {};
  void* listenComm = nullptr;
  if (dev < 0) dev = ctx.dev;
  ctx.net.check(ctx.net->listen(dev, handle, &listenComm), "listen", format("%s (dev %d)", label.c_str(), dev));
  if (listenComm == nullptr) fail("listen returned success but a NULL listen comm (%s)", label.c_str());
  ctx.rv->publish(name, std::string(reinterpret_cast<char*>(handle), sizeof(handle)));
  return listenComm;
}

namespace {

std::string handleName(int listener, int connector, int k, const std::string& tag) {
  return format("h.%d.%d.%d.%s", listener, connector, k, tag.c_str());
}

// Moves finished connects (send comms) or accepts (recv comms) into the table.
void fillTable(CommTable* table, const std::vector<PendingConn*>& items, int count) {
  for (PendingConn* p : items) {
    PeerComms& pc = (*table)[p->peer];
    std::vector<void*>& comms = p->isConnect ? pc.send : pc.recv;
    std::vector<double>& seconds = p->isConnect ? pc.connectSeconds : pc.acceptSeconds;
    comms.resize(static_cast<size_t>(count), nullptr);
    seconds.resize(static_cast<size_t>(count), 0);
    comms[static_cast<size_t>(p->k)] = p->comm;
    seconds[static_cast<size_t>(p->k)] = p->seconds();
  }
}

struct WantedHandle {
  int peer;
  int k;
  std::string name;
  bool have = false;
};

}  // namespace

CommTable establish(Context& ctx, const EstablishSpec& spec, const Deadline& deadline) {
  setPhase(format("establish '%s': %zu peers to connect, %zu to accept, %d comms each",
                  spec.tag.c_str(), spec.connectTo.size(), spec.acceptFrom.size(), spec.count));
  CommTable table;
  ConnectDriver driver(ctx);
  std::vector<PendingConn*> accepts, connects;
  for (int peer : spec.acceptFrom) {
    PeerComms& pc = table[peer];
    for (int k = 0; k < spec.count; ++k) {
      std::string label = format("accept rank%d<-rank%d #%d (%s)", ctx.rank, peer, k, spec.tag.c_str());
      void* lc = listenAndPublish(ctx, handleName(ctx.rank, peer, k, spec.tag), label,
                                  spec.devices > 0 ? k % spec.devices : -1);
      pc.listen.push_back(lc);
      accepts.push_back(driver.addAccept(peer, k, lc, label));
    }
  }
  std::vector<WantedHandle> wanted;
  for (int peer : spec.connectTo) {
    table[peer];
    for (int k = 0; k < spec.count; ++k) {
      wanted.push_back({peer, k, handleName(peer, ctx.rank, k, spec.tag)});
    }
  }
  size_t missing = wanted.size();
  Clock::time_point lastLook;
  auto pickUpHandles = [&]() {
    // Rate-limited: each look is a stat over 9p.
    if (missing == 0 || secondsSince(lastLook) < 0.002) return false;
    lastLook = Clock::now();
    bool progress = false;
    for (WantedHandle& w : wanted) {
      std::string bytes;
      if (w.have || !ctx.rv->tryFetch(w.name, &bytes)) continue;
      w.have = true;
      --missing;
      progress = true;
      connects.push_back(driver.addConnect(
          w.peer, w.k, bytes,
          format("connect rank%d->rank%d #%d (%s)", ctx.rank, w.peer, w.k, spec.tag.c_str())));
      if (spec.devices > 0) connects.back()->dev = w.k % spec.devices;
    }
    return progress;
  };
  while (true) {
    driver.drive(deadline, pickUpHandles);
    if (missing == 0) break;
    // Everything we have is up; wait for the rest of the handles (still driving nothing).
    if (deadline.expired()) {
      std::string names;
      for (const WantedHandle& w : wanted) {
        if (!w.have) names += " " + w.name;
      }
      fail("timed out (%s) waiting for peers' listen handles:%s", deadline.what().c_str(),
           names.c_str());
    }
    if (!pickUpHandles()) pollPause(2000);
  }
  fillTable(&table, accepts, spec.count);
  fillTable(&table, connects, spec.count);
  return table;
}

void closeAll(Context& ctx, CommTable& table) {
  setPhase("closing comms");
  std::string firstError;
  auto closeOne = [&](ncclResult_t rc, const char* what, int peer, size_t k) {
    if (rc != ncclSuccess && firstError.empty()) {
      firstError = format("%s(rank%d peer rank%d #%zu) returned %s (%d); plugin's last WARN: %s",
                          what, ctx.rank, peer, k, resultName(rc), static_cast<int>(rc),
                          ctx.net.lastWarn().c_str());
    }
  };
  for (auto& kv : table) {
    PeerComms& pc = kv.second;
    for (size_t k = 0; k < pc.send.size(); ++k) {
      if (pc.send[k]) closeOne(ctx.net->closeSend(pc.send[k]), "closeSend", kv.first, k);
      pc.send[k] = nullptr;
    }
    for (size_t k = 0; k < pc.recv.size(); ++k) {
      if (pc.recv[k]) closeOne(ctx.net->closeRecv(pc.recv[k]), "closeRecv", kv.first, k);
      pc.recv[k] = nullptr;
    }
    for (size_t k = 0; k < pc.listen.size(); ++k) {
      if (pc.listen[k]) closeOne(ctx.net->closeListen(pc.listen[k]), "closeListen", kv.first, k);
      pc.listen[k] = nullptr;
    }
  }
  if (!firstError.empty()) throw Failure(firstError);
}

}  // namespace e2e
