// SPDX-License-Identifier: Apache-2.0
// The replay of one process: loading, threads, dependencies, reporting (replayer.h).
#include "replayer.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <thread>

#include "e2e_util.h"
#include "nccl_ib.h"
#include "plugin_net.h"
#include "replay_session.h"

namespace replay {
namespace {

// The plugin's log: WARNs to stderr (a divergence quotes the last one), INFO with --verbose.
std::mutex gLogMutex;
std::string gLastWarn;
std::atomic<bool> gEchoInfo{false};

}  // namespace

extern "C" void replayLogger(ncclDebugLogLevel level, unsigned long, const char* file, int line, const char* fmt, ...) {
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  if (level == NCCL_LOG_WARN) {
    {
      std::lock_guard<std::mutex> lock(gLogMutex);
      gLastWarn = buf;
    }
    e2e::warn("plugin WARN %s:%d %s", file ? file : "?", line, buf);
  } else if (gEchoInfo.load(std::memory_order_relaxed)) {
    e2e::say("plugin %s", buf);
  }
}

namespace {

// Settings that name this machine's paths, devices or ports, not the plugin's behaviour.
bool replaysSetting(const std::string& name) {
  static const std::set<std::string> kLocal = {"NCCL_MESH_IBVERBS_LIB", "NCCL_MESH_HCA",        "NCCL_MESH_GID_INDEX",
                                               "NCCL_MESH_LISTEN_ADDR", "NCCL_MESH_PORT_RANGE", "NCCL_MESH_TRACE",
                                               "NCCL_MESH_TRACE_MAX",   "NCCL_MESH_SPEED"};
  return kLocal.count(name) == 0;
}

}  // namespace

std::string lastPluginWarn() {
  std::lock_guard<std::mutex> lock(gLogMutex);
  return gLastWarn;
}

Session::Session(const TraceFile& file, const Options& opts, e2e::Rendezvous* rv, std::atomic<bool>* stopping)
    : file_(file), opts_(opts), rv_(rv), stopping_(stopping) {
  gEchoInfo.store(opts.verbose);
  done_.assign(file.trace.records.size(), 0);
}

Session::~Session() {
  for (auto& [id, mh] : mhs_) free(mh.buf);
}

void Session::load() {
  for (const std::string& kv : file_.trace.header.settings) {
    size_t eq = kv.find('=');
    std::string name = kv.substr(0, eq), value = kv.substr(eq + 1);
    if (!replaysSetting(name)) continue;
    if (value.empty()) {
      unsetenv(name.c_str());
    } else {
      setenv(name.c_str(), value.c_str(), 1);
    }
  }
  const std::vector<Record>& recs = file_.trace.records;
  api_ = recs.empty() ? 8 : recs.front().api;
  for (const Record& r : recs) {
    if (r.api != api_)
      e2e::fail("%s:%zu: calls through v%d and v%d in one process", file_.name.c_str(), r.line, api_, r.api);
  }
  apis_.push_back(std::make_unique<netapi::NetApi>());
  main_ = apis_.back().get();
  std::string why, ncclLib;
  if (e2e::parseNcclIbPlugin(opts_.plugin, &ncclLib)) {
    // NCCL's own IB transport replays the same calls (tests/e2e/nccl_ib.h): a v11 table;
    // runNode gave the process its /sys/class/infiniband before any thread started.
    if (api_ != 11) e2e::fail("%s: --plugin nccl-ib replays v11 traces only (this one is v%d)", file_.name.c_str(), api_);
    e2e::NcclIb ib = e2e::openNcclIb(ncclLib);
    lib_ = ib.lib;
    ncclIb_ = true;
    if (!main_->bindTable(ib.table, 11, "ncclNetIb in " + ib.path, &why)) e2e::fail("nccl-ib: %s", why.c_str());
  } else {
    dlerror();
    lib_ = dlopen(opts_.plugin.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib_ == nullptr) e2e::fail("dlopen(\"%s\") failed: %s", opts_.plugin.c_str(), dlerror());
    if (!main_->bind(lib_, api_, &why)) e2e::fail("%s: %s", opts_.plugin.c_str(), why.c_str());
  }
  computeDeps();
}

// Another table for a v11+ init (NCCL creates a context per communicator): the library's
// symbol again, or NCCL IB's table, which no symbol exports.
bool Session::bindAnother(netapi::NetApi* api, std::string* why) {
  if (ncclIb_) return api->bindTable(main_->table(), 11, "ncclNetIb", why);
  return api->bind(lib_, api_, why);
}

void Session::unload() {
  // NCCL IB's per-device threads outlive its finalize: its library stays until exit.
  if (lib_ != nullptr && !ncclIb_ && dlclose(lib_) != 0) e2e::fail("dlclose failed: %s", dlerror());
  lib_ = nullptr;
}

// A record waits for the last record of every other thread that touched one of its
// objects before it, and for the last init before it: NCCL's threads were ordered so.
void Session::computeDeps() {
  const std::vector<Record>& recs = file_.trace.records;
  deps_.assign(recs.size(), {});
  std::map<std::pair<char, uint64_t>, std::map<uint32_t, size_t>> last;  // object -> thread -> record
  std::map<uint32_t, size_t> lastInit;
  // A request stands for its comm and buffers: its test must come before they are closed
  // or deregistered, as it did for NCCL.
  std::map<uint64_t, std::vector<std::pair<char, uint64_t>>> requestOf;
  for (size_t i = 0; i < recs.size(); ++i) {
    const Record& r = recs[i];
    std::vector<std::pair<char, uint64_t>> objs;
    if (r.ctx != 0) objs.push_back({'x', r.ctx});
    if (r.comm != 0) objs.push_back({'c', r.comm});
    if (r.hasHandle) objs.push_back({'h', r.handle});
    bool objIsComm = r.call == Call::Listen || r.call == Call::Connect || r.call == Call::Accept;
    bool objIsMh = r.call == Call::RegMr || r.call == Call::DeregMr || r.call == Call::GetDeviceMr;
    if (r.obj != 0) objs.push_back({objIsComm ? 'c' : objIsMh ? 'm' : 'r', r.obj});
    if (r.call == Call::Isend || r.call == Call::Irecv || r.call == Call::Iflush) {
      for (int b = 0; b < r.n; ++b) objs.push_back({'m', r.mh[b]});
      if (r.obj != 0) requestOf[r.obj] = objs;
    }
    if ((r.call == Call::Test || r.call == Call::IrecvConsumed) && requestOf.count(r.obj)) {
      for (const auto& o : requestOf[r.obj]) objs.push_back(o);
    }
    std::set<size_t> d;
    for (const auto& o : objs) {
      for (const auto& [thread, idx] : last[o]) {
        if (thread != r.thread) d.insert(idx);
      }
      last[o][r.thread] = i;
    }
    for (const auto& [thread, idx] : lastInit) {
      if (thread != r.thread) d.insert(idx);
    }
    if (r.call == Call::Init) lastInit[r.thread] = i;
    deps_[i].assign(d.begin(), d.end());
  }
}

void Session::waitDeps(size_t index) {
  e2e::Deadline deadline = waitDeadline("calls of other threads it depends on");
  std::unique_lock<std::mutex> lock(mutex_);
  for (size_t d : deps_[index]) {
    while (!done_[d]) {
      if (stopping_->load()) throw Stopped("stopping");
      if (deadline.expired()) {
        const Record& r = file_.trace.records[index];
        const Record& dep = file_.trace.records[d];
        lock.unlock();
        fatal(r, "a call after line " + std::to_string(dep.line) + " of thread " + std::to_string(dep.thread),
              "that call was not done within " + std::to_string(static_cast<int>(opts_.wait)) + " s");
      }
      doneCv_.wait_for(lock, std::chrono::milliseconds(50));
    }
  }
}

void Session::markDone(size_t index) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    done_[index] = 1;
  }
  doneCv_.notify_all();
}

