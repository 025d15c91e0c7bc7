// SPDX-License-Identifier: Apache-2.0
// One function per recorded call (replay_session.h): make it again, compare the outcome.
#include <cinttypes>
#include <cstdlib>
#include <cstring>

#include "e2e_util.h"
#include "plugin_net.h"
#include "replay_session.h"

namespace replay {
namespace {

std::string resultText(ncclResult_t r) { return e2e::format("%s (%d)", e2e::resultName(r), static_cast<int>(r)); }

std::string hex(uint64_t v) { return e2e::format("%016" PRIx64, v); }

uint64_t mix(uint64_t x) {  // splitmix64's finalizer
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

uint64_t patternSeed(uint64_t connKey, int tag, uint64_t index) {
  return mix(connKey ^ mix(static_cast<uint64_t>(static_cast<uint32_t>(tag)) ^ (index << 32)));
}

void fillPattern(char* p, size_t n, uint64_t seed) {
  uint64_t x = seed | 1;
  for (size_t i = 0; i < n; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    memcpy(p + i, &x, n - i < 8 ? n - i : 8);
  }
}

long long patternMismatch(const char* p, size_t n, uint64_t seed) {
  uint64_t x = seed | 1;
  for (size_t i = 0; i < n; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    size_t len = n - i < 8 ? n - i : 8;
    if (memcmp(p + i, &x, len) != 0) {
      for (size_t k = 0; k < len; ++k) {
        if (p[i + k] != reinterpret_cast<const char*>(&x)[k]) return static_cast<long long>(i + k);
      }
    }
  }
  return -1;
}

void Session::execute(const Record& r) {
  switch (r.call) {
    case Call::Init:
      return doInit(r);
    case Call::Finalize:
      return doFinalize(r);
    case Call::Devices:
      return doDevices(r);
    case Call::Props:
      return doProps(r);
    case Call::Listen:
      return doListen(r);
    case Call::Connect:
      return doConnect(r);
    case Call::Accept:
      return doAccept(r);
    case Call::RegMr:
      return doRegMr(r);
    case Call::DeregMr:
      return doDeregMr(r);
    case Call::Isend:
      return doIsend(r);
    case Call::Irecv:
      return doIrecv(r);
    case Call::Iflush:
      return doIflush(r);
    case Call::Test:
      return doTest(r);
    case Call::CloseSend:
    case Call::CloseRecv:
    case Call::CloseListen:
      return doClose(r);
    default:
      return doMisc(r);
  }
}

// --- objects -------------------------------------------------------------------------------

netapi::NetApi* Session::apiFor(const Record& r) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (api_ >= 11 && r.ctx != 0) {
    auto it = ctxApi_.find(r.ctx);
    if (it != ctxApi_.end()) return it->second;
  }
  return main_;
}

LiveComm Session::comm(const Record& r, uint64_t id, const char* what) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = comms_.find(id);
    if (it != comms_.end()) return it->second;
  }
  if (id == 0) return LiveComm();  // NCCL passed a comm the recorder did not know
  fatal(r, e2e::format("%s %" PRIu64 " (made earlier)", what, id), "no such comm: the call that made it failed");
}

void Session::addComm(uint64_t id, LiveComm c) {
  std::lock_guard<std::mutex> lock(mutex_);
  comms_[id] = c;
}

char* Session::bufferAt(const Record& r, int i, void** mhandle) {
  LiveMh mh;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = mhs_.find(r.mh[i]);
    if (it != mhs_.end()) mh = it->second;
  }
  if (mh.buf == nullptr) fatal(r, e2e::format("registration %" PRIu64, r.mh[i]), "no such registration");
  if (r.off[i] < 0 || static_cast<uint64_t>(r.off[i]) + r.size[i] > mh.size) {
    fatal(r, e2e::format("a buffer at offset %" PRId64 " of %" PRIu64 " bytes", r.off[i], r.size[i]),
          e2e::format("outside the %zu-byte registration: cannot be replayed", mh.size));
  }
  *mhandle = mh.p;
  return mh.buf + r.off[i];
}

std::shared_ptr<LiveReq> Session::request(uint64_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = reqs_.find(id);
  return it == reqs_.end() ? nullptr : it->second;
}

