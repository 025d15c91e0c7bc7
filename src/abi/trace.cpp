// SPDX-License-Identifier: Apache-2.0
// The call recorder (trace.h): the file, the ids, the coalescing of "not yet" retries.
#include "trace.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>

#include "mesh/config/config.h"
#include "mesh/platform/ipv4.h"
#include "mesh/platform/log.h"
#include "mesh/platform/version.h"
#include "mesh/plugin/plugin.h"

extern char** environ;

namespace mesh {
namespace trace {

std::atomic<bool> gOn{false};

namespace {

constexpr size_t kFlushAt = 64 * 1024;
// What is buffered is also written once it is this old, at the next call NCCL makes (a hung
// job's proxy keeps calling test()): a process ended by a signal (mpirun or slurm ending a
// hung job) runs no destructor, and its trace would lose everything since the last flush.
constexpr uint64_t kFlushAfterNs = 1000ull * 1000 * 1000;

uint64_t nowNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// A small id per thread, in the order threads first record. Plain TLS: nothing to destroy.
thread_local uint32_t tThreadId = 0;

struct MhInfo {
  uint64_t id;
  uintptr_t base;
  size_t size;
};

struct ReqInfo {
  uint64_t id;
  uint64_t comm;
  int n;
  uint64_t polls;  // test() calls that said "not done"
};

// A call that said "not yet" (NULL object, success) and will be retried by NCCL: which
// call, on what (comm id, or handle key), and a tag to tell sends of one comm apart.
using PendingKey = std::tuple<int, uint64_t, int64_t>;

class Recorder {
 public:
  Recorder(int fd, std::string path, size_t cap) : fd_(fd), path_(std::move(path)), cap_(cap) {
    buf_.reserve(kFlushAt + kMaxLine);
  }
  ~Recorder() { close(); }

  void header(const Header& h) { append(encodeHeader(h)); }
  uint64_t t0() const { return t0_; }
  void setT0(uint64_t t0) { t0_ = t0; }

  Record begin(Call call, int api, ncclResult_t r) {
    Record rec;
    rec.call = call;
    rec.api = api;
    rec.result = static_cast<int>(r);
    return rec;
  }
  // NCCL 2.28.9 calls setNetAttr before every try of a connect that is not done yet
  // (src/transport/net.cc, sendProxyConnect and recvProxyConnect: setNetAttrs first, and the
  // proxy calls them again until the connect is done): thousands of identical records per
  // relayed connect. A setNetAttr is held back; the identical ones
  // (same thread, context, version and result) that follow it with no other record between
  // are counted on it (again=N), and it is written before the next other record, at a flush
  // or at the end.
  void emit(Record& rec) {
    if (tThreadId == 0) tThreadId = ++threads_;
    rec.thread = tThreadId;
    if (rec.call == Call::SetNetAttr && held_ && held_->thread == rec.thread && held_->ctx == rec.ctx &&
        held_->api == rec.api && held_->result == rec.result) {
      ++held_->repeats;
      return;
    }
    writeHeld();
    rec.seq = ++seq_;
    rec.tUs = (nowNs() - t0_) / 1000;
    if (rec.call == Call::SetNetAttr) {
      held_ = rec;
      return;
    }
    write(rec);
  }

