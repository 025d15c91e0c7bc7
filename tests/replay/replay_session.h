// SPDX-License-Identifier: Apache-2.0
// One load of the plugin replaying one trace file (replayer.h says what is reproduced).
// Owns: the library handle and its bound tables (one per recorded v11/v12 context), the
// live objects under their recorded ids, the replay's buffers, and the record of which
// calls are done (for the dependencies between threads).
// Threads: one per recorded thread. The object tables are under mutex_; calls into the
// plugin are made outside it; a request is tested by one thread at a time (LiveReq::busy).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "net_api.h"
#include "rendezvous.h"
#include "replayer.h"

namespace replay {

using mesh::trace::Call;
using mesh::trace::Record;

// A divergence after which this process cannot go on (already printed).
struct Fatal : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// Another thread or process failed first: stop quietly.
struct Stopped : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct LiveReq {
  std::mutex busy;  // held while a thread tests it
  void* p = nullptr;
  uint32_t owner = 0;  // the recorded thread that issued it (its pump polls it)
  uint64_t comm = 0;   // recorded id of its comm: closing the comm ends it
  bool recv = false;
  int n = 0;
  bool finished = false;  // a test said done, or failed
  ncclResult_t result = ncclSuccess;
  size_t sizes[netapi::kMaxTestSizes] = {};
  char* data[netapi::kMaxTestSizes] = {};
  uint64_t seed[netapi::kMaxTestSizes] = {};
  int tag[netapi::kMaxTestSizes] = {};
  std::string dataError;  // the first wrong byte, found when it finished
};

// A receive's or a flush's buffers and sizes as the plugin wants them.
struct Buffers {
  void* data[netapi::kMaxTestSizes] = {};
  void* mh[netapi::kMaxTestSizes] = {};
  size_t size[netapi::kMaxTestSizes] = {};
  int isize[netapi::kMaxTestSizes] = {};
  int tag[netapi::kMaxTestSizes] = {};
};

struct LiveComm {
  void* p = nullptr;
  uint64_t connKey = 0;  // the recorded handle key of its connection (pattern seeds)
};

struct LiveMh {
  void* p = nullptr;
  char* buf = nullptr;  // the replay's own buffer for the recorded registration
  size_t size = 0;
  int type = 0;  // recorded pointer type
};

class Session {
 public:
  Session(const TraceFile& file, const Options& opts, e2e::Rendezvous* rv, std::atomic<bool>* stopping);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  void load();    // the recorded settings into the environment, dlopen, the table
  void run();     // every recorded thread; returns when all are done (throws Fatal/Stopped)
  void unload();  // dlclose
  int divergences() const { return divergences_.load(); }

 private:
  // replayer.cpp: threads and dependencies.
  void computeDeps();
  void runThread(uint32_t thread, const std::vector<size_t>& records);
  void waitDeps(size_t index);
  void markDone(size_t index);

  // replay_calls.cpp: one function per call.
  void execute(const Record& r);
  void doInit(const Record& r);
  void doFinalize(const Record& r);
  void doDevices(const Record& r);
  void doProps(const Record& r);
  void doListen(const Record& r);
  void doConnect(const Record& r);
  void doAccept(const Record& r);
  void doRegMr(const Record& r);
  void doDeregMr(const Record& r);
  void doIsend(const Record& r);
  void doIrecv(const Record& r);
  void doIflush(const Record& r);
  void doTest(const Record& r);
  void doClose(const Record& r);
  void doMisc(const Record& r);

  // A call that may return a NULL object ("not yet"); `call` makes it once and sets *obj.
  // `key` ties a recorded first NULL to the recorded call that got the object. A connect or
  // accept left "not yet" by its first call is called again by pump() until it returns an
  // object (`polled`: the call, safe to make later from the same thread), as NCCL does.
  using PendingKey = std::tuple<int, uint64_t, int64_t>;
  using Poll = std::function<ncclResult_t(void**)>;
  template <typename Fn>
  void* nullCapable(const Record& r, const PendingKey& key, Fn call, const Poll& polled = nullptr);
  // The recorded call that got the object takes its connect or accept back from pump():
  // waits while pump() is in the call, then stops pump() making it. Its error, if a poll
  // failed.
  ncclResult_t unpoll(const PendingKey& key);