std::shared_ptr<LiveReq> Session::newRequest(const Record& r, void* p, int n, bool recv) {
  auto live = std::make_shared<LiveReq>();
  live->p = p;
  live->owner = r.thread;
  live->comm = r.comm;
  live->recv = recv;
  live->n = n;
  return live;
}

void Session::addRequest(uint64_t id, std::shared_ptr<LiveReq> req) {
  std::lock_guard<std::mutex> lock(mutex_);
  reqs_[id] = std::move(req);
}

void Session::testOnce(LiveReq& req) {
  int done = 0;
  size_t sizes[netapi::kMaxTestSizes];
  ncclResult_t res = main_->test(req.p, &done, sizes, req.n);
  if (res != ncclSuccess) {
    req.finished = true;
    req.result = res;
  } else if (done) {
    req.finished = true;
    for (int i = 0; i < req.n; ++i) req.sizes[i] = sizes[i];
    finish(req);
  }
}

void Session::finish(LiveReq& req) {
  if (!req.recv) return;
  for (int i = 0; i < req.n && req.dataError.empty(); ++i) {
    if (req.sizes[i] == netapi::kUnwrittenSize) {
      req.dataError = e2e::format("buffer %d (tag %d): no size reported", i, req.tag[i]);
      continue;
    }
    long long at = patternMismatch(req.data[i], req.sizes[i], req.seed[i]);
    if (at >= 0) {
      req.dataError = e2e::format("buffer %d (tag %d): byte %lld of %zu differs from what was sent", i, req.tag[i], at,
                                  req.sizes[i]);
    }
  }
}

void Session::pump(uint32_t thread) {
  pollPending(thread);
  std::vector<std::shared_ptr<LiveReq>> mine;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [id, req] : reqs_) {
      if (req->owner == thread && !req->finished) mine.push_back(req);
    }
  }
  for (const std::shared_ptr<LiveReq>& req : mine) {
    std::unique_lock<std::mutex> busy(req->busy, std::try_to_lock);
    if (busy.owns_lock() && !req->finished) testOnce(*req);
  }
}

// NCCL's proxy calls every connect and accept it has "not yet" again on each pass, not only
// the one it waits for; a plugin may move a connect only inside those calls. Calling one only
// at its recorded end deadlocked the replay of a relayed 4-ring (issue 31: the first call of
// each diagonal's relayed connect had not sent its RELAY-OPEN yet: no neighbour's route heard
// so early, or the TCP connect to the relay still in progress; and each node waited on an
// accept that needed the other node's connect before calling its own again).
void Session::pollPending(uint32_t thread) {
  std::vector<std::pair<PendingKey, Poll>> mine;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [key, p] : polled_) {
      if (p.thread != thread || p.busy || p.failed != ncclSuccess) continue;
      p.busy = true;
      mine.emplace_back(key, p.call);
    }
  }
  for (const auto& [key, call] : mine) {
    void* obj = nullptr;
    ncclResult_t res = call(&obj);
    std::lock_guard<std::mutex> lock(mutex_);
    Polled& p = polled_.at(key);  // unpoll() waits for busy to clear: still there
    p.busy = false;
    if (res != ncclSuccess) {
      p.failed = res;
    } else if (obj != nullptr) {
      stash_[key] = obj;
      polled_.erase(key);
    }
  }
}

ncclResult_t Session::unpoll(const PendingKey& key) {
  e2e::Deadline deadline = waitDeadline("a connect or accept being polled");
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = polled_.find(key);
      if (it == polled_.end()) return ncclSuccess;
      if (!it->second.busy) {
        ncclResult_t failed = it->second.failed;
        polled_.erase(it);
        return failed;
      }
    }
    if (deadline.expired()) throw std::runtime_error("a connect or accept call never returned");
    e2e::pollPause(50);
  }
}