  // --- ids -------------------------------------------------------------------------------
  uint64_t newComm(const void* p) { return p == nullptr ? 0 : (comms_[p] = nextComm_++); }
  uint64_t comm(const void* p) const {
    auto it = comms_.find(p);
    return it == comms_.end() ? 0 : it->second;
  }
  uint64_t newCtx(const void* p) { return p == nullptr ? 0 : (ctxs_[p] = nextCtx_++); }
  uint64_t ctx(const void* p) const {
    auto it = ctxs_.find(p);
    return it == ctxs_.end() ? 0 : it->second;
  }
  void endCtx(const void* p) { ctxs_.erase(p); }
  uint64_t newMh(const void* p, const void* base, size_t size) {
    if (p == nullptr) return 0;
    uint64_t id = nextMh_++;
    mhs_[p] = MhInfo{id, reinterpret_cast<uintptr_t>(base), size};
    return id;
  }
  // The registration's id and the offset of `data` in it (-1 when outside or unknown).
  void buffer(const void* mh, const void* data, uint64_t* id, int64_t* off) const {
    auto it = mhs_.find(mh);
    *id = it == mhs_.end() ? 0 : it->second.id;
    *off = -1;
    auto d = reinterpret_cast<uintptr_t>(data);
    if (it != mhs_.end() && d >= it->second.base && d - it->second.base <= it->second.size) {
      *off = static_cast<int64_t>(d - it->second.base);
    }
  }
  uint64_t mh(const void* p) const {
    auto it = mhs_.find(p);
    return it == mhs_.end() ? 0 : it->second.id;
  }
  void endMh(const void* p) { mhs_.erase(p); }
  uint64_t newReq(const void* p, uint64_t comm, int n) {
    if (p == nullptr) return 0;
    uint64_t id = nextReq_++;
    reqs_[p] = ReqInfo{id, comm, n, 0};
    return id;
  }
  ReqInfo* req(const void* p) {
    auto it = reqs_.find(p);
    return it == reqs_.end() ? nullptr : &it->second;
  }
  void endReq(const void* p) { reqs_.erase(p); }
  // A closed comm: its id, its requests and its pending retries are forgotten (NCCL may
  // close with requests outstanding; their pointers are reused by the next comm).
  void endComm(const void* p) {
    uint64_t id = comm(p);
    comms_.erase(p);
    for (auto it = reqs_.begin(); it != reqs_.end();) it = it->second.comm == id ? reqs_.erase(it) : std::next(it);
    for (auto it = pending_.begin(); it != pending_.end();) {
      int call = std::get<0>(it->first);
      bool onComm = (call == static_cast<int>(Call::Isend) || call == static_cast<int>(Call::Irecv) ||
                     call == static_cast<int>(Call::Accept)) &&
                    std::get<1>(it->first) == id;
      it = onComm ? pending_.erase(it) : std::next(it);
    }
  }

  // A call that may say "not yet" (success, NULL object): the first such answer is written,
  // the retries after it only counted; the call that ends them (an object or an error) is
  // written with their number. False: a retry, nothing to write.
  bool firstOrFinal(const PendingKey& key, ncclResult_t r, const void* obj, Record* rec) {
    if (r == ncclSuccess && obj == nullptr) return pending_[key]++ == 0;
    auto it = pending_.find(key);
    rec->repeats = it == pending_.end() ? 0 : it->second;
    if (it != pending_.end()) pending_.erase(it);
    return true;
  }

  // Writing is two steps, so that the file's I/O (milliseconds or more on a network file
  // system) runs without the lock every recorded call takes (record(), below): takeOut()
  // under gMutex, then writeOut() under gWriteMutex alone, taken before gMutex is let go so
  // that the file keeps the records' order. flush() does both, holding both.
  std::string takeOut() {
    writeHeld();
    std::string out;
    if (fd_ < 0) {
      buf_.clear();
      return out;
    }
    out.swap(buf_);
    buf_.reserve(kFlushAt + kMaxLine);
    written_ += out.size();
    lastFlushNs_ = nowNs();
    return out;
  }
  // Under gWriteMutex (and not necessarily gMutex): touches only fd_, path_ and writeFailed_,
  // which nothing else changes while the file is open.
  void writeOut(const std::string& data) {
    testHoldWrite();
    if (fd_ < 0 || writeFailed_ || data.empty()) return;
    size_t done = 0;
    while (done < data.size()) {
      ssize_t w = ::write(fd_, data.data() + done, data.size() - done);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        MESH_WARN("NCCL_MESH_TRACE: writing %s failed: %s; recording stopped", path_.c_str(), strerror(errno));
        gOn.store(false, std::memory_order_relaxed);
        // Nothing is written after this (a full disk fails every write); close() only closes.
        writeFailed_ = true;
        return;
      }
      done += static_cast<size_t>(w);
    }
  }
  void flush();  // below gWriteMutex
  // Whether record() should write out now: 64 KiB held, or a second since the last write.
  bool flushDue() const {
    if (buf_.size() >= kFlushAt) return true;
    return (!buf_.empty() || held_) && nowNs() - lastFlushNs_ >= kFlushAfterNs;
  }
  // The end of a recording that ran to the end (the library unloaded, or the process exited
  // through exit()): "end exit". A file without an end line was cut short (parseTrace: cut).
  void close();  // below gWriteMutex

