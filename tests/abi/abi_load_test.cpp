// SPDX-License-Identifier: Apache-2.0
// abi_load: the built plugin loaded exactly as NCCL loads it. The library is found by name
// through LD_LIBRARY_PATH (ctest sets it to the plugin's directory), opened with
// RTLD_NOW | RTLD_LOCAL, and driven only through the ncclNetPlugin_v8 table. This
// executable links -ldl and gtest, never a module (mesh_*): it sees what NCCL sees.
//
// Every test dlopen()s the library anew and dlclose()s it at the end, and checks that the
// close really unloaded it: the plugin tears its state down in its library destructor, so
// each test starts from a fresh, never-initialized plugin.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "net_v8.h"
#include "plugin_threads.h"

extern char** environ;

namespace {

constexpr const char* kPluginName = "libnccl-net-mesh.so";
constexpr const char* kPluginSymbol = "ncclNetPlugin_v8";

// --- capturing logger: what the plugin tells NCCL's log -----------------------------------

struct LogLine {
  ncclDebugLogLevel level;
  std::string text;
};

std::mutex gLogMutex;           // the reactor thread may log too
std::vector<LogLine> gLog;

extern "C" void captureLog(ncclDebugLogLevel level, unsigned long /*flags*/,
                           const char* /*file*/, int /*line*/, const char* fmt, ...) {
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  std::lock_guard<std::mutex> lock(gLogMutex);
  gLog.push_back(LogLine{level, buf});
}

void clearLog() {
  std::lock_guard<std::mutex> lock(gLogMutex);
  gLog.clear();
}

std::vector<std::string> logged(ncclDebugLogLevel level) {
  std::lock_guard<std::mutex> lock(gLogMutex);
  std::vector<std::string> out;
  for (const LogLine& l : gLog) {
    if (l.level == level) out.push_back(l.text);
  }
  return out;
}

std::string joinLines(const std::vector<std::string>& lines) {
  std::string out;
  for (const std::string& l : lines) out += "\n  " + l;
  return out;
}

bool contains(const std::string& text, const char* part) {
  return text.find(part) != std::string::npos;
}

// --- process introspection ---------------------------------------------------------------

bool pluginStillMapped() {
  void* h = dlopen(kPluginName, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  if (h == nullptr) return false;
  dlclose(h);
  return true;
}

// --- the library, opened as NCCL opens it --------------------------------------------------

class Plugin {
 public:
  Plugin() = default;
  ~Plugin() { close(); }
  Plugin(const Plugin&) = delete;
  Plugin& operator=(const Plugin&) = delete;

  // dlopen + dlsym; on failure returns false with the reason in *why.
  bool open(std::string* why) {
    handle_ = dlopen(kPluginName, RTLD_NOW | RTLD_LOCAL);
    if (handle_ == nullptr) {
      const char* err = dlerror();
      *why = std::string("dlopen(") + kPluginName + ") failed: " + (err ? err : "?") +
             " (LD_LIBRARY_PATH=" + (getenv("LD_LIBRARY_PATH") ? getenv("LD_LIBRARY_PATH") : "") +
             ")";
      return false;
    }
    net_ = static_cast<const ncclNet_v8_t*>(dlsym(handle_, kPluginSymbol));
    if (net_ == nullptr) {
      *why = std::string("dlsym(") + kPluginSymbol + ") failed";
      return false;
    }
    return true;
  }

  // dlclose; true when the library is really gone from the process afterwards.
  bool close() {
    if (handle_ == nullptr) return true;
    int rc = dlclose(handle_);
    handle_ = nullptr;
    net_ = nullptr;
    return rc == 0 && !pluginStillMapped();
  }

  const ncclNet_v8_t& net() const { return *net_; }

 private:
  void* handle_ = nullptr;
  const ncclNet_v8_t* net_ = nullptr;
};

// Sets an environment variable for one scope (before dlopen/init), removes it after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~ScopedEnv() { unsetenv(name_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
};

class AbiLoad : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(pluginStillMapped()) << "a previous test left the plugin loaded";
    clearLog();
  }
  void TearDown() override {
    EXPECT_TRUE(plugin_.close()) << "dlclose did not unload " << kPluginName;
  }

  // Opens the library; the test stops with the reason if that fails.
  void openPlugin() {
    std::string why;
    ASSERT_TRUE(plugin_.open(&why)) << why;
  }
  const ncclNet_v8_t& net() const { return plugin_.net(); }

  Plugin plugin_;
};

// --- (a) a machine without RDMA ports: a working plugin with zero devices -----------------