namespace {
std::string recorded(const Record& r) {
  char line[mesh::trace::kMaxLine];
  size_t n = mesh::trace::encodeRecord(r, line, sizeof(line));
  return n == 0 ? std::string(mesh::trace::callName(r.call)) : std::string(line, n - 1);
}
}  // namespace

void Session::runThread(uint32_t thread, const std::vector<size_t>& records) {
  size_t at = 0;  // the record this thread is at (a stopped thread says which)
  try {
    for (size_t i : records) {
      at = i;
      checkStopping();
      waitDeps(i);
      execute(file_.trace.records[i]);
      markDone(i);
    }
  } catch (const Fatal& e) {
    stopping_->store(true);
    rv_->abort(e.what());
  } catch (const Stopped&) {
    // Where a process was when another failed tells which call that one waited for.
    const Record& r = file_.trace.records[at];
    e2e::say("stopped %s thread %u at line %zu (%s [%s])", file_.name.c_str(), thread, r.line,
             mesh::trace::callName(r.call), recorded(r).c_str());
  } catch (const std::exception& e) {
    e2e::say("REPLAY ERROR %s thread %u: %s", file_.name.c_str(), thread, e.what());
    divergences_++;
    stopping_->store(true);
    rv_->abort(e.what());
  }
}

void Session::run() {
  std::map<uint32_t, std::vector<size_t>> byThread;
  const std::vector<Record>& recs = file_.trace.records;
  for (size_t i = 0; i < recs.size(); ++i) byThread[recs[i].thread].push_back(i);
  std::vector<std::thread> threads;
  for (const auto& [thread, list] : byThread) {
    threads.emplace_back([this, thread = thread, &list = list] { runThread(thread, list); });
  }
  for (std::thread& t : threads) t.join();
}