 private:
  void write(const Record& rec) {
    char line[kMaxLine];
    size_t len = encodeRecord(rec, line, sizeof(line));
    if (len == 0) return;  // cannot happen within kMaxLine; never a partial line
    appendRecord(line, len);
  }
  void writeHeld() {
    if (!held_) return;
    Record rec = std::move(*held_);
    held_.reset();
    if (fd_ >= 0) write(rec);
  }
  void append(const std::string& s) { buf_ += s; }
  void appendRecord(const char* line, size_t len) {
    static const char kEnd[] = "end cap\n";
    if (written_ + buf_.size() + len + sizeof(kEnd) > cap_) {
      buf_ += kEnd;
      ended_ = true;
      MESH_WARN(
          "NCCL_MESH_TRACE: %s reached NCCL_MESH_TRACE_MAX (%zu bytes); recording stopped "
          "(raise NCCL_MESH_TRACE_MAX to record more)",
          path_.c_str(), cap_);
      gOn.store(false, std::memory_order_relaxed);
      close();
      return;
    }
    buf_.append(line, len);  // record() writes it out at kFlushAt (flushDue)
  }
  // Test switch (AbiLoad.ATraceWriteDoesNotHoldUpOtherThreadsCalls): while the file named by
  // MESH_TEST_TRACE_HOLD_WRITE exists, a write out waits (at most 30 s), as on a slow file
  // system; it says it waits by creating <file>.waiting.
  static void testHoldWrite() {
    static const char* hold = getenv("MESH_TEST_TRACE_HOLD_WRITE");
    if (hold == nullptr || access(hold, F_OK) != 0) return;
    int fd = ::open((std::string(hold) + ".waiting").c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    if (fd >= 0) ::close(fd);
    for (int i = 0; i < 30000 && access(hold, F_OK) == 0; ++i) usleep(1000);
  }

  int fd_;
  std::string path_;
  size_t cap_;
  std::string buf_;
  std::optional<Record> held_;  // a setNetAttr not written yet (emit)
  size_t written_ = 0;        // bytes taken out for the file (the cap counts them)
  bool writeFailed_ = false;  // under gWriteMutex: a write failed, nothing more is written
  bool ended_ = false;        // an "end" line is in buf_ or written
  uint64_t lastFlushNs_ = 0;  // when buf_ was last taken out for the file (flushDue)
  uint64_t t0_ = 0;
  uint64_t seq_ = 0;
  uint32_t threads_ = 0;
  uint64_t nextComm_ = 1, nextMh_ = 1, nextReq_ = 1, nextCtx_ = 1;
  std::unordered_map<const void*, uint64_t> comms_;
  std::unordered_map<const void*, uint64_t> ctxs_;
  std::unordered_map<const void*, MhInfo> mhs_;
  std::unordered_map<const void*, ReqInfo> reqs_;
  std::map<PendingKey, uint64_t> pending_;
};

// The one recorder of this load of the library. A plain pointer under a mutex whose
// destructor is trivial: the unload hook below frees it, and a hook that runs later (a
// thread NCCL left behind) finds nullptr instead of freed memory.
std::mutex gMutex;
// Held while the file is written, taken after gMutex (never the other way round): a call's
// record waits for gMutex only, not for the disk.
std::mutex gWriteMutex;
Recorder* gRecorder = nullptr;
bool gTried = false;  // only the first init opens a file
pid_t gPid = 0;

void Recorder::flush() {
  std::lock_guard<std::mutex> w(gWriteMutex);
  writeOut(takeOut());
}

void Recorder::close() {
  if (fd_ < 0) return;
  writeHeld();
  if (!ended_) buf_ += "end exit\n";
  ended_ = true;
  flush();
  ::close(fd_);
  fd_ = -1;
}

// The recorder while recording; nullptr otherwise. Callers have checked they are not in a
// forked child (forkedChild()) before taking gMutex.
Recorder* live() { return gRecorder; }

// A child forked while another thread held gMutex inherits it held, by nobody: nothing in a
// forked child may take it (a hook, or the unload at the child's exit), or the child hangs.
// Its copy of the buffer is never written either: the parent writes the file.
bool forkedChild() { return Plugin::inForkedChild(); }

Header makeHeader(const Config& config, uint64_t t0) {
  Header h;
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) snprintf(host, sizeof(host), "unknown");
  h.host = host;
  h.pid = static_cast<long>(getpid());
  h.t0Ns = t0;
  h.plugin = versionText();
  h.nccl = Plugin::instance().loaderNccl();
  for (const MeshPort& p : Plugin::instance().discovery().ports) {
    for (const PortAddress& a : p.addrs)
      h.addrs.push_back(formatIpv4(a.ip.addr) + "/" + std::to_string(a.ip.prefixLen));
  }
  h.settings = describeConfig(config);
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    if (strncmp(*e, "NCCL_", 5) == 0 && strncmp(*e, "NCCL_MESH_", 10) != 0) h.env.push_back(*e);
  }
  return h;
}

std::string hostName() {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) return "unknown";
  for (char* c = host; *c != '\0'; ++c) {
    if (*c == '/') *c = '_';
  }
  return host;
}