template <typename Fn>
void* Session::nullCapable(const Record& r, const PendingKey& key, Fn call, const Poll& polled) {
  void* obj = nullptr;
  e2e::Deadline deadline = waitDeadline(mesh::trace::callName(r.call));
  bool firstNull = r.result == 0 && r.obj == 0;
  // The call that ends it takes it back from pump(): from here on it polls it itself.
  ncclResult_t pollFailed = firstNull ? ncclSuccess : unpoll(key);
  if (r.result != 0) {  // NCCL got an error: expect one, after any number of "not yet"
    if (pollFailed != ncclSuccess) return nullptr;  // it came while pump() called it
    for (uint64_t i = 0;; ++i) {
      if (call(&obj) != ncclSuccess) return nullptr;
      if (obj != nullptr) {
        diverge(r, resultText(static_cast<ncclResult_t>(r.result)), "an object");
        return nullptr;
      }
      if (deadline.expired()) {
        diverge(r, resultText(static_cast<ncclResult_t>(r.result)), "NULL (not yet) until the deadline");
        return nullptr;
      }
      e2e::pollPause(100);
    }
  }
  if (firstNull) {  // NCCL's first "not yet": call once; an object already is kept for later
    ncclResult_t res = call(&obj);
    if (res != ncclSuccess) fatal(r, "NULL (not yet, retried by NCCL)", resultText(res));
    std::lock_guard<std::mutex> lock(mutex_);
    if (obj != nullptr) {
      stash_[key] = obj;
    } else if (polled) {
      polled_[key] = Polled{r.thread, polled};
    }
    return nullptr;
  }
  std::string expected = e2e::format("an object after %" PRIu64 " NULL(s)", r.repeats);
  if (pollFailed != ncclSuccess) fatal(r, expected, resultText(pollFailed) + " (called again between other calls)");
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = stash_.find(key);
    if (it != stash_.end()) {
      obj = it->second;
      stash_.erase(it);
      return obj;
    }
  }
  for (uint64_t i = 0;; ++i) {
    ncclResult_t res = call(&obj);
    if (res != ncclSuccess) fatal(r, expected, resultText(res) + e2e::format(" after %" PRIu64 " NULL(s)", i));
    if (obj != nullptr) return obj;
    if (deadline.expired()) {
      fatal(r, expected, e2e::format("NULL for %.0f s (%" PRIu64 " tries): it never completed", opts_.wait, i + 1));
    }
    pump(r.thread);
    if (i % 256 == 255) checkPeers();
    if (i >= 64) e2e::pollPause(50);
  }
}

// --- calls ---------------------------------------------------------------------------------

void Session::doInit(const Record& r) {
  if (api_ < 11) return expectResult(r, main_->init(replayLogger));
  auto api = std::make_unique<netapi::NetApi>();
  std::string why;
  if (!bindAnother(api.get(), &why)) fatal(r, "a table", why);
  ncclResult_t res = api->init(replayLogger, r.trafficClass, r.commId);
  expectResult(r, res);
  std::lock_guard<std::mutex> lock(mutex_);
  if (res == ncclSuccess && r.ctx != 0) ctxApi_[r.ctx] = api.get();
  apis_.push_back(std::move(api));
}

void Session::doFinalize(const Record& r) {
  netapi::NetApi* api = apiFor(r);
  if (api_ < 11 || api == main_) return note(r, "no live context: skipped");
  expectResult(r, api->finalize());
  std::lock_guard<std::mutex> lock(mutex_);
  ctxApi_.erase(r.ctx);
}

void Session::doDevices(const Record& r) {
  int n = 0;
  ncclResult_t res = main_->devices(&n);
  expectResult(r, res);
  if (res == ncclSuccess && n != r.ndev) diverge(r, e2e::format("%d device(s)", r.ndev), e2e::format("%d", n));
}

void Session::doProps(const Record& r) {
  netapi::Properties p;
  ncclResult_t res = main_->getProperties(r.dev, &p);
  expectResult(r, res);
  if (res == ncclSuccess && r.maxRecvs != 0 && p.maxRecvs != r.maxRecvs) {
    diverge(r, e2e::format("maxRecvs %d", r.maxRecvs), e2e::format("maxRecvs %d", p.maxRecvs));
  }
}

void Session::doListen(const Record& r) {
  char handle[mesh::trace::kHandleBytes] = {};
  void* lc = nullptr;
  ncclResult_t res = apiFor(r)->listen(r.dev, handle, &lc);
  expectResult(r, res);
  if (res != ncclSuccess) return;
  if (lc == nullptr) fatal(r, "a listen comm", "NULL");
  addComm(r.obj, LiveComm{lc, r.handle});
  rv_->publish("handle." + hex(r.handle), std::string(handle, sizeof(handle)));
}