// --- reporting ----------------------------------------------------------------------------

void Session::diverge(const Record& r, const std::string& nccl, const std::string& replay) {
  divergences_++;
  e2e::say("DIVERGENCE %s:%zu %s [%s]: NCCL got %s; the replay got %s", file_.name.c_str(), r.line,
           mesh::trace::callName(r.call), recorded(r).c_str(), nccl.c_str(), replay.c_str());
}

void Session::fatal(const Record& r, const std::string& nccl, const std::string& replay) {
  diverge(r, nccl, replay);
  std::string warn = lastPluginWarn();
  if (!warn.empty()) e2e::say("  the plugin's last WARN: %s", warn.c_str());
  throw Fatal(file_.name + ":" + std::to_string(r.line) + " " + mesh::trace::callName(r.call) + ": " + replay);
}

void Session::expectResult(const Record& r, ncclResult_t got) {
  if (r.result == 0 && got != ncclSuccess) {
    fatal(r, "ncclSuccess", e2e::format("%s (%d)", e2e::resultName(got), got));
  }
  if (r.result != 0 && got == ncclSuccess) {
    diverge(r, e2e::format("%s (%d)", e2e::resultName(r.result), r.result), "ncclSuccess");
  }
}

void Session::note(const Record& r, const std::string& text) {
  e2e::say("note %s:%zu %s: %s", file_.name.c_str(), r.line, mesh::trace::callName(r.call), text.c_str());
}

void Session::checkStopping() {
  if (stopping_->load()) throw Stopped("stopping");
}

void Session::checkPeers() {
  checkStopping();
  try {
    rv_->checkAborts();
  } catch (const e2e::Failure& f) {
    if (!stopping_->exchange(true)) e2e::say("stopping: %s", f.what());
    throw Stopped(f.what());
  }
}

e2e::Deadline Session::waitDeadline(const std::string& what) const {
  return e2e::Deadline(opts_.wait, e2e::format("--wait %.0f s for %s", opts_.wait, what.c_str()));
}

// --- one process ----------------------------------------------------------------------------

int replayProcess(const Plan& plan, size_t process, const Options& opts) {
  const ProcessPlan& p = plan.processes.at(process);
  e2e::Clock::time_point start = e2e::Clock::now();
  std::atomic<bool> stopping{false};
  e2e::Rendezvous rv(opts.shared, "replay", opts.runId, static_cast<int>(process),
                     static_cast<int>(plan.processes.size()));
  e2e::Deadline deadline(opts.deadline, e2e::format("--deadline %.0f s", opts.deadline));
  int divergences = 0;
  size_t records = 0;
  std::string names;
  std::unique_ptr<Session> last;
  try {
    for (size_t k = 0; k < p.files.size(); ++k) {
      const TraceFile& f = plan.files[p.files[k]];
      names += (k ? "," : "") + f.name;
      records += f.trace.records.size();
      if (!f.trace.endReason.empty()) {
        e2e::say(
            "note %s: the recording stopped early (%s): calls after it are not replayed, and what peers "
            "expect from them will time out",
            f.name.c_str(), f.trace.endReason.c_str());
      }
      if (last) last->unload();
      last = std::make_unique<Session>(f, opts, &rv, &stopping);
      e2e::setPhase("replaying " + f.name);
      last->load();
      last->run();
      divergences += last->divergences();
      if (stopping.load()) break;
    }
    if (!stopping.load()) {
      // Every process keeps its plugin (and so the relay it may run) until all are done.
      e2e::setPhase("waiting for every process to finish");
      rv.barrier("done", deadline);
      last->unload();
    }
  } catch (const std::exception& e) {
    e2e::say("REPLAY FAIL %s (%s): %s", p.label.c_str(), names.c_str(), e.what());
    rv.abort(e.what());
    fflush(stdout);
    _exit(1);
  }
  if (stopping.load()) {
    e2e::say("REPLAY FAIL %s (%s): %d divergence(s); stopped", p.label.c_str(), names.c_str(),
             divergences > 0 ? divergences : 1);
    fflush(stdout);
    _exit(1);  // the plugin may be mid-call in another thread: no teardown
  }
  e2e::say("REPLAY %s %s (%s): %zu records, %d divergence(s), %.2f s", divergences ? "FAIL" : "PASS", p.label.c_str(),
           names.c_str(), records, divergences, e2e::secondsSince(start));
  return divergences;
}

}  // namespace replay