// <prefix>.<host>.<pid>.trace; a reloaded library in the same process gets .2, .3, ...
int openTraceFile(const std::string& prefix, std::string* path) {
  std::string base = prefix + "." + hostName() + "." + std::to_string(getpid());
  for (int i = 1; i <= 1000; ++i) {
    *path = base + (i == 1 ? "" : "." + std::to_string(i)) + ".trace";
    int fd = ::open(path->c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd >= 0 || errno != EEXIST) return fd;
  }
  return -1;
}

void start() {
  const Config& config = Plugin::instance().config();
  if (config.tracePath.empty()) return;
  std::string path;
  int fd = openTraceFile(config.tracePath, &path);
  if (fd < 0) {
    MESH_WARN("NCCL_MESH_TRACE: cannot create %s: %s; not recording (is the directory there and writable?)",
              path.c_str(), strerror(errno));
    return;
  }
  gRecorder = new Recorder(fd, path, config.traceMax);
  uint64_t t0 = nowNs();
  gRecorder->setT0(t0);
  gRecorder->header(makeHeader(config, t0));
  gRecorder->flush();  // a job killed before its first flush still leaves a trace with its settings
  gPid = getpid();
  gOn.store(true, std::memory_order_relaxed);
  MESH_INFO(NCCL_INIT | NCCL_NET, "NCCL_MESH_TRACE: recording every ncclNet call into %s (at most %zu bytes)",
            path.c_str(), config.traceMax);
}

// Runs when the library is unloaded (NCCL's dlclose) or at exit: what is buffered is written.
__attribute__((destructor)) void traceUnload() {
  if (forkedChild()) return;
  std::lock_guard<std::mutex> lock(gMutex);
  gOn.store(false, std::memory_order_relaxed);
  if (gRecorder == nullptr || getpid() != gPid) return;  // a forked child leaves the file alone
  { std::lock_guard<std::mutex> w(gWriteMutex); }  // a write out in progress ends first
  delete gRecorder;
  gRecorder = nullptr;
}

void lists(Record* rec, Recorder* s, int n, void* const* data, void* const* mhs) {
  rec->n = n < 0 ? 0 : (n > kMaxBuffers ? kMaxBuffers : n);
  for (int i = 0; i < rec->n; ++i) {
    s->buffer(mhs != nullptr ? mhs[i] : nullptr, data != nullptr ? data[i] : nullptr, &rec->mh[i], &rec->off[i]);
  }
}

void* out(void* const* p, ncclResult_t r) { return p != nullptr && r == ncclSuccess ? *p : nullptr; }

enum class Flush { No, Yes };

// One call: `fill` completes the record under the lock (false: a counted retry, nothing to
// write), then it is written; nothing happens while not recording.
template <typename Fill>
void record(Call call, int api, ncclResult_t r, Flush flush, Fill fill) {
  if (forkedChild()) return;
  std::unique_lock<std::mutex> lock(gMutex);
  Recorder* s = live();
  if (s == nullptr) return;
  // Test switch (AbiLoad.ARecorderThatThrowsStopsRecordingAndNcclsCallsGoOn): the recorder
  // fails as it would when an allocation fails.
  static const bool failForTest = getenv("MESH_TEST_TRACE_THROW") != nullptr;
  if (failForTest) throw std::bad_alloc();
  Record rec = s->begin(call, api, r);
  if (fill(s, rec)) s->emit(rec);
  // Also after a retry that was only counted: a hung job only polls.
  if (flush == Flush::No && !s->flushDue()) return;
  std::unique_lock<std::mutex> w(gWriteMutex, std::defer_lock);
  if (flush == Flush::Yes) {
    w.lock();
  } else if (!w.try_lock()) {
    return;  // another thread is writing: this goes out with the next write
  }
  std::string data = s->takeOut();
  lock.unlock();  // the recorder stays: the unload deletes it only after taking gWriteMutex
  s->writeOut(data);
}

template <typename Fill>
void record(Call call, int api, ncclResult_t r, Fill fill) {
  record(call, api, r, Flush::No, fill);
}

}  // namespace