TEST_F(AbiLoad, NameIsMeshAndEveryEntryPointIsSet) {
  ASSERT_NO_FATAL_FAILURE(openPlugin());
  ASSERT_NE(net().name, nullptr);
  EXPECT_STREQ(net().name, "Mesh");
  const void* const* entries = reinterpret_cast<const void* const*>(&net());
  for (size_t i = 1; i < sizeof(ncclNet_v8_t) / sizeof(void*); ++i) {
    EXPECT_NE(entries[i], nullptr) << "entry point " << i << " is NULL";
  }
}

TEST_F(AbiLoad, InitWithoutRdmaPortsReportsZeroDevicesAndOneWarning) {
  ASSERT_NO_FATAL_FAILURE(openPlugin());
  ASSERT_EQ(net().init(captureLog), ncclSuccess);
  int ndev = -1;
  ASSERT_EQ(net().devices(&ndev), ncclSuccess);
  std::vector<std::string> warns = logged(NCCL_LOG_WARN);
  if (ndev > 0) {
    // A machine with usable RoCE ports (e.g. inside the lab): nothing to warn about.
    EXPECT_TRUE(warns.empty()) << joinLines(warns);
    GTEST_SKIP() << "this machine has " << ndev << " Mesh device(s); the no-RDMA path is "
                 << "also covered by MissingVerbsLibraryIsAWarningNotAFailure";
  }
  EXPECT_EQ(ndev, 0);
  ASSERT_EQ(warns.size(), 1u) << "expected exactly one WARN:" << joinLines(warns);
  // rdma-core present but no port: "no usable RDMA port"; rdma-core absent: "no RDMA: ...".
  EXPECT_TRUE(contains(warns[0], "no usable RDMA port") || contains(warns[0], "no RDMA"))
      << warns[0];
  EXPECT_TRUE(contains(warns[0], "0 devices")) << warns[0];
}

// --- (b) rdma-core missing: a clear warning, zero devices, no failure -------------------

TEST_F(AbiLoad, MissingVerbsLibraryIsAWarningNotAFailure) {
  const char* kLib = "/nonexistent/libibverbs.so.1";
  ScopedEnv env("NCCL_MESH_IBVERBS_LIB", kLib);
  ASSERT_NO_FATAL_FAILURE(openPlugin());
  ASSERT_EQ(net().init(captureLog), ncclSuccess);
  int ndev = -1;
  ASSERT_EQ(net().devices(&ndev), ncclSuccess);
  EXPECT_EQ(ndev, 0);
  std::vector<std::string> warns = logged(NCCL_LOG_WARN);
  ASSERT_EQ(warns.size(), 1u) << "expected exactly one WARN:" << joinLines(warns);
  EXPECT_TRUE(contains(warns[0], kLib)) << "the WARN should name the library: " << warns[0];
  EXPECT_TRUE(contains(warns[0], "rdma-core")) << "the WARN should say what to install: "
                                               << warns[0];
  EXPECT_TRUE(contains(warns[0], "install")) << warns[0];
}

// --- (c) threads: the reactor runs after init and never outlives the library -------------

void initAndCountDevices(const ncclNet_v8_t& net, int* ndev) {
  ASSERT_EQ(net.init(captureLog), ncclSuccess);
  ASSERT_EQ(net.devices(ndev), ncclSuccess);
  EXPECT_GE(*ndev, 0);
}

// One handshake reactor thread while the plugin has devices, none without (there is no
// handshake to serve), and none after dlclose either way.
TEST_F(AbiLoad, NoThreadOutlivesTheLibrary) {
  ASSERT_EQ(abitest::waitForPluginThreads(0), 0) << "a plugin thread from an earlier test still runs";
  for (int round = 1; round <= 2; ++round) {
    SCOPED_TRACE("load round " + std::to_string(round));
    ASSERT_NO_FATAL_FAILURE(openPlugin());
    int ndev = -1;
    ASSERT_NO_FATAL_FAILURE(initAndCountDevices(net(), &ndev));
    EXPECT_EQ(abitest::pluginThreadCount(), ndev > 0 ? 1 : 0)
        << ndev << " device(s): init should start " << (ndev > 0 ? "one handshake reactor thread" : "no thread");
    ASSERT_TRUE(plugin_.close()) << "dlclose did not unload " << kPluginName;
    EXPECT_EQ(abitest::waitForPluginThreads(0), 0) << "the reactor thread outlived dlclose";
  }
}

// --- (d) misuse is reported, never a crash ------------------------------------------------

TEST_F(AbiLoad, CallsBeforeInitAreInvalidUsage) {
  ASSERT_NO_FATAL_FAILURE(openPlugin());
  int ndev = -1;
  EXPECT_EQ(net().devices(&ndev), ncclInvalidUsage);
  ncclNetProperties_v8_t props;
  EXPECT_EQ(net().getProperties(0, &props), ncclInvalidUsage);
}