void Session::doConnect(const Record& r) {
  char* handle = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = handles_.find(r.handle);
    if (it != handles_.end()) handle = it->second.get();
  }
  if (handle == nullptr) {
    std::string bytes;
    e2e::Deadline d = waitDeadline("the listener's handle");
    while (!rv_->tryFetch("handle." + hex(r.handle), &bytes)) {
      checkPeers();
      pump(r.thread);  // the listener's process may wait on what this thread has in flight
      if (d.expired()) {
        fatal(r, "a connection to the listener of handle " + hex(r.handle),
              "no process published that handle (is the listener's trace missing?)");
      }
      e2e::pollPause(2000);
    }
    std::lock_guard<std::mutex> lock(mutex_);
    auto& slot = handles_[r.handle];
    if (!slot) {  // the plugin keys a pending connect by this buffer: one per handle, kept
      slot.reset(new char[mesh::trace::kHandleBytes]());
      memcpy(slot.get(), bytes.data(), std::min(bytes.size(), mesh::trace::kHandleBytes));
    }
    handle = slot.get();
  }
  netapi::NetApi* api = apiFor(r);
  if (api_ == 10) {
    std::lock_guard<std::mutex> lock(mutex_);
    netapi::NetApi*& withTc = tcApi_[r.trafficClass];
    if (withTc == nullptr) {
      apis_.push_back(std::make_unique<netapi::NetApi>());
      std::string why;
      bindAnother(apis_.back().get(), &why);
      apis_.back()->init(replayLogger, r.trafficClass);
      withTc = apis_.back().get();
    }
    api = withTc;
  }
  auto call = [api, dev = r.dev, handle](void** out) { return api->connect(dev, handle, out); };
  void* sc = nullCapable(r, PendingKey{static_cast<int>(Call::Connect), r.handle, 0}, call, call);
  if (sc != nullptr) addComm(r.obj, LiveComm{sc, r.handle});
}

void Session::doAccept(const Record& r) {
  LiveComm l = comm(r, r.comm, "listen comm");
  auto call = [api = main_, listen = l.p](void** out) { return api->accept(listen, out); };
  void* rc = nullCapable(r, PendingKey{static_cast<int>(Call::Accept), r.comm, 0}, call, call);
  if (rc != nullptr) addComm(r.obj, LiveComm{rc, l.connKey});
}

void Session::doRegMr(const Record& r) {
  size_t size = r.size[0];
  size_t alloc = ((size == 0 ? 1 : size) + 4095) / 4096 * 4096;
  char* buf = static_cast<char*>(aligned_alloc(4096, alloc));
  if (buf == nullptr) fatal(r, "a registration", e2e::format("cannot allocate %zu bytes", alloc));
  memset(buf, 0, alloc);
  if ((r.type != NCCL_PTR_HOST || r.dmabuf) && !notedMemory_.exchange(true)) {
    note(r, "recorded GPU or DMA-BUF memory is replayed as host memory (the fabric has no GPU)");
  }
  LiveComm c = comm(r, r.comm, "comm");
  void* mh = nullptr;
  ncclResult_t res = main_->regMr(c.p, buf, size, NCCL_PTR_HOST, &mh);
  if (res != ncclSuccess) free(buf);
  expectResult(r, res);
  if (res != ncclSuccess) return;
  std::lock_guard<std::mutex> lock(mutex_);
  mhs_[r.obj] = LiveMh{mh, buf, size, r.type};
}

void Session::doDeregMr(const Record& r) {
  LiveMh mh;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = mhs_.find(r.obj);
    if (it != mhs_.end()) mh = it->second;
  }
  if (mh.buf == nullptr) fatal(r, e2e::format("registration %" PRIu64, r.obj), "no such registration");
  LiveComm c = comm(r, r.comm, "comm");
  ncclResult_t res = main_->deregMr(c.p, mh.p);
  expectResult(r, res);
  if (res != ncclSuccess) return;
  std::lock_guard<std::mutex> lock(mutex_);
  free(mh.buf);
  mhs_.erase(r.obj);
}

