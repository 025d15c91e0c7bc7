// SPDX-License-Identifier: Apache-2.0
#include "transfer.h"

#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>

namespace e2e {

HostBuffer::HostBuffer(size_t size) : size_(size) {
  void* p = nullptr;
  size_t alloc = std::max<size_t>(size, 1);
  if (posix_memalign(&p, 4096, alloc) != 0) fail("cannot allocate %zu bytes", size);
  memset(p, 0, alloc);
  data_ = static_cast<uint8_t*>(p);
}

HostBuffer::~HostBuffer() { free(data_); }

HostBuffer& HostBuffer::operator=(HostBuffer&& o) noexcept {
  if (this != &o) {
    free(data_);
    data_ = o.data_;
    size_ = o.size_;
    o.data_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}

void* regHost(Context& ctx, void* comm, const HostBuffer& buf, const std::string& label) {
  void* mh = nullptr;
  ctx.net.check(ctx.net->regMr(comm, buf.data(), std::max<size_t>(buf.size(), 1), NCCL_PTR_HOST, &mh),
                "regMr", format("%s: comm %p, %zu bytes at %p", label.c_str(), comm, buf.size(),
                                static_cast<void*>(buf.data())));
  if (mh == nullptr) fail("regMr returned success but a NULL mhandle (%s)", label.c_str());
  return mh;
}

void deregHost(Context& ctx, void* comm, void* mhandle, const std::string& label) {
  ctx.net.check(ctx.net->deregMr(comm, mhandle), "deregMr",
                format("%s: comm %p, mhandle %p", label.c_str(), comm, mhandle));
}

Op sendOp(void* comm, void* data, int size, int tag, void* mh, std::string label) {
  Op op;
  op.send = true;
  op.comm = comm;
  op.n = 1;
  op.data[0] = data;
  op.sizes[0] = size;
  op.tags[0] = tag;
  op.mh[0] = mh;
  op.label = std::move(label);
  return op;
}

Op recvOp(void* comm, void* data, int size, int tag, void* mh, std::string label) {
  Op op = sendOp(comm, data, size, tag, mh, std::move(label));
  op.send = false;
  return op;
}

int Engine::tryPost(Op& op, ncclResult_t* rcOut) {
  ++op.postTries;
  void* req = nullptr;
  ncclResult_t rc;
  if (op.send) {
    rc = ctx_.net->isend(op.comm, op.data[0], static_cast<size_t>(op.sizes[0]), op.tags[0], op.mh[0], &req);
  } else {
    size_t sizes[kMaxGroup];
    for (int i = 0; i < op.n; ++i) sizes[i] = static_cast<size_t>(op.sizes[i]);
    rc = ctx_.net->irecv(op.comm, op.n, op.data, sizes, op.tags, op.mh, &req);
  }
  if (rc != ncclSuccess && rcOut != nullptr) {
    *rcOut = rc;
    return -1;
  }
  std::string sizes;
  if (rc != ncclSuccess) {
    for (int i = 0; i < op.n; ++i) sizes += format("%s%d:tag%d", i ? "," : "", op.sizes[i], op.tags[i]);
  }
  ctx_.net.check(rc, op.send ? "isend" : "irecv",
                 format("%s (comm %p, n=%d, sizes:tags %s)", op.label.c_str(), op.comm, op.n,
                        sizes.c_str()));
  if (req == nullptr) return 0;  // not yet: retry later
  op.request = req;
  op.posted = true;
  op.postedAt = Clock::now();
  return 1;
}

bool Engine::tryComplete(Op& op) {
  int done = 0;
  size_t sizes[kMaxGroup];
  ncclResult_t rc = ctx_.net->test(op.request, &done, sizes, op.n);
  ctx_.net.check(rc, "test", format("%s (request %p, %s posted %.3f s ago)", op.label.c_str(),
                                    op.request, op.send ? "isend" : "irecv",
                                    secondsSince(op.postedAt)));
  if (!done) return false;
  op.done = true;
  op.doneAt = Clock::now();
  // A size the plugin did not write reads -1, which no check accepts.
  for (int i = 0; i < op.n; ++i) {
    op.got[i] = sizes[i] == netapi::kUnwrittenSize ? -1 : static_cast<int>(sizes[i]);
  }
  op.request = nullptr;  // freed by the plugin once done
  if (!op.send) checkFlush(op);
  return true;
}

// After every completed receive, iflush as NCCL does. Host memory needs no GPUDirect
// flush, so the plugin must answer with a NULL request — unless NCCL_MESH_FORCE_FLUSH=1,
// when it must issue the loopback RDMA READ and the request must complete (the READ is
// ordered after the data it follows, so the data checks that come next still hold).
void Engine::checkFlush(Op& op) {
  static const bool forced = [] {
    const char* v = getenv("NCCL_MESH_FORCE_FLUSH");
    return v != nullptr && strcmp(v, "1") == 0;
  }();
  int sizes[kMaxGroup];
  for (int i = 0; i < op.n; ++i) sizes[i] = op.got[i] < 0 ? 0 : op.got[i];
  void* req = nullptr;
  ctx_.net.check(ctx_.net->iflush(op.comm, op.n, op.data, sizes, op.mh, &req), "iflush", op.label);
  bool anyData = false;
  for (int i = 0; i < op.n; ++i) anyData = anyData || sizes[i] > 0;
  if (!forced || !anyData) {
    if (req != nullptr) throw Failure(format("%s: iflush of host memory returned a request", op.label.c_str()));
    return;
  }
  if (req == nullptr) throw Failure(format("%s: NCCL_MESH_FORCE_FLUSH=1 but iflush returned no request", op.label.c_str()));
  ++flushes_;
  Deadline flushDeadline(30.0, "flush");
  int done = 0;
  while (!done) {
    size_t ignored[kMaxGroup];
    ctx_.net.check(ctx_.net->test(req, &done, ignored, 0), "test(flush)", op.label);
    if (!done && flushDeadline.expired()) throw Failure(format("%s: flush did not complete in 30 s", op.label.c_str()));
  }
}

std::string Engine::pendingSummary(const std::vector<Op>& ops) const {
  std::string out;
  int pending = 0, shown = 0;
  for (const Op& op : ops) {
    if (op.done) continue;
    ++pending;
    if (shown++ >= 10) continue;
    out += format("\n    %s: %s", op.label.c_str(),
                  op.posted ? format("posted %.1f s ago, request %p not done",
                                     secondsSince(op.postedAt), op.request).c_str()
                            : format("not posted (%ld tries returned a NULL request)",
                                     op.postTries).c_str());
  }
  if (pending > shown) out += format("\n    ... %d more", pending - shown);
  return format("%d of %zu ops not done:%s", pending, ops.size(), out.c_str());
}

void Engine::run(std::vector<Op>& ops, const Deadline& deadline, const EngineOptions& opt) {
  // Per comm: the op indexes in posting order, the next one to post, how many are out.
  struct Lane {
    std::vector<size_t> order;
    size_t next = 0;
    int outstanding = 0;
  };
  std::map<void*, Lane> lanes;
  for (size_t i = 0; i < ops.size(); ++i) lanes[ops[i].comm].order.push_back(i);
  std::vector<size_t> inFlight;
  size_t remaining = ops.size();
  int window = std::min(std::max(opt.window, 1), kMaxRequests);
  while (remaining > 0) {
    bool progress = false;
    for (auto& kv : lanes) {
      Lane& lane = kv.second;
      while (lane.next < lane.order.size() && lane.outstanding < window) {
        size_t idx = lane.order[lane.next];
        if (tryPost(ops[idx]) != 1) break;
        ++lane.next;
        ++lane.outstanding;
        inFlight.push_back(idx);
        progress = true;
      }
    }
    if (opt.shuffleTests) std::shuffle(inFlight.begin(), inFlight.end(), rng_);
    for (size_t j = 0; j < inFlight.size();) {
      Op& op = ops[inFlight[j]];
      if (tryComplete(op)) {
        --lanes[op.comm].outstanding;
        --remaining;
        progress = true;
        inFlight[j] = inFlight.back();
        inFlight.pop_back();
      } else {
        ++j;
      }
    }
    if (remaining == 0) break;
    if (deadline.expired()) {
      fail("transfers not complete before the deadline (%s): %s", deadline.what().c_str(),
           pendingSummary(ops).c_str());
    }
    if (!progress) {
      if (opt.idleSleepUs > 0) {
        pollPause(opt.idleSleepUs);
      } else {
        sched_yield();
      }
    }
  }
}

size_t Engine::postOnly(std::vector<Op>& ops, const Deadline& deadline, int* errors) {
  struct Lane {
    std::vector<size_t> order;
    size_t next = 0;
    bool broken = false;
  };
  std::map<void*, Lane> lanes;
  for (size_t i = 0; i < ops.size(); ++i) lanes[ops[i].comm].order.push_back(i);
  size_t posted = 0;
  auto open = [&] {
    for (auto& kv : lanes) {
      if (!kv.second.broken && kv.second.next < kv.second.order.size()) return true;
    }
    return false;
  };
  while (open() && !deadline.expired()) {
    bool progress = false;
    for (auto& kv : lanes) {
      Lane& lane = kv.second;
      while (!lane.broken && lane.next < lane.order.size()) {
        ncclResult_t rc = ncclSuccess;
        int r = tryPost(ops[lane.order[lane.next]], errors ? &rc : nullptr);
        if (r == 0) break;
        progress = true;
        if (r < 0) {
          lane.broken = true;
          ++*errors;
          break;
        }
        ++lane.next;
        ++posted;
      }
    }
    if (!progress) pollPause(200);
  }
  return posted;
}

// --- phases -------------------------------------------------------------------------------

void Phase::addSend(void* comm, uint8_t* data, int size, int tag, void* mh, uint64_t seed, std::string label) {
  fillPattern(data, static_cast<size_t>(size), seed);
  ops.push_back(sendOp(comm, data, size, tag, mh, std::move(label)));
  bytes += static_cast<size_t>(size);
}

void Phase::addRecv(void* comm, int n, uint8_t* const* data, const int* capacities, const int* tags, void* mh,
                    const int* sizes, const uint64_t* seeds, std::string label, int guard) {
  Op op;
  op.send = false;
  op.comm = comm;
  op.n = n;
  op.label = std::move(label);
  for (int i = 0; i < n; ++i) {
    memset(data[i], kCanary, static_cast<size_t>(capacities[i] + guard));
    op.data[i] = data[i];
    op.sizes[i] = capacities[i];
    op.tags[i] = tags[i];
    op.mh[i] = mh;
    expects.push_back({ops.size(), i, data[i], capacities[i], sizes[i], seeds[i], guard});
  }
  ops.push_back(op);
}

std::vector<int> Phase::addShuffledGroup(std::mt19937& rng, int firstTag, const int* sizes, int capacity,
                                         const GroupSide& send, const GroupSide& recv,
                                         const std::function<std::string(int slot)>& sendLabel,
                                         const std::string& recvLabel, int guard) {
  int recvTags[kMaxGroup], sendTags[kMaxGroup];
  for (int i = 0; i < kMaxGroup; ++i) recvTags[i] = sendTags[i] = firstTag + i;
  std::shuffle(recvTags, recvTags + kMaxGroup, rng);
  std::shuffle(sendTags, sendTags + kMaxGroup, rng);
  uint8_t* dst[kMaxGroup];
  int caps[kMaxGroup], want[kMaxGroup];
  uint64_t seeds[kMaxGroup];
  for (int i = 0; i < kMaxGroup; ++i) {
    int slot = recvTags[i] - firstTag;
    dst[i] = recv.at + static_cast<size_t>(i) * recv.stride;
    caps[i] = capacity;
    want[i] = sizes[slot];
    seeds[i] = recv.seeds[slot];
  }
  for (int i = 0; i < kMaxGroup; ++i) {
    int slot = sendTags[i] - firstTag;
    addSend(send.comm, send.at + static_cast<size_t>(i) * send.stride, sizes[slot], sendTags[i], send.mh,
            send.seeds[slot], sendLabel(slot));
  }
  addRecv(recv.comm, kMaxGroup, dst, caps, recvTags, recv.mh, want, seeds, recvLabel, guard);
  return std::vector<int>(sendTags, sendTags + kMaxGroup);
}

double runPhase(Context& ctx, Engine& engine, Phase& phase, bool shuffle) {
  setPhase(ctx.scenario + ": " + phase.name);
  Clock::time_point t0 = Clock::now();
  EngineOptions opt;
  opt.shuffleTests = shuffle;
  engine.run(phase.ops, ctx.deadline, opt);
  double seconds = secondsSince(t0);
  for (const Phase::Expect& e : phase.expects) {
    const Op& op = phase.ops[e.op];
    std::string where = format("%s, buffer %d of %d (tag %d, capacity %d, peer sent %d bytes)",
                               op.label.c_str(), e.idx, op.n, op.tags[e.idx], e.capacity, e.size);
    int landed = std::min(e.size, e.capacity);
    if (op.got[e.idx] != landed) {
      fail("%s: test() reported %d bytes received, expected %d", where.c_str(), op.got[e.idx], landed);
    }
    std::string bad = checkPattern(e.data, static_cast<size_t>(landed), e.seed);
    if (!bad.empty()) fail("%s: data corrupt: %s", where.c_str(), bad.c_str());
    bad = checkFill(e.data + landed, static_cast<size_t>(e.capacity + e.guard - landed), kCanary);
    if (!bad.empty()) {
      fail("%s: written past the %d bytes that landed (posted %d, guard %d after it): %s", where.c_str(), landed,
           e.capacity, e.guard, bad.c_str());
    }
  }
  say("%s %s: %zu ops ok in %.3f s", ctx.scenario.c_str(), phase.name.c_str(), phase.ops.size(), seconds);
  return seconds;
}

// --- patterns -----------------------------------------------------------------------------

namespace {
uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
uint8_t patternByte(uint64_t seed, size_t i) {
  return static_cast<uint8_t>(mix64(seed ^ (i >> 3)) >> ((i & 7) * 8));
}
}  // namespace

uint64_t patternSeed(int src, int dst, uint64_t a, uint64_t b, uint64_t c) {
  uint64_t s = mix64(static_cast<uint64_t>(src) * 1000003u + static_cast<uint64_t>(dst));
  s = mix64(s ^ a);
  s = mix64(s ^ (b * 0x100000001b3ull));
  return mix64(s ^ (c << 17)) << 20;  // low bits stay free for the word index
}

void fillPattern(void* data, size_t size, uint64_t seed) {
  uint8_t* p = static_cast<uint8_t*>(data);
  size_t i = 0;
  for (; i + 8 <= size; i += 8) {
    uint64_t w = mix64(seed ^ (i >> 3));
    memcpy(p + i, &w, 8);  // little-endian: byte j of w is patternByte(seed, i + j)
  }
  for (; i < size; ++i) p[i] = patternByte(seed, i);
}

std::string checkPattern(const void* data, size_t size, uint64_t seed) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  size_t bad = 0, first = 0;
  uint8_t want = 0, got = 0;
  for (size_t i = 0; i < size; ++i) {
    uint8_t e = patternByte(seed, i);
    if (p[i] != e) {
      if (bad++ == 0) first = i, want = e, got = p[i];
    }
  }
  if (bad == 0) return std::string();
  return format("%zu of %zu bytes differ, first at offset %zu (expected 0x%02x, got 0x%02x)",
                bad, size, first, want, got);
}

std::string checkFill(const void* data, size_t size, uint8_t value) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < size; ++i) {
    if (p[i] != value) {
      return format("byte at offset %zu is 0x%02x, expected untouched 0x%02x", i, p[i], value);
    }
  }
  return std::string();
}