TEST_F(AbiLoad, NullAndOutOfRangeArgumentsAreRejected) {
  ASSERT_NO_FATAL_FAILURE(openPlugin());
  ASSERT_EQ(net().init(captureLog), ncclSuccess);
  EXPECT_EQ(net().devices(nullptr), ncclInvalidArgument);
  EXPECT_EQ(net().getProperties(0, nullptr), ncclInvalidArgument);
  int ndev = -1;
  ASSERT_EQ(net().devices(&ndev), ncclSuccess);
  ncclNetProperties_v8_t props;
  EXPECT_NE(net().getProperties(ndev + 5, &props), ncclSuccess);
  EXPECT_NE(net().getProperties(-1, &props), ncclSuccess);
}

TEST_F(AbiLoad, ClosingACommThatIsNotOpenIsAnErrorNotACrash) {
  ASSERT_NO_FATAL_FAILURE(openPlugin());
  ASSERT_EQ(net().init(captureLog), ncclSuccess);
  // Stand-ins for a comm NCCL already closed (or never got from us): never dereferenced.
  alignas(64) char notAComm[256] = {};
  EXPECT_EQ(net().closeSend(notAComm), ncclInvalidUsage);
  EXPECT_EQ(net().closeRecv(notAComm), ncclInvalidUsage);
  EXPECT_EQ(net().closeListen(notAComm), ncclInvalidUsage);
}

TEST_F(AbiLoad, HostOnlyHooksAreHarmless) {
  ASSERT_NO_FATAL_FAILURE(openPlugin());
  ASSERT_EQ(net().init(captureLog), ncclSuccess);
  void* dptr = reinterpret_cast<void*>(0x1);
  EXPECT_EQ(net().getDeviceMr(nullptr, nullptr, &dptr), ncclSuccess);
  EXPECT_EQ(dptr, nullptr);
  EXPECT_EQ(net().getDeviceMr(nullptr, nullptr, nullptr), ncclSuccess);
  EXPECT_EQ(net().irecvConsumed(nullptr, 0, nullptr), ncclSuccess);
}

TEST_F(AbiLoad, InitTwiceIsHarmless) {
  ASSERT_NO_FATAL_FAILURE(openPlugin());
  ASSERT_EQ(net().init(captureLog), ncclSuccess);
  int first = -1;
  ASSERT_EQ(net().devices(&first), ncclSuccess);
  ASSERT_EQ(net().init(captureLog), ncclSuccess);
  int second = -1;
  ASSERT_EQ(net().devices(&second), ncclSuccess);
  EXPECT_EQ(first, second);
}

// --- (e) a bad setting is named in a warning ------------------------------------------------

TEST_F(AbiLoad, BadSettingIsWarnedAboutByName) {
  ScopedEnv env("NCCL_MESH_DEVICES", "bogus");
  ASSERT_NO_FATAL_FAILURE(openPlugin());
  ASSERT_EQ(net().init(captureLog), ncclSuccess);
  int ndev = -1;
  EXPECT_EQ(net().devices(&ndev), ncclSuccess);
  std::vector<std::string> warns = logged(NCCL_LOG_WARN);
  bool named = false;
  for (const std::string& w : warns) named = named || (contains(w, "NCCL_MESH_DEVICES") &&
                                                       contains(w, "bogus"));
  EXPECT_TRUE(named) << "no WARN names NCCL_MESH_DEVICES='bogus':" << joinLines(warns);
}

// A directory for trace files, removed on every way out of a test (a failed assertion's too).
class TraceDir {
 public:
  TraceDir() { made_ = mkdtemp(path_) != nullptr; }
  ~TraceDir() {
    if (made_) (void)!system((std::string("rm -rf '") + path_ + "'").c_str());
  }
  TraceDir(const TraceDir&) = delete;
  TraceDir& operator=(const TraceDir&) = delete;
  bool made() const { return made_; }
  std::string prefix() const { return std::string(path_) + "/t"; }

 private:
  char path_[32] = "/tmp/mesh-abi-trace.XXXXXX";
  bool made_ = false;
};

// A child process that loads the plugin, records into `prefix` (NCCL_MESH_TRACE) and calls
// init, then runs `body`; it exits with body's result (10: the load failed, 11: init). The
// parent gets the child's pid (-1: fork failed). A 60 s alarm guards against a hang.
template <typename Body>
pid_t forkRecording(const std::string& prefix, Body body) {
  fflush(nullptr);
  pid_t child = fork();
  if (child != 0) return child;
  alarm(60);
  setenv("NCCL_MESH_TRACE", prefix.c_str(), 1);
  Plugin p;
  std::string why;
  if (!p.open(&why)) _exit(10);
  if (p.net().init(captureLog) != ncclSuccess) _exit(11);
  _exit(body(p));
}