void Session::doIsend(const Record& r) {
  LiveComm s = comm(r, r.comm, "send comm");
  void* mh = nullptr;
  char* data = bufferAt(r, 0, &mh);
  PendingKey key{static_cast<int>(Call::Isend), r.comm, r.tag[0]};
  std::tuple<uint64_t, int> perTag{r.comm, r.tag[0]};
  bool inFlight = false;
  uint64_t index = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    inFlight = stash_.count(key) != 0;  // the first try went out already: leave its bytes alone
    index = sent_[perTag];
  }
  if (!inFlight) fillPattern(data, r.size[0], patternSeed(s.connKey, r.tag[0], index));
  void* req = nullCapable(r, key, [&](void** out) { return main_->isend(s.p, data, r.size[0], r.tag[0], mh, out); });
  if (req == nullptr) return;
  std::shared_ptr<LiveReq> live = newRequest(r, req, 1, false);
  std::lock_guard<std::mutex> lock(mutex_);
  sent_[perTag]++;
  reqs_[r.obj] = live;
}

// The recorded buffers of a receive or flush, in the replay's memory.
Buffers Session::buffers(const Record& r) {
  Buffers b;
  for (int i = 0; i < r.n; ++i) {
    b.data[i] = bufferAt(r, i, &b.mh[i]);
    b.size[i] = r.size[i];
    b.isize[i] = static_cast<int>(r.size[i]);
    b.tag[i] = r.tag[i];
  }
  return b;
}

void Session::doIrecv(const Record& r) {
  LiveComm c = comm(r, r.comm, "recv comm");
  Buffers b = buffers(r);
  void* req = nullCapable(r, PendingKey{static_cast<int>(Call::Irecv), r.comm, r.n > 0 ? r.tag[0] : 0},
                          [&](void** out) { return main_->irecv(c.p, r.n, b.data, b.size, b.tag, b.mh, out); });
  if (req == nullptr) return;
  std::shared_ptr<LiveReq> live = newRequest(r, req, r.n, true);
  std::lock_guard<std::mutex> lock(mutex_);
  for (int i = 0; i < r.n; ++i) {
    live->data[i] = static_cast<char*>(b.data[i]);
    live->tag[i] = r.tag[i];
    live->seed[i] = patternSeed(c.connKey, r.tag[i], received_[std::tuple<uint64_t, int>{r.comm, r.tag[i]}]++);
  }
  reqs_[r.obj] = live;
}

void Session::doIflush(const Record& r) {
  LiveComm c = comm(r, r.comm, "recv comm");
  Buffers b = buffers(r);
  void* req = nullptr;
  ncclResult_t res = main_->iflush(c.p, r.n, b.data, b.isize, b.mh, &req);
  expectResult(r, res);
  if (res != ncclSuccess) return;
  if ((req != nullptr) != (r.obj != 0)) {
    std::string nccl = r.obj != 0 ? "a flush request" : "NULL (nothing to flush)";
    std::string got = req != nullptr ? "a flush request" : "NULL (nothing to flush)";
    if (notedMemory_.load()) {
      note(r, "NCCL got " + nccl + ", the replay " + got + ": the memory types differ");
    } else {
      diverge(r, nccl, got);
    }
  }
  if (req == nullptr) return;
  std::shared_ptr<LiveReq> live = newRequest(r, req, 1, false);
  if (r.obj != 0) return addRequest(r.obj, live);
  // A flush only the replay made: completed here, nothing later tests it.
  e2e::Deadline d = waitDeadline("a flush");
  while (!live->finished && !d.expired()) testOnce(*live);
  if (!live->finished || live->result != ncclSuccess) fatal(r, "no flush", "a flush that did not complete");
}