// test() until done (60 s at most, within the scenario's deadline); returns the sizes.
std::vector<size_t> waitDone(Context& ctx, void* req, int n, const std::string& label) {
  Deadline by(std::min(60.0, ctx.deadline.remaining()), "completing " + label);
  size_t sizes[kMaxGroup];
  int done = 0;
  while (!done) {
    ctx.net.check(ctx.net->test(req, &done, sizes, n), "test", label);
    if (!done && by.expired()) fail("%s: not complete after %.0f s", label.c_str(), 60.0);
    if (!done) pollPause(200);
  }
  return std::vector<size_t>(sizes, sizes + n);
}

void exchangeSmall(Context& ctx, int peer, void* sendComm, void* recvComm, uint64_t round,
                   const std::string& label) {
  constexpr int kBytes = 8;
  constexpr int kTag = 7;
  HostBuffer out(kBytes), in(kBytes);
  fillPattern(out.data(), kBytes, patternSeed(ctx.rank, peer, round, kBytes, 0));
  memset(in.data(), 0xEE, kBytes);
  void* mhOut = regHost(ctx, sendComm, out, label + " send buffer");
  void* mhIn = regHost(ctx, recvComm, in, label + " recv buffer");
  std::vector<Op> ops;
  ops.push_back(sendOp(sendComm, out.data(), kBytes, kTag, mhOut,
                       format("%s: 8 B isend rank%d->rank%d", label.c_str(), ctx.rank, peer)));
  ops.push_back(recvOp(recvComm, in.data(), kBytes, kTag, mhIn,
                       format("%s: 8 B irecv rank%d<-rank%d", label.c_str(), ctx.rank, peer)));
  Engine engine(ctx, ctx.seed);
  engine.run(ops, ctx.deadline);
  if (ops[1].got[0] != kBytes) {
    fail("%s: receive from rank%d reported %d bytes, expected %d", label.c_str(), peer,
         ops[1].got[0], kBytes);
  }
  std::string bad = checkPattern(in.data(), kBytes, patternSeed(peer, ctx.rank, round, kBytes, 0));
  if (!bad.empty()) fail("%s: data from rank%d corrupt: %s", label.c_str(), peer, bad.c_str());
  deregHost(ctx, sendComm, mhOut, label + " send buffer");
  deregHost(ctx, recvComm, mhIn, label + " recv buffer");
}