// --- (f) the call recorder failing never reaches NCCL --------------------------------------

// With NCCL_MESH_TRACE on, every call hands its arguments to the recorder after the call;
// should the recorder throw (an allocation failed), the exception must not cross into
// NCCL's C frames (std::terminate, NCCL's process gone): recording stops with one WARN and
// the calls return what they would have.
TEST_F(AbiLoad, ARecorderThatThrowsStopsRecordingAndNcclsCallsGoOn) {
  TraceDir dir;
  ASSERT_TRUE(dir.made());
  std::string prefix = dir.prefix();
  ScopedEnv trace("NCCL_MESH_TRACE", prefix.c_str());
  ScopedEnv fail("MESH_TEST_TRACE_THROW", "1");
  ASSERT_NO_FATAL_FAILURE(openPlugin());
  EXPECT_EQ(net().init(captureLog), ncclSuccess);
  int ndev = -1;
  EXPECT_EQ(net().devices(&ndev), ncclSuccess);
  EXPECT_GE(ndev, 0);
  EXPECT_EQ(net().devices(&ndev), ncclSuccess);
  int failed = 0;
  for (const std::string& w : logged(NCCL_LOG_WARN)) failed += contains(w, "NCCL_MESH_TRACE: recording a call failed") ? 1 : 0;
  EXPECT_EQ(failed, 1) << joinLines(logged(NCCL_LOG_WARN));
  EXPECT_TRUE(plugin_.close()) << "dlclose did not unload " << kPluginName;  // the trace file is closed
}

// A trace file that can no longer be written (a full disk: every write fails) stops the
// recording with one WARN, and what NCCL called still returns; dlclose, which flushes the
// trace, too. The failed write closed the file through a flush that wrote again, and
// again: the process died of a stack overflow. Run in a child, whose file size limit is 0
// (EFBIG on every write, SIGXFSZ ignored), as a full disk's ENOSPC would be.
TEST_F(AbiLoad, ATraceFileThatCannotBeWrittenStopsRecordingAndNcclsCallsGoOn) {
  TraceDir dir;
  ASSERT_TRUE(dir.made());
  std::string prefix = dir.prefix();
  pid_t child = forkRecording(prefix, [](Plugin& p) {
    int ndev = -1;
    for (int i = 0; i < 4; ++i) {
      if (p.net().devices(&ndev) != ncclSuccess) return 12;
    }
    signal(SIGXFSZ, SIG_IGN);
    rlimit none{0, RLIM_INFINITY};
    if (setrlimit(RLIMIT_FSIZE, &none) != 0) return 13;
    if (!p.close()) return 14;  // the library's trace flush: the write fails here
    int failed = 0;
    for (const std::string& w : logged(NCCL_LOG_WARN)) failed += contains(w, "NCCL_MESH_TRACE: writing") ? 1 : 0;
    return failed == 1 ? 0 : 20 + std::min(failed, 9);
  });
  ASSERT_GE(child, 0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_FALSE(WIFSIGNALED(status)) << "the child died of signal " << WTERMSIG(status)
                                    << " (11: the flush/close recursion's stack overflow)";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "10..14: a step failed; 2x: not exactly one 'writing ... failed' WARN";
}

// A process ended by a signal runs no destructor (mpirun or slurm ending a hung job: the
// report the recorder is for). Its trace held nothing: everything sat in the recorder's
// buffer until 64 KiB, a close, a finalize or the unload. Now the header is written at once
// and the buffer whenever it is a second old, at the next call (a hung job's proxy keeps
// polling); a file that ends without "end exit" says it was cut short.
std::string readWhole(const std::string& path) {
  FILE* f = fopen(path.c_str(), "r");
  if (f == nullptr) return "";
  std::string text;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof(buf), f)) > 0;) text.append(buf, n);
  fclose(f);
  return text;
}