void Session::doTest(const Record& r) {
  if (r.obj == 0) return note(r, "a request the recording did not know: skipped");
  std::shared_ptr<LiveReq> req = request(r.obj);
  if (req == nullptr) fatal(r, e2e::format("request %" PRIu64 " in flight", r.obj), "no such request");
  {
    std::lock_guard<std::mutex> busy(req->busy);
    e2e::Deadline deadline = waitDeadline("test");
    for (uint64_t i = 0; !req->finished; ++i) {
      testOnce(*req);
      if (req->finished) break;
      if (deadline.expired()) {
        fatal(r,
              r.result == 0 ? e2e::format("done after %" PRIu64 " poll(s)", r.repeats)
                            : resultText(static_cast<ncclResult_t>(r.result)),
              e2e::format("not done after %.0f s (%" PRIu64 " polls): the request never completed", opts_.wait, i + 1));
      }
      pump(r.thread);
      if (i % 256 == 255) checkPeers();
      if (i >= 64) e2e::pollPause(50);
    }
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    reqs_.erase(r.obj);
  }
  if (r.result != 0) {
    if (req->result == ncclSuccess) diverge(r, resultText(static_cast<ncclResult_t>(r.result)), "done");
    return;
  }
  if (req->result != ncclSuccess) fatal(r, "done", resultText(req->result));
  for (int i = 0; i < r.nsizes && i < req->n; ++i) {
    if (static_cast<uint64_t>(r.sizes[i]) != req->sizes[i]) {
      diverge(r, e2e::format("size %" PRId64 " for buffer %d", r.sizes[i], i),
              req->sizes[i] == netapi::kUnwrittenSize ? "no size" : e2e::format("size %zu", req->sizes[i]));
    }
  }
  if (!req->dataError.empty()) diverge(r, "the bytes that were sent", req->dataError);
}

void Session::doClose(const Record& r) {
  LiveComm c = comm(r, r.comm, "comm");
  // Requests NCCL left untested die with their comm: no pump may test them during the close.
  std::vector<std::shared_ptr<LiveReq>> orphans;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = reqs_.begin(); it != reqs_.end();) {
      bool mine = it->second->comm == r.comm;
      if (mine) orphans.push_back(it->second);
      it = mine ? reqs_.erase(it) : std::next(it);
    }
  }
  for (const std::shared_ptr<LiveReq>& req : orphans) {
    std::lock_guard<std::mutex> busy(req->busy);
    req->finished = true;
  }
  // An accept still "not yet" on a listener being closed is not called again.
  if (r.call == Call::CloseListen) (void)unpoll(PendingKey{static_cast<int>(Call::Accept), r.comm, 0});
  netapi::NetApi& api = *main_;
  ncclResult_t res = r.call == Call::CloseSend   ? api.closeSend(c.p)
                     : r.call == Call::CloseRecv ? api.closeRecv(c.p)
                                                 : api.closeListen(c.p);
  expectResult(r, res);
  if (res != ncclSuccess) return;
  std::lock_guard<std::mutex> lock(mutex_);
  comms_.erase(r.comm);
  for (auto it = stash_.begin(); it != stash_.end();) {
    it = std::get<1>(it->first) == r.comm && std::get<0>(it->first) != static_cast<int>(Call::Connect)
             ? stash_.erase(it)
             : std::next(it);
  }
}

void Session::doMisc(const Record& r) {
  netapi::NetApi& api = *main_;
  if (r.call == Call::GetDeviceMr) {
    LiveMh mh;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = mhs_.find(r.obj);
      if (it != mhs_.end()) mh = it->second;
    }
    void* dptr = nullptr;
    return expectResult(r, api.getDeviceMr(comm(r, r.comm, "comm").p, mh.p, &dptr));
  }
  if (r.call == Call::IrecvConsumed) {
    std::shared_ptr<LiveReq> req = request(r.obj);
    return expectResult(r, api.irecvConsumed(comm(r, r.comm, "recv comm").p, r.n, req ? req->p : nullptr));
  }
  if (r.call == Call::SetNetAttr && api_ >= 11) {
    netapi::NetApi* ctxApi = apiFor(r);
    ncclNetAttr_v11_t attr;
    memset(&attr, 0, sizeof(attr));
    const auto* t11 = static_cast<const ncclNet_v11_t*>(ctxApi->table());
    const auto* t12 = static_cast<const ncclNet_v12_t*>(ctxApi->table());
    // again=N: the recorder counted N more identical calls on this record; the first call
    // whose result differs from the recorded one is the divergence.
    ncclResult_t res = ncclSuccess;
    for (uint64_t i = 0; i <= r.repeats; ++i) {
      res = api_ == 11 ? t11->setNetAttr(ctxApi->context(), &attr) : t12->setNetAttr(ctxApi->context(), &attr);
      if (res != static_cast<ncclResult_t>(r.result)) break;
    }
    return expectResult(r, res);
  }
  note(r, "not replayed");
}

}  // namespace replay