void stopAfterHookFailure(const char* what) noexcept {
  gOn.store(false, std::memory_order_relaxed);
  try {
    MESH_WARN("NCCL_MESH_TRACE: recording a call failed (%s); recording stopped, the job goes on", what);
  } catch (...) {
  }
}

void afterInit(int api, ncclResult_t r, void* const* ctx, uint64_t commId, int tc) {
  if (forkedChild()) return;
  {
    std::lock_guard<std::mutex> lock(gMutex);
    if (!gTried) {
      gTried = true;
      start();
    }
  }
  record(Call::Init, api, r, [&](Recorder* s, Record& rec) {
    if (api >= 11) {
      rec.ctx = s->newCtx(out(ctx, r));
      rec.commId = commId;
      rec.trafficClass = tc;
    }
    return true;
  });
}

void afterFinalize(int api, void* ctx, ncclResult_t r) {
  record(Call::Finalize, api, r, Flush::Yes, [&](Recorder* s, Record& rec) {
    rec.ctx = s->ctx(ctx);
    if (r == ncclSuccess) s->endCtx(ctx);
    return true;
  });
}

void afterDevices(int api, const int* ndev, ncclResult_t r) {
  record(Call::Devices, api, r, [&](Recorder*, Record& rec) {
    rec.ndev = ndev != nullptr && r == ncclSuccess ? *ndev : 0;
    return true;
  });
}

void afterProps(int api, int dev, int maxRecvs, int ptrSupport, int speed, const char* name, ncclResult_t r) {
  record(Call::Props, api, r, [&](Recorder*, Record& rec) {
    rec.dev = dev;
    rec.maxRecvs = maxRecvs;
    rec.ptrSupport = ptrSupport;
    rec.speed = speed;
    if (name != nullptr) rec.name.assign(name, strnlen(name, 256));
    return true;
  });
}

void afterListen(int api, void* ctx, int dev, const void* handle, void* const* listenComm, ncclResult_t r) {
  record(Call::Listen, api, r, [&](Recorder* s, Record& rec) {
    rec.ctx = s->ctx(ctx);
    rec.dev = dev;
    rec.obj = s->newComm(out(listenComm, r));
    if (handle != nullptr && r == ncclSuccess) {
      rec.hasHandle = true;
      rec.handle = handleKey(handle, kHandleBytes);
    }
    return true;
  });
}

void afterConnect(int api, void* ctx, int dev, const void* handle, int tc, void* const* sendComm, ncclResult_t r) {
  record(Call::Connect, api, r, [&](Recorder* s, Record& rec) {
    rec.ctx = s->ctx(ctx);
    rec.dev = dev;
    rec.hasHandle = true;
    rec.handle = handle != nullptr ? handleKey(handle, kHandleBytes) : 0;
    rec.trafficClass = tc;
    void* comm = out(sendComm, r);
    PendingKey key{static_cast<int>(Call::Connect), rec.handle, 0};
    if (!s->firstOrFinal(key, r, comm, &rec)) return false;
    rec.obj = s->newComm(comm);
    return true;
  });
}

void afterAccept(int api, void* listenComm, void* const* recvComm, ncclResult_t r) {
  record(Call::Accept, api, r, [&](Recorder* s, Record& rec) {
    rec.comm = s->comm(listenComm);
    void* comm = out(recvComm, r);
    PendingKey key{static_cast<int>(Call::Accept), rec.comm, 0};
    if (!s->firstOrFinal(key, r, comm, &rec)) return false;
    rec.obj = s->newComm(comm);
    return true;
  });
}

void afterRegMr(int api, void* comm, void* data, size_t size, int type, bool dmabuf, void* const* mhandle,
                ncclResult_t r) {
  record(Call::RegMr, api, r, [&](Recorder* s, Record& rec) {
    rec.comm = s->comm(comm);
    rec.n = 1;
    rec.size[0] = size;
    rec.type = type;
    rec.dmabuf = dmabuf;
    rec.obj = s->newMh(out(mhandle, r), data, size);
    return true;
  });
}

void afterDeregMr(int api, void* comm, void* mhandle, ncclResult_t r) {
  record(Call::DeregMr, api, r, [&](Recorder* s, Record& rec) {
    rec.comm = s->comm(comm);
    rec.obj = s->mh(mhandle);
    if (r == ncclSuccess) s->endMh(mhandle);
    return true;
  });
}