// Posts one receive of `size` bytes, retrying while irecv returns a NULL request (30 s).
void* postRecvGroup(Context& ctx, void* comm, int n, void** data, size_t* sizes, int* tags, void** mhs,
                    const std::string& label) {
  void* req = nullptr;
  Deadline postBy(30, "posting the irecv");
  while (req == nullptr) {
    ctx.net.check(ctx.net->irecv(comm, n, data, sizes, tags, mhs, &req), "irecv", label);
    if (req == nullptr && postBy.expired()) fail("%s: irecv kept returning a NULL request for 30 s", label.c_str());
    if (req == nullptr) pollPause(1000);
  }
  return req;
}

void* postRecv(Context& ctx, void* comm, void* data, size_t size, int tag, void* mh, const std::string& label) {
  void* datas[1] = {data};
  size_t sizes[1] = {size};
  int tags[1] = {tag};
  void* mhs[1] = {mh};
  return postRecvGroup(ctx, comm, 1, datas, sizes, tags, mhs, label);
}

// The same for one send (isend is NULL until the peer's receive is posted).
void* postSend(Context& ctx, void* comm, void* data, size_t size, int tag, void* mh, const std::string& label) {
  void* req = nullptr;
  Deadline postBy(30, "posting the isend");
  while (req == nullptr) {
    ctx.net.check(ctx.net->isend(comm, data, size, tag, mh, &req), "isend", label);
    if (req == nullptr && postBy.expired()) fail("%s: isend kept returning a NULL request for 30 s", label.c_str());
    if (req == nullptr) pollPause(1000);
  }
  return req;
}

}  // namespace e2e