  // --- the replay's view of the recorded objects (under mutex_) ---
  netapi::NetApi* apiFor(const Record& r);
  LiveComm comm(const Record& r, uint64_t id, const char* what);
  void addComm(uint64_t id, LiveComm c);
  char* bufferAt(const Record& r, int i, void** mhandle);
  Buffers buffers(const Record& r);
  std::shared_ptr<LiveReq> request(uint64_t id);
  std::shared_ptr<LiveReq> newRequest(const Record& r, void* p, int n, bool recv);
  void addRequest(uint64_t id, std::shared_ptr<LiveReq> req);
  // Tests every unfinished request `thread` issued once, and calls its connects and accepts
  // still "not yet" once (what NCCL's proxy does between retries), so nothing waits on
  // progress that only test(), connect() or accept() makes (the relay's connect moves only
  // inside connect() calls).
  void pump(uint32_t thread);
  void pollPending(uint32_t thread);
  void testOnce(LiveReq& req);  // caller holds req.busy
  void finish(LiveReq& req);    // data check of a finished receive

  // --- reporting ---
  void diverge(const Record& r, const std::string& nccl, const std::string& replay);  // counted, goes on
  [[noreturn]] void fatal(const Record& r, const std::string& nccl, const std::string& replay);
  void expectResult(const Record& r, ncclResult_t got);  // fatal when NCCL succeeded and the replay did not
  void note(const Record& r, const std::string& text);
  void checkStopping();  // another thread of this process failed
  void checkPeers();     // another process failed (reads the rendezvous directory)
  e2e::Deadline waitDeadline(const std::string& what) const;

  const TraceFile& file_;
  const Options& opts_;
  e2e::Rendezvous* rv_;
  std::atomic<bool>* stopping_;
  bool bindAnother(netapi::NetApi* api, std::string* why);
  void* lib_ = nullptr;
  bool ncclIb_ = false;  // NCCL's IB transport (--plugin nccl-ib): its library is never closed
  int api_ = 0;
  std::vector<std::unique_ptr<netapi::NetApi>> apis_;  // every table bound (under mutex_)
  netapi::NetApi* main_ = nullptr;                     // the first: every call without a context

  std::mutex mutex_;
  std::condition_variable doneCv_;
  std::vector<char> done_;                 // per record
  std::vector<std::vector<size_t>> deps_;  // per record: records of other threads first
  std::map<uint64_t, netapi::NetApi*> ctxApi_;
  std::map<int, netapi::NetApi*> tcApi_;  // v10: a table initialized with each traffic class
  std::map<uint64_t, LiveComm> comms_;
  std::map<uint64_t, LiveMh> mhs_;
  std::map<uint64_t, std::shared_ptr<LiveReq>> reqs_;
  std::map<PendingKey, void*> stash_;                              // objects the first "not yet" call already got
  struct Polled {
    uint32_t thread = 0;  // the recorded thread whose pump() calls it
    Poll call;
    bool busy = false;                 // a pump() is in the call (outside mutex_)
    ncclResult_t failed = ncclSuccess;  // a call failed: no more calls; the recorded call reports it
  };
  std::map<PendingKey, Polled> polled_;  // connects and accepts left "not yet", until their recorded end
  std::map<uint64_t, std::unique_ptr<char[]>> handles_;            // fresh handles by recorded key
  std::map<std::tuple<uint64_t, int>, uint64_t> sent_, received_;  // messages per (comm, tag)
  std::atomic<int> divergences_{0};
  std::atomic<bool> notedMemory_{false};
};

// The plugin's logger (replayer.cpp) and the last WARN it was given.
extern "C" void replayLogger(ncclDebugLogLevel level, unsigned long flags, const char* file, int line, const char* fmt,
                             ...);
std::string lastPluginWarn();

// Pattern of a message: (connection, tag, message number) -> bytes.
uint64_t patternSeed(uint64_t connKey, int tag, uint64_t index);
void fillPattern(char* p, size_t n, uint64_t seed);
// Offset of the first byte that differs from the pattern, or -1.
long long patternMismatch(const char* p, size_t n, uint64_t seed);

}  // namespace replay
