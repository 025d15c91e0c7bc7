// SPDX-License-Identifier: Apache-2.0
// nccl-mesh-perf's benchmark through the plugin's v8 ABI: connect, the timed and verified
// ping-pongs and streams, the exchange of the data checks, close.
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <string>
#include <thread>
#include <vector>

#include "mesh/tools/perf_report.h"
#include "perf.h"

namespace perf {

// Seeds of the verified transfers: each size, direction and window slot its own pattern, so
// data landing in the wrong buffer or left over from a previous transfer is caught.
uint64_t pingSeed(size_t size) { return (uint64_t(size) << 8) | 1; }
uint64_t pongSeed(size_t size) { return (uint64_t(size) << 8) | 2; }
uint64_t slotSeed(size_t size, size_t slot) { return (uint64_t(size) << 8) | (0x40 + slot); }

void Perf::checkDeadline(const char* what, size_t size) const {
  if (Clock::now() > deadline_) {
    throw Error(strf("timed out (--timeout %.0f s) in %s, size %zu, rank %d <-> rank %d", o_.timeout, what, size,
                     o_.rank, peer_));
  }
}

void Perf::connect() {
  alignas(16) char handle[NCCL_NET_HANDLE_MAXSIZE] = {};
  check(net_->listen(o_.dev, handle, &listenComm_), strf("listen(dev %d)", o_.dev));
  std::string mine = std::string(handle, sizeof(handle)) + mesh::encodePerfParams(o_.p);
  std::string theirs = rv_->exchange("hello", mine);
  if (theirs.size() < sizeof(handle)) throw Error("the peer's handle is truncated");
  std::string error;
  mesh::PerfParams theirParams;
  if (!mesh::decodePerfParams(theirs.substr(sizeof(handle)), &theirParams, &error)) {
    throw Error("the peer's parameters: " + error);
  }
  p_ = o_.p;
  if (o_.mode == Mode::Server) {
    p_ = theirParams;  // the client decides what is measured
    validate(p_);
  } else if (o_.mode == Mode::Files && !(theirParams == p_)) {
    throw Error("the two ranks were started with different options:\n  mine:   " + mesh::encodePerfParams(p_) +
                "\n  theirs: " + mesh::encodePerfParams(theirParams));
  }
  alignas(16) char peerHandle[NCCL_NET_HANDLE_MAXSIZE];
  memcpy(peerHandle, theirs.data(), sizeof(peerHandle));
  ncclNetDeviceHandle_v8_t* dh = nullptr;
  // Non-blocking, interleaved: neither call may wait for the other side.
  while (sendComm_ == nullptr || recvComm_ == nullptr) {
    if (sendComm_ == nullptr) check(net_->connect(o_.dev, peerHandle, &sendComm_, &dh), strf("connect to rank %d", peer_));
    if (recvComm_ == nullptr) check(net_->accept(listenComm_, &recvComm_, &dh), strf("accept from rank %d", peer_));
    checkDeadline("connect/accept", 0);
    if (sendComm_ == nullptr || recvComm_ == nullptr) std::this_thread::sleep_for(std::chrono::microseconds(500));
  }
  size_t maxLat = p_.lat && !p_.latSizes.empty() ? *std::max_element(p_.latSizes.begin(), p_.latSizes.end()) : 0;
  size_t maxBw = p_.bw && !p_.bwSizes.empty() ? *std::max_element(p_.bwSizes.begin(), p_.bwSizes.end()) : 0;
  // Distinct slots per outstanding message when that fits in 64 MiB.
  size_t bwArena = std::max(maxBw, std::min(maxBw * static_cast<size_t>(p_.bwWindow), size_t(64) << 20));
  size_t n = std::max({maxLat, bwArena, size_t(8)});
  sendBuf_.reset(new Buffer(n));
  recvBuf_.reset(new Buffer(n));
  memset(sendBuf_->p, 0x5a, n);
  check(net_->regMr(sendComm_, sendBuf_->p, n, NCCL_PTR_HOST, &sendMh_), "regMr(send buffer)");
  check(net_->regMr(recvComm_, recvBuf_->p, n, NCCL_PTR_HOST, &recvMh_), "regMr(recv buffer)");
  report_.window = p_.bwWindow;
  report_.peer = rv_->describe();
}

void* Perf::postSend(void* data, int size, int tag) {
  void* req = nullptr;
  while (req == nullptr) {
    check(net_->isend(sendComm_, data, size, tag, sendMh_, &req), strf("isend(%d bytes, tag %d) to rank %d", size, tag, peer_));
    if (req == nullptr) checkDeadline("isend (waiting for the receiver to post)", static_cast<size_t>(size));
  }
  return req;
}

void* Perf::postRecv(void* data, int size, int tag) {
  void* req = nullptr;
  while (req == nullptr) {
    check(net_->irecv(recvComm_, 1, &data, &size, &tag, &recvMh_, &req), strf("irecv(%d bytes, tag %d) from rank %d", size, tag, peer_));
    if (req == nullptr) checkDeadline("irecv (comm not ready)", static_cast<size_t>(size));
  }
  return req;
}

// Like NCCL's proxy thread (proxy.cc's progress loop), yield the CPU after a poll that
// found nothing, and otherwise spin.
bool Perf::poll(void* req, const char* what, size_t size, int* got) {
  int done = 0, sizes[1] = {-1};
  check(net_->test(req, &done, sizes), strf("test(%s, %zu bytes)", what, size));
  if (done && got) *got = sizes[0];
  if (!done) {
    if (idleSleepUs_ > 0) {
      std::this_thread::sleep_for(std::chrono::microseconds(idleSleepUs_));
    } else {
      sched_yield();
    }
  }
  return done != 0;
}

int Perf::wait(void* req, const char* what, size_t size) {
  int got = -1;
  unsigned spins = 0;
  while (!poll(req, what, size, &got)) {
    if (++spins % 1024 == 0) checkDeadline(what, size);
  }
  return got;
}

void Perf::timedPingPong(size_t size) {
  int n = static_cast<int>(size);
  std::vector<double> samples;
  int total = p_.latWarmup + p_.latIters;
  // Receives are posted two messages ahead, as NCCL keeps its pipeline steps posted, so
  // each FIFO slot travels during the previous round trip, not in front of the data.
  std::deque<void*> ahead;
  auto postAhead = [&](int index) {
    if (index < total) ahead.push_back(postRecv(recvBuf_->p, n, 1));
  };
  postAhead(0);
  postAhead(1);
  for (int i = 0; i < total; ++i) {
    if (o_.rank == 0) {
      Clock::time_point t0 = Clock::now();
      void* sr = postSend(sendBuf_->p, n, 1);
      postAhead(i + 2);
      void* rr = ahead.front();
      ahead.pop_front();
      bool sendDone = false, recvDone = false;
      int got = -1;
      unsigned spins = 0;
      while (!sendDone || !recvDone) {
        if (!sendDone) sendDone = poll(sr, "ping isend", size, nullptr);
        if (!recvDone) recvDone = poll(rr, "pong irecv", size, &got);
        if (++spins % 1024 == 0) checkDeadline("ping-pong", size);
      }
      if (got != n) throw Error(strf("pong of %zu bytes reported %d bytes", size, got));
      if (i >= p_.latWarmup) samples.push_back(since(t0) * 1e6 / 2);
    } else {
      void* rr = ahead.front();
      ahead.pop_front();
      int got = wait(rr, "ping irecv", size);
      if (got != n) throw Error(strf("ping of %zu bytes reported %d bytes", size, got));
      void* sr = postSend(sendBuf_->p, n, 1);
      postAhead(i + 2);
      wait(sr, "pong isend", size);
    }
  }
  if (o_.rank != 0) return;
  std::sort(samples.begin(), samples.end());
  double sum = 0;
  for (double s : samples) sum += s;
  mesh::LatRow row;
  row.size = size;
  row.iters = p_.latIters;
  row.typUs = samples[samples.size() / 2];
  row.avgUs = sum / static_cast<double>(samples.size());
  row.minUs = samples.front();
  report_.lat.push_back(row);
}

// One round trip with patterns: each rank counts the bytes wrong in what it received.
long long Perf::verifiedPingPong(size_t size) {
  int n = static_cast<int>(size);
  memset(recvBuf_->p, 0, size);
  void* rr = postRecv(recvBuf_->p, n, 1);
  if (o_.rank == 0) {
    mesh::fillPattern(sendBuf_->p, size, pingSeed(size));
    wait(postSend(sendBuf_->p, n, 1), "verified ping isend", size);
  }
  int got = wait(rr, "verified irecv", size);
  if (got != n) throw Error(strf("verified message of %zu bytes reported %d bytes", size, got));
  long long wrong = static_cast<long long>(
      mesh::countPatternErrors(recvBuf_->p, size, o_.rank == 0 ? pongSeed(size) : pingSeed(size)));
  if (o_.rank == 1) {
    mesh::fillPattern(sendBuf_->p, size, pongSeed(size));
    wait(postSend(sendBuf_->p, n, 1), "verified pong isend", size);
  }
  return wrong;
}

void Perf::latency() {
  for (size_t i = 0; i < p_.latSizes.size(); ++i) {
    size_t size = p_.latSizes[i];
    progress_.show(strf("latency %zu/%zu: %zu B", i + 1, p_.latSizes.size(), size));
    timedPingPong(size);
    if (p_.check) mine_.lat[size] = verifiedPingPong(size);
    if (o_.rank == 0 && p_.check) report_.lat.back().wrong = mine_.lat[size];
  }
}

// `count` messages rank 0 -> rank 1, at most the window outstanding, cycling over `slots`
// buffer slots; measured: the time from the first accepted post to the last completion.
void Perf::timedStream(size_t size, int count, bool measured, size_t slots) {
  int n = static_cast<int>(size);
  std::vector<void*> reqs;  // outstanding, in posting order
  int posted = 0, completed = 0;
  unsigned spins = 0;
  Clock::time_point t0;
  while (completed < count) {
    while (posted < count && static_cast<int>(reqs.size()) < p_.bwWindow) {
      char* slot = (o_.rank == 0 ? sendBuf_.get() : recvBuf_.get())->at((static_cast<size_t>(posted) % slots) * size);
      reqs.push_back(o_.rank == 0 ? postSend(slot, n, 2) : postRecv(slot, n, 2));
      if (posted++ == 0) t0 = Clock::now();  // the first accepted post starts the clock
    }
    int got = -1;
    if (poll(reqs.front(), o_.rank == 0 ? "bw isend" : "bw irecv", size, &got)) {
      if (o_.rank == 1 && got != n) throw Error(strf("bandwidth receive of %zu bytes reported %d bytes", size, got));
      reqs.erase(reqs.begin());
      ++completed;
    } else if (++spins % 1024 == 0) {
      checkDeadline("bandwidth", size);
      progress_.show(strf("bandwidth %zu B: %d/%d messages", size, completed, count));
    }
  }
  if (measured && o_.rank == 0) {
    mesh::BwRow row;
    row.size = size;
    row.iters = count;
    row.seconds = since(t0);
    report_.bw.push_back(row);
  }
}

// One message per slot, each with its own pattern; the receiver clears its slots first.
long long Perf::verifiedStream(size_t size, size_t slots) {
  int n = static_cast<int>(size);
  std::vector<void*> reqs;
  for (size_t s = 0; s < slots; ++s) {
    if (o_.rank == 0) {
      mesh::fillPattern(sendBuf_->at(s * size), size, slotSeed(size, s));
      reqs.push_back(postSend(sendBuf_->at(s * size), n, 3));
    } else {
      memset(recvBuf_->at(s * size), 0, size);
      reqs.push_back(postRecv(recvBuf_->at(s * size), n, 3));
    }
  }
  long long wrong = 0;
  for (size_t s = 0; s < slots; ++s) {
    int got = wait(reqs[s], "verified bandwidth message", size);
    if (o_.rank == 1) {
      if (got != n) throw Error(strf("verified message of %zu bytes reported %d bytes", size, got));
      wrong += static_cast<long long>(mesh::countPatternErrors(recvBuf_->at(s * size), size, slotSeed(size, s)));
    }
  }
  return wrong;
}

void Perf::bandwidth() {
  idleSleepUs_ = o_.bwIdleSleepUs;
  for (size_t i = 0; i < p_.bwSizes.size(); ++i) {
    size_t size = p_.bwSizes[i];
    progress_.show(strf("bandwidth %zu/%zu: %zu B", i + 1, p_.bwSizes.size(), size));
    int iters = static_cast<int>(std::min<size_t>(static_cast<size_t>(p_.bwIters), std::max<size_t>(1, p_.bwBytes / size)));
    // Warmup costs at most a quarter of the byte budget: big sizes are their own warmup.
    int warm = static_cast<int>(std::min<size_t>(static_cast<size_t>(std::min(p_.bwWarmup, iters)), p_.bwBytes / 4 / size));
    size_t slots = std::max<size_t>(1, std::min<size_t>(static_cast<size_t>(p_.bwWindow), sendBuf_->size / size));
    if (warm > 0) timedStream(size, warm, false, slots);
    timedStream(size, iters, true, slots);
    if (p_.check) {
      long long wrong = verifiedStream(size, slots);
      if (o_.rank == 1) mine_.bw[size] = wrong;
    }
  }
  idleSleepUs_ = 0;
}

void Perf::exchangeChecks() {
  std::string theirs = rv_->exchange("checks", mesh::encodeCheckCounts(mine_));
  mesh::CheckCounts peer;
  std::string error;
  if (!mesh::decodeCheckCounts(theirs, &peer, &error)) throw Error("the peer's check counts: " + error);
  if (o_.rank != 0) return;
  for (mesh::LatRow& l : report_.lat) {
    auto it = peer.lat.find(l.size);
    if (l.wrong >= 0 && it != peer.lat.end()) l.wrong += it->second;
  }
  for (mesh::BwRow& b : report_.bw) {
    auto it = peer.bw.find(b.size);
    if (it != peer.bw.end()) b.wrong = it->second;
  }
}

long long Perf::myWrong() const {
  long long total = 0;
  for (const auto& kv : mine_.lat) total += kv.second;
  for (const auto& kv : mine_.bw) total += kv.second;
  return total;
}

void Perf::close() {
  progress_.done();
  rv_->exchange("done", "");  // the peer must be done with its side before the comms go away
  check(net_->deregMr(sendComm_, sendMh_), "deregMr(send buffer)");
  check(net_->deregMr(recvComm_, recvMh_), "deregMr(recv buffer)");
  check(net_->closeSend(sendComm_), "closeSend");
  check(net_->closeRecv(recvComm_), "closeRecv");
  check(net_->closeListen(listenComm_), "closeListen");
}

}  // namespace perf