TEST_F(AbiLoad, ATraceOfAProcessKilledBySignalHoldsItsCallsButTheLastSecond) {
  TraceDir dir;
  ASSERT_TRUE(dir.made());
  std::string prefix = dir.prefix();
  std::string path = prefix + "." + [] {
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    return std::string(host);
  }();
  pid_t child = forkRecording(prefix, [&path](Plugin& p) {
    std::string file = path + "." + std::to_string(getpid()) + ".trace";
    if (readWhole(file).rfind("nccl-mesh-trace ", 0) != 0) return 12;  // the header, before any call
    // Calls go on until the file holds the devices() records, then the process is killed.
    // One call every 20 ms (a pace, not a wait for anything): 64 KiB of records, the size
    // that also flushes, would take a minute, so only the flush due a second after the last
    // one can write them within the 20 s.
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    int ndev = -1;
    while (readWhole(file).find(" devices ") == std::string::npos) {
      if (std::chrono::steady_clock::now() > deadline) return 13;
      if (p.net().devices(&ndev) != ncclSuccess) return 14;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    raise(SIGKILL);
    return 15;
  });
  ASSERT_GE(child, 0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status)) << "exit " << WEXITSTATUS(status)
                                   << " (12: no header at init; 13: no devices record written within 20 s)";
  EXPECT_EQ(WTERMSIG(status), SIGKILL);
  std::string text = readWhole(path + "." + std::to_string(child) + ".trace");
  EXPECT_EQ(text.rfind("nccl-mesh-trace ", 0), 0u) << text.substr(0, 200);
  EXPECT_NE(text.find(" init "), std::string::npos);
  EXPECT_NE(text.find(" devices "), std::string::npos);
  EXPECT_EQ(text.find("\nend"), std::string::npos) << "a killed process wrote an end line";
}

// The recorder writes its file without the lock every recorded call takes: a write that is
// slow (a network file system) holds up the thread that writes, not NCCL's other threads
// (another communicator's progress thread recording its isend/test). Here a close's record,
// written at once, is held in its write (test switch MESH_TEST_TRACE_HOLD_WRITE) while
// another thread's devices() calls must return; the file keeps the calls' order.
TEST_F(AbiLoad, ATraceWriteDoesNotHoldUpOtherThreadsCalls) {
  TraceDir dir;
  ASSERT_TRUE(dir.made());
  std::string prefix = dir.prefix();
  std::string hold = prefix + ".hold";
  ScopedEnv trace("NCCL_MESH_TRACE", prefix.c_str());
  ScopedEnv holdWrite("MESH_TEST_TRACE_HOLD_WRITE", hold.c_str());
  ASSERT_NO_FATAL_FAILURE(openPlugin());
  ASSERT_EQ(net().init(captureLog), ncclSuccess);  // the header is written: no hold yet
  FILE* h = fopen(hold.c_str(), "w");
  ASSERT_NE(h, nullptr);
  fclose(h);
  auto waitFor = [](const std::function<bool()>& cond) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!cond() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return cond();
  };
  alignas(64) char notAComm[256] = {};  // never dereferenced: the close is refused
  std::atomic<bool> closed{false}, polled{false};
  std::thread closer([&] {
    (void)net().closeListen(notAComm);
    closed = true;
  });
  bool holding = waitFor([&] { return access((hold + ".waiting").c_str(), F_OK) == 0; });
  std::thread other([&] {
    int ndev = -1;
    for (int i = 0; i < 3; ++i) (void)net().devices(&ndev);
    polled = true;
  });
  bool otherDone = waitFor([&] { return polled.load(); });
  bool closerStillHeld = !closed.load();
  unlink(hold.c_str());
  closer.join();
  other.join();
  EXPECT_TRUE(holding) << "the close's record never reached its write";
  EXPECT_TRUE(otherDone) << "devices() waited for another thread's trace write";
  EXPECT_TRUE(closerStillHeld) << "the write was not held while devices() ran: the test proved nothing";
  EXPECT_TRUE(plugin_.close()) << "dlclose did not unload " << kPluginName;
  std::string path = prefix + "." + [] {
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    return std::string(host);
  }() + "." + std::to_string(getpid()) + ".trace";
  std::string text = readWhole(path);
  size_t close = text.find(" close-listen ");
  size_t devices = text.find(" devices ");
  EXPECT_NE(close, std::string::npos) << text.substr(0, 400);
  EXPECT_NE(devices, std::string::npos) << text.substr(0, 400);
  EXPECT_LT(close, devices) << "the file is not in the calls' order";
  EXPECT_NE(text.find("\nend exit"), std::string::npos) << "not closed with its end line";
}

// The tests assume the plugin's defaults: drop NCCL_MESH_* settings inherited from the
// caller's shell.
void clearMeshSettings() {
  std::vector<std::string> names;
  for (char** e = environ; *e != nullptr; ++e) {
    if (strncmp(*e, "NCCL_MESH_", 10) == 0) names.emplace_back(*e, strcspn(*e, "="));
  }
  for (const std::string& n : names) unsetenv(n.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  clearMeshSettings();
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