void afterIsend(int api, void* sendComm, const void* data, size_t size, int tag, void* mhandle, void* const* request,
                ncclResult_t r) {
  record(Call::Isend, api, r, [&](Recorder* s, Record& rec) {
    rec.comm = s->comm(sendComm);
    rec.n = 1;
    s->buffer(mhandle, data, &rec.mh[0], &rec.off[0]);
    rec.size[0] = size;
    rec.tag[0] = tag;
    void* req = out(request, r);
    PendingKey key{static_cast<int>(Call::Isend), rec.comm, tag};
    if (!s->firstOrFinal(key, r, req, &rec)) return false;
    rec.obj = s->newReq(req, rec.comm, 1);
    return true;
  });
}

void afterIrecv(int api, void* recvComm, int n, void* const* data, const int* intSizes, const size_t* sizes,
                const int* tags, void* const* mhandles, void* const* request, ncclResult_t r) {
  record(Call::Irecv, api, r, [&](Recorder* s, Record& rec) {
    rec.comm = s->comm(recvComm);
    lists(&rec, s, n, data, mhandles);
    for (int i = 0; i < rec.n; ++i) {
      rec.size[i] = sizes != nullptr ? sizes[i] : (intSizes != nullptr && intSizes[i] >= 0 ? intSizes[i] : 0);
      rec.tag[i] = tags != nullptr ? tags[i] : 0;
    }
    void* req = out(request, r);
    PendingKey key{static_cast<int>(Call::Irecv), rec.comm, rec.n > 0 ? rec.tag[0] : 0};
    if (!s->firstOrFinal(key, r, req, &rec)) return false;
    rec.obj = s->newReq(req, rec.comm, rec.n);
    return true;
  });
}

void afterIflush(int api, void* recvComm, int n, void* const* data, const int* sizes, void* const* mhandles,
                 void* const* request, ncclResult_t r) {
  record(Call::Iflush, api, r, [&](Recorder* s, Record& rec) {
    rec.comm = s->comm(recvComm);
    lists(&rec, s, n, data, mhandles);
    for (int i = 0; i < rec.n; ++i) rec.size[i] = sizes != nullptr && sizes[i] >= 0 ? sizes[i] : 0;
    rec.obj = s->newReq(out(request, r), rec.comm, rec.n);
    return true;
  });
}

void afterTest(int api, void* request, const int* done, const int* sizes, ncclResult_t r) {
  record(Call::Test, api, r, [&](Recorder* s, Record& rec) {
    ReqInfo* info = s->req(request);
    if (r == ncclSuccess && (done == nullptr || !*done)) {  // not done: counted, written when it ends
      if (info != nullptr) ++info->polls;
      return false;
    }
    rec.obj = info != nullptr ? info->id : 0;
    rec.repeats = info != nullptr ? info->polls : 0;
    rec.done = r == ncclSuccess ? 1 : 0;
    if (r == ncclSuccess && sizes != nullptr && info != nullptr) {
      rec.nsizes = info->n;
      for (int i = 0; i < info->n; ++i) rec.sizes[i] = sizes[i];
    }
    s->endReq(request);
    return true;
  });
}

void afterClose(int api, Call which, void* comm, ncclResult_t r) {
  record(which, api, r, Flush::Yes, [&](Recorder* s, Record& rec) {
    rec.comm = s->comm(comm);
    if (r == ncclSuccess) s->endComm(comm);
    return true;
  });
}

void afterGetDeviceMr(int api, void* comm, void* mhandle, ncclResult_t r) {
  record(Call::GetDeviceMr, api, r, [&](Recorder* s, Record& rec) {
    rec.comm = s->comm(comm);
    rec.obj = s->mh(mhandle);
    return true;
  });
}

void afterIrecvConsumed(int api, void* recvComm, int n, void* request, ncclResult_t r) {
  record(Call::IrecvConsumed, api, r, [&](Recorder* s, Record& rec) {
    rec.comm = s->comm(recvComm);
    rec.n = n < 0 || n > kMaxBuffers ? 0 : n;
    ReqInfo* info = s->req(request);
    rec.obj = info != nullptr ? info->id : 0;
    return true;
  });
}

void afterSetNetAttr(int api, void* ctx, ncclResult_t r) {
  record(Call::SetNetAttr, api, r, [&](Recorder* s, Record& rec) {
    rec.ctx = s->ctx(ctx);
    return true;
  });
}

}  // namespace trace
}  // namespace mesh
