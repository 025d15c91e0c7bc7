// SPDX-License-Identifier: Apache-2.0
// abi_versions_load: the built plugin loaded as NCCL loads it, driven through EACH of its
// five tables (ncclNetPlugin_v8, _v9, _v10, _v11, _v12). The library is found by name through
// LD_LIBRARY_PATH (ctest sets it), opened RTLD_NOW | RTLD_LOCAL, and reached only through
// dlsym: this executable links -ldl and gtest, never the plugin's code.
//
// Every test opens the library anew and checks at the end that dlclose really unloaded it,
// so each starts from a never-initialized plugin. Most tests run once per version through
// net_api.h (which the e2e driver uses too); version-specific ones call the raw tables.
// On a machine without RDMA ports the plugin reports 0 devices; tests that need a device
// skip there (the lab runs them).
#include <dirent.h>
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <climits>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "net_api.h"
#include "plugin_threads.h"

extern char** environ;

namespace {

constexpr const char* kPluginName = "libnccl-net-mesh.so";

// --- capturing logger ----------------------------------------------------------------------

std::mutex gLogMutex;  // the reactor thread may log too
std::vector<std::pair<ncclDebugLogLevel, std::string>> gLog;

extern "C" void captureLog(ncclDebugLogLevel level, unsigned long /*flags*/, const char* /*file*/,
                           int /*line*/, const char* fmt, ...) {
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  std::lock_guard<std::mutex> lock(gLogMutex);
  gLog.emplace_back(level, buf);
}

void clearLog() {
  std::lock_guard<std::mutex> lock(gLogMutex);
  gLog.clear();
}

// True when some WARN contains every one of `parts`.
bool warned(std::initializer_list<const char*> parts) {
  std::lock_guard<std::mutex> lock(gLogMutex);
  for (const auto& line : gLog) {
    if (line.first != NCCL_LOG_WARN) continue;
    bool all = true;
    for (const char* p : parts) all = all && line.second.find(p) != std::string::npos;
    if (all) return true;
  }
  return false;
}

// True when some line (any level) contains every one of `parts`.
bool logged(std::initializer_list<const char*> parts) {
  std::lock_guard<std::mutex> lock(gLogMutex);
  for (const auto& line : gLog) {
    bool all = true;
    for (const char* p : parts) all = all && line.second.find(p) != std::string::npos;
    if (all) return true;
  }
  return false;
}

std::string allWarnings() {
  std::lock_guard<std::mutex> lock(gLogMutex);
  std::string out;
  for (const auto& line : gLog) {
    if (line.first == NCCL_LOG_WARN) out += "\n  " + line.second;
  }
  return out.empty() ? " (none)" : out;
}

// --- process introspection -------------------------------------------------------------------

bool pluginStillMapped() {
  void* h = dlopen(kPluginName, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  if (h == nullptr) return false;
  dlclose(h);
  return true;
}

std::string versionName(const ::testing::TestParamInfo<int>& info) {
  return "v" + std::to_string(info.param);
}

// --- fixture: the library, opened as NCCL opens it ---------------------------------------------

class AbiVersions : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(pluginStillMapped()) << "a previous test left the plugin loaded";
    clearLog();
  }
  void TearDown() override { EXPECT_TRUE(closeLibrary()) << "dlclose did not unload " << kPluginName; }

  void openLibrary() {
    lib_ = dlopen(kPluginName, RTLD_NOW | RTLD_LOCAL);
    const char* ld = getenv("LD_LIBRARY_PATH");
    ASSERT_NE(lib_, nullptr) << "dlopen(" << kPluginName << "): " << dlerror()
                             << " (LD_LIBRARY_PATH=" << (ld ? ld : "") << ")";
  }
  // Opens the library and binds `net` to ncclNetPlugin_v<version>.
  void open(int version, netapi::NetApi* net) {
    if (lib_ == nullptr) {
      ASSERT_NO_FATAL_FAILURE(openLibrary());
    }
    std::string why;
    ASSERT_TRUE(net->bind(lib_, version, &why)) << why;
  }
  template <typename Table>
  const Table* table(const char* symbol) {
    if (lib_ == nullptr) openLibrary();
    return lib_ == nullptr ? nullptr : static_cast<const Table*>(dlsym(lib_, symbol));
  }
  bool closeLibrary() {
    if (lib_ == nullptr) return true;
    int rc = dlclose(lib_);
    lib_ = nullptr;
    return rc == 0 && !pluginStillMapped();
  }

  void* lib_ = nullptr;
};

class EachVersion : public AbiVersions, public ::testing::WithParamInterface<int> {
 protected:
  void SetUp() override {
    AbiVersions::SetUp();
    ASSERT_NO_FATAL_FAILURE(open(GetParam(), &net_));
  }
  // init through the version's own entry point; returns the device count.
  int initAndCount() {
    EXPECT_EQ(net_.init(captureLog), ncclSuccess) << allWarnings();
    int ndev = -1;
    EXPECT_EQ(net_.devices(&ndev), ncclSuccess);
    EXPECT_GE(ndev, 0);
    return ndev;
  }

  netapi::NetApi net_;
};

INSTANTIATE_TEST_SUITE_P(Abi, EachVersion, ::testing::ValuesIn(netapi::kVersions), versionName);

// --- every version ----------------------------------------------------------------------------

TEST_P(EachVersion, NameIsMeshAndTheEntryPointsAreSet) {
  EXPECT_STREQ(net_.name(), "Mesh");
  const void* const* entries = static_cast<const void* const*>(net_.table());
  size_t count = 0;
  size_t makeVDevice = 0;  // 0: this version has none
  switch (GetParam()) {
    case 8: count = sizeof(ncclNet_v8_t) / sizeof(void*); break;
    case 9: count = sizeof(ncclNet_v9_t) / sizeof(void*); makeVDevice = offsetof(ncclNet_v9_t, makeVDevice); break;
    case 10: count = sizeof(ncclNet_v10_t) / sizeof(void*); makeVDevice = offsetof(ncclNet_v10_t, makeVDevice); break;
    case 11: count = sizeof(ncclNet_v11_t) / sizeof(void*); makeVDevice = offsetof(ncclNet_v11_t, makeVDevice); break;
    case 12: count = sizeof(ncclNet_v12_t) / sizeof(void*); makeVDevice = offsetof(ncclNet_v12_t, makeVDevice); break;
  }
  for (size_t i = 1; i < count; ++i) {
    if (makeVDevice != 0 && i == makeVDevice / sizeof(void*)) {
      // NULL on purpose: NCCL then uses the devices as they are (no NIC fusion).
      EXPECT_EQ(entries[i], nullptr) << "makeVDevice";
    } else {
      EXPECT_NE(entries[i], nullptr) << "entry point " << i << " is NULL";
    }
  }
}

TEST_P(EachVersion, InitWithoutRdmaPortsReportsZeroDevices) {
  int ndev = initAndCount();
  if (ndev > 0) GTEST_SKIP() << "this machine has " << ndev << " Mesh device(s)";
  EXPECT_EQ(ndev, 0);
  EXPECT_TRUE(warned({"0 devices"})) << "no WARN says the network has 0 devices:" << allWarnings();
  EXPECT_EQ(net_.finalize(), ncclSuccess);
}

TEST_P(EachVersion, CallsBeforeInitAreInvalidUsage) {
  int ndev = -1;
  EXPECT_EQ(net_.devices(&ndev), ncclInvalidUsage);
  netapi::Properties props;
  EXPECT_EQ(net_.getProperties(0, &props), ncclInvalidUsage);
}

TEST_P(EachVersion, GetPropertiesOnAMissingDeviceIsAnError) {
  int ndev = initAndCount();
  netapi::Properties props;
  EXPECT_EQ(net_.getProperties(ndev, &props), ncclInvalidArgument);
  EXPECT_EQ(net_.getProperties(ndev + 5, &props), ncclInvalidArgument);
  EXPECT_EQ(net_.getProperties(-1, &props), ncclInvalidArgument);
  EXPECT_EQ(net_.getProperties(INT_MAX, &props), ncclInvalidArgument);
  EXPECT_TRUE(warned({"does not exist"})) << allWarnings();
  EXPECT_EQ(net_.finalize(), ncclSuccess);
}

// Every pointer NCCL hands over is checked before use.
TEST_P(EachVersion, NullPointersAreInvalidArgument) {
  initAndCount();
  char handle[NCCL_NET_HANDLE_MAXSIZE] = {};
  void* out = nullptr;
  int done = 0;
  char buf[8];
  void* data[1] = {buf};
  size_t sizes[1] = {sizeof(buf)};
  int intSizes[1] = {sizeof(buf)};
  int tags[1] = {0};
  void* mhs[1] = {nullptr};

  EXPECT_EQ(net_.devices(nullptr), ncclInvalidArgument);
  EXPECT_EQ(net_.listen(0, nullptr, &out), ncclInvalidArgument);
  EXPECT_EQ(net_.listen(0, handle, nullptr), ncclInvalidArgument);
  EXPECT_EQ(net_.connect(0, nullptr, &out), ncclInvalidArgument);
  EXPECT_EQ(net_.connect(0, handle, nullptr), ncclInvalidArgument);
  EXPECT_EQ(net_.accept(nullptr, &out), ncclInvalidArgument);
  EXPECT_EQ(net_.regMr(nullptr, buf, sizeof(buf), NCCL_PTR_HOST, nullptr), ncclInvalidArgument);
  EXPECT_EQ(net_.regMrDmaBuf(nullptr, buf, sizeof(buf), NCCL_PTR_HOST, 0, -1, nullptr), ncclInvalidArgument);
  EXPECT_EQ(net_.deregMr(nullptr, nullptr), ncclInvalidArgument);
  EXPECT_EQ(net_.isend(nullptr, buf, sizeof(buf), 0, nullptr, &out), ncclInvalidArgument);
  EXPECT_EQ(net_.irecv(nullptr, 1, data, sizes, tags, mhs, &out), ncclInvalidArgument);
  EXPECT_EQ(net_.iflush(nullptr, 1, data, intSizes, mhs, &out), ncclInvalidArgument);
  EXPECT_EQ(net_.test(nullptr, &done, nullptr, 0), ncclInvalidArgument);
  EXPECT_EQ(net_.closeSend(nullptr), ncclInvalidArgument);
  EXPECT_EQ(net_.closeRecv(nullptr), ncclInvalidArgument);
  EXPECT_EQ(net_.closeListen(nullptr), ncclInvalidArgument);
  EXPECT_TRUE(warned({"is NULL"})) << allWarnings();
  EXPECT_EQ(net_.finalize(), ncclSuccess);
}

// A non-NULL comm with NULL arrays, a zero or oversized group: rejected before the comm is
// touched (the fake comm pointer is never dereferenced).
TEST_P(EachVersion, MalformedGroupedReceiveIsInvalidArgument) {
  initAndCount();
  alignas(64) char fakeComm[256] = {};
  char buf[8];
  void* data[1] = {buf};
  size_t sizes[1] = {sizeof(buf)};
  int tags[1] = {0};
  void* mhs[1] = {nullptr};
  void* req = nullptr;
  EXPECT_EQ(net_.irecv(fakeComm, 1, nullptr, sizes, tags, mhs, &req), ncclInvalidArgument);
  EXPECT_EQ(net_.irecv(fakeComm, 1, data, nullptr, tags, mhs, &req), ncclInvalidArgument);
  EXPECT_EQ(net_.irecv(fakeComm, 1, data, sizes, nullptr, mhs, &req), ncclInvalidArgument);
  EXPECT_EQ(net_.irecv(fakeComm, 1, data, sizes, tags, nullptr, &req), ncclInvalidArgument);
  EXPECT_EQ(net_.irecv(fakeComm, 0, data, sizes, tags, mhs, &req), ncclInvalidArgument);
  EXPECT_EQ(net_.irecv(fakeComm, 1, data, sizes, tags, mhs, nullptr), ncclInvalidArgument);
  EXPECT_EQ(net_.finalize(), ncclSuccess);
}

// With no device, listen/connect fail cleanly (an error, no comm, no crash).
TEST_P(EachVersion, ListenAndConnectWithoutADeviceFail) {
  int ndev = initAndCount();
  if (ndev > 0) GTEST_SKIP() << "this machine has Mesh devices";
  char handle[NCCL_NET_HANDLE_MAXSIZE] = {};
  void* comm = reinterpret_cast<void*>(0x1);
  EXPECT_NE(net_.listen(0, handle, &comm), ncclSuccess);
  EXPECT_EQ(comm, nullptr);
  comm = reinterpret_cast<void*>(0x1);
  ncclNetDeviceHandle_v8_t* devComm = reinterpret_cast<ncclNetDeviceHandle_v8_t*>(0x1);
  EXPECT_NE(net_.connect(0, handle, &comm, &devComm), ncclSuccess);
  EXPECT_EQ(comm, nullptr);
  EXPECT_EQ(devComm, nullptr);
  EXPECT_EQ(net_.finalize(), ncclSuccess);
}

TEST_P(EachVersion, HostOnlyHooksAreHarmless) {
  initAndCount();
  void* dptr = reinterpret_cast<void*>(0x1);
  EXPECT_EQ(net_.getDeviceMr(nullptr, nullptr, &dptr), ncclSuccess);
  EXPECT_EQ(dptr, nullptr);
  EXPECT_EQ(net_.getDeviceMr(nullptr, nullptr, nullptr), ncclSuccess);
  EXPECT_EQ(net_.irecvConsumed(nullptr, 0, nullptr), ncclSuccess);
  EXPECT_EQ(net_.finalize(), ncclSuccess);
}

// Values NCCL checks: maxP2pBytes in (0, 1 TiB] (else NCCL fails the connection), a physical
// device's vProps {1, {dev}}. Needs a device: runs in the lab.
TEST_P(EachVersion, PropertiesAreInNcclsRange) {
  int ndev = initAndCount();
  if (ndev == 0) GTEST_SKIP() << "no Mesh device on this machine";
  for (int dev = 0; dev < ndev; ++dev) {
    SCOPED_TRACE("dev " + std::to_string(dev));
    netapi::Properties p;
    ASSERT_EQ(net_.getProperties(dev, &p), ncclSuccess);
    EXPECT_FALSE(p.name.empty());
    EXPECT_EQ(p.maxRecvs, 8);
    EXPECT_EQ(p.netDeviceType, NCCL_NET_DEVICE_HOST);
    EXPECT_EQ(p.forceFlush, 0);
    EXPECT_EQ(p.vDevCount, 1);
    EXPECT_EQ(p.vDevs[0], dev);
    EXPECT_GT(p.maxP2pBytes, 0u);
    EXPECT_LE(p.maxP2pBytes, NCCL_MAX_NET_SIZE_BYTES);
    EXPECT_GT(p.maxCollBytes, 0u);
    EXPECT_LE(p.maxCollBytes, NCCL_MAX_NET_SIZE_BYTES);
    if (GetParam() >= 9) {
      EXPECT_EQ(p.maxP2pBytes, NCCL_MAX_NET_SIZE_BYTES);
    }
    EXPECT_EQ(p.maxMultiRequestSize, 1);
    // v12 (net_devices.h): the whole mesh is rail 0, plane 0; older versions cannot say,
    // and NCCL's shims report NCCL_NET_ID_UNDEF for them.
    EXPECT_EQ(p.railId, GetParam() >= 12 ? 0 : NCCL_NET_ID_UNDEF);
    EXPECT_EQ(p.planeId, GetParam() >= 12 ? 0 : NCCL_NET_ID_UNDEF);
  }
  EXPECT_EQ(net_.finalize(), ncclSuccess);
}

// The reactor thread runs after init when there are devices (none without: no handshake to
// serve) and never outlives the library (NCCL may dlclose it after the last communicator).
// v11: two communicators, both finalized.
TEST_P(EachVersion, NoThreadOutlivesTheLibrary) {
  ASSERT_EQ(abitest::waitForPluginThreads(0), 0) << "a plugin thread from an earlier test still runs";
  for (int round = 1; round <= 2; ++round) {
    SCOPED_TRACE("load round " + std::to_string(round));
    netapi::NetApi first, second;
    ASSERT_NO_FATAL_FAILURE(open(GetParam(), &first));
    ASSERT_NO_FATAL_FAILURE(open(GetParam(), &second));
    ASSERT_EQ(first.init(captureLog, NCCL_NET_TRAFFIC_CLASS_UNDEF, 0x1111), ncclSuccess) << allWarnings();
    ASSERT_EQ(second.init(captureLog, NCCL_NET_TRAFFIC_CLASS_UNDEF, 0x2222), ncclSuccess) << allWarnings();
    int ndev = -1;
    ASSERT_EQ(second.devices(&ndev), ncclSuccess);
    EXPECT_EQ(abitest::pluginThreadCount(), ndev > 0 ? 1 : 0)
        << ndev << " device(s): two contexts should share one reactor thread, and there is none without devices";
    EXPECT_EQ(first.finalize(), ncclSuccess);
    EXPECT_EQ(second.finalize(), ncclSuccess);
    ASSERT_TRUE(closeLibrary()) << "dlclose did not unload " << kPluginName;
    EXPECT_EQ(abitest::waitForPluginThreads(0), 0) << "the reactor thread outlived dlclose";
  }
}

// Waits (bounded) for `pid`; false when it had to be killed.
bool reapWithin(pid_t pid, double seconds, int* status) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < deadline) {
    if (waitpid(pid, status, WNOHANG) == pid) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  kill(pid, SIGKILL);
  waitpid(pid, status, 0);
  return false;
}

// PyTorch's DataLoader workers and inference servers fork while NCCL runs. The child's
// RDMA resources are the parent's (one uverbs file, shared), and it has no reactor thread:
// it must refuse every call, and its exit() (which runs the library destructor) must
// neither join a thread that is not there nor tear anything down. The parent's plugin
// keeps working. In the lab the same test runs with devices and a live reactor thread.
TEST_P(EachVersion, AForkedChildExitsWithoutTouchingTheParentsPlugin) {
  int ndev = initAndCount();
  int threads = abitest::pluginThreadCount();
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  ASSERT_GE(pid, 0) << strerror(errno);
  if (pid == 0) {
    int n = -1;
    int code = net_.devices(&n) == ncclSystemError ? 0 : 3;
    exit(code);  // not _exit: the library destructor runs, as in a real child
  }
  int status = 0;
  ASSERT_TRUE(reapWithin(pid, 20, &status)) << "the forked child hung in exit() (joining the parent's reactor "
                                               "thread, or tearing down the parent's RDMA objects?)";
  ASSERT_TRUE(WIFEXITED(status)) << "the child died of signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "devices() in the forked child was not refused with ncclSystemError";
  int again = -1;
  EXPECT_EQ(net_.devices(&again), ncclSuccess) << allWarnings();
  EXPECT_EQ(again, ndev);
  EXPECT_EQ(abitest::pluginThreadCount(), threads);
  EXPECT_EQ(net_.finalize(), ncclSuccess);
}

// A child forked while another thread is inside the first init (NCCL initializes from its own
// thread while the application forks) inherits init's lock held by a thread it does not have.
// Its exit() runs the library destructor, which must not wait for that lock, and a call into
// the plugin must be refused at once. The logger holds the first init still at its version
// line, the first one init logs with its lock taken. (Before the fork handler was registered
// ahead of init's work, the child hung in exit() here.)
// Never destroyed: the child's exit() would wait in the condition variable's destructor for
// the parent's thread waiting on it.
std::mutex& gHoldMutex = *new std::mutex;
std::condition_variable& gHoldCv = *new std::condition_variable;
bool gHolding = false;
bool gRelease = false;

extern "C" void holdingLog(ncclDebugLogLevel /*level*/, unsigned long /*flags*/, const char* /*file*/, int /*line*/,
                           const char* fmt, ...) {
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  if (strstr(buf, "nccl-mesh ") == nullptr) return;
  std::unique_lock<std::mutex> lock(gHoldMutex);
  if (gHolding) return;
  gHolding = true;
  gHoldCv.notify_all();
  gHoldCv.wait(lock, [] { return gRelease; });
}

TEST_F(AbiVersions, AChildForkedDuringInitIsRefusedAndExits) {
  netapi::NetApi net;
  ASSERT_NO_FATAL_FAILURE(open(8, &net));
  ncclResult_t initRc = ncclInternalError;
  std::thread initThread([&] { initRc = net.init(holdingLog); });
  auto release = [&] {
    {
      std::lock_guard<std::mutex> lock(gHoldMutex);
      gRelease = true;
    }
    gHoldCv.notify_all();
    initThread.join();
  };
  {
    std::unique_lock<std::mutex> lock(gHoldMutex);
    if (!gHoldCv.wait_for(lock, std::chrono::seconds(20), [] { return gHolding; })) {
      lock.unlock();
      release();
      FAIL() << "init never logged its version line";
    }
  }
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    alarm(20);  // a child that waits for the lock is killed (the parent reports it)
    int n = -1;
    int code = net.devices(&n) == ncclSystemError ? 0 : 3;
    exit(code);  // not _exit: the library destructor runs
  }
  int status = 0;
  bool reaped = pid > 0 && reapWithin(pid, 30, &status);
  release();
  ASSERT_GT(pid, 0) << strerror(errno);
  ASSERT_TRUE(reaped) << "the forked child hung";
  ASSERT_TRUE(WIFEXITED(status)) << "the child died of signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0)
                                 << " (SIGALRM: it waited for the init lock its parent's thread held)";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "devices() in the child was not refused with ncclSystemError";
  EXPECT_EQ(initRc, ncclSuccess);
  EXPECT_EQ(net.finalize(), ncclSuccess);
}

// NCCL's proxy thread calls setNetAttr (and listen/connect) with a context before every try
// of a connect (2.30.7 src/transport/net.cc:224), each a lookup under the context table's
// lock. A child forked while that lock is held has it locked for good; its exit() runs the
// library destructors, which must not wait for it (children hung: 12 of 300 forks in a
// tight loop). MESH_TEST_CONTEXT_HOLD_MS keeps each lookup inside the lock for that long,
// so that every fork here lands while it is held.
TEST_F(AbiVersions, AChildForkedWhileTheProxyThreadUsesAContextExits) {
  setenv("MESH_TEST_CONTEXT_HOLD_MS", "40", 1);
  struct Unset {
    ~Unset() { unsetenv("MESH_TEST_CONTEXT_HOLD_MS"); }
  } unset;
  netapi::NetApi net;
  ASSERT_NO_FATAL_FAILURE(open(12, &net));
  ASSERT_EQ(net.init(captureLog), ncclSuccess) << allWarnings();
  void* ctx = net.context();
  ASSERT_NE(ctx, nullptr);
  const auto* v12 = table<ncclNet_v12_t>("ncclNetPlugin_v12");
  ASSERT_NE(v12, nullptr);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> calls{0};
  std::thread proxy([&] {
    ncclNetAttr_v11_t attr;
    memset(&attr, 0, sizeof(attr));
    while (!stop.load(std::memory_order_relaxed)) {
      v12->setNetAttr(ctx, &attr);
      calls.fetch_add(1, std::memory_order_relaxed);
    }
  });
  while (calls.load() == 0) std::this_thread::yield();
  const int kForks = 5;
  int hung = 0, bad = 0;
  for (int i = 0; i < kForks; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // somewhere inside a held lookup
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
      alarm(5);  // a child that waits for the lock dies of SIGALRM
      exit(0);   // not _exit: the library destructors run, as in a real child
    }
    ASSERT_GT(pid, 0) << strerror(errno);
    int status = 0;
    if (!reapWithin(pid, 10, &status) || (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM)) {
      ++hung;
    } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      ++bad;
    }
  }
  stop = true;
  proxy.join();
  EXPECT_EQ(hung, 0) << hung << " of " << kForks << " children hung in exit() on the context table's lock";
  EXPECT_EQ(bad, 0) << bad << " of " << kForks << " children did not exit 0";
  EXPECT_EQ(net.finalize(), ncclSuccess);
}

// A library loaded before the plugin (libtorch, an inference server) may destroy its last
// communicator from one of its own static destructors, so NCCL's finalize can come while the
// process exits, after every static object the plugin created was destroyed: the context
// registry must outlive them (it did not: finalize then returned ncclInvalidArgument, and
// ncclCommDestroy an error). Here an atexit handler registered before the dlopen plays that
// library: it runs after everything the plugin registered and finalizes the context.
netapi::NetApi* gExitNet = nullptr;
void finalizeAtExit() { _exit(gExitNet->finalize() == ncclSuccess ? 0 : 4); }

TEST_F(AbiVersions, FinalizeFromAnEarlierLibrarysExitHandlerStillFindsItsContext) {
  for (int version : {11, 12}) {
    SCOPED_TRACE("v" + std::to_string(version));
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    ASSERT_GE(pid, 0) << strerror(errno);
    if (pid == 0) {
      atexit(finalizeAtExit);
      gExitNet = new netapi::NetApi();
      openLibrary();
      std::string why;
      if (lib_ == nullptr || !gExitNet->bind(lib_, version, &why)) _exit(2);
      if (gExitNet->init(captureLog) != ncclSuccess) _exit(3);
      exit(0);  // static destructors, then finalizeAtExit
    }
    int status = 0;
    ASSERT_TRUE(reapWithin(pid, 20, &status)) << "the child hung in exit()";
    ASSERT_TRUE(WIFEXITED(status)) << "the child died of signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    EXPECT_EQ(WEXITSTATUS(status), 0) << "4: finalize from the exit handler failed (the context registry was "
                                         "destroyed before it); 2/3: bind/init failed";
  }
}

// net_api.h passes size_t sizes through from v9 on; for v8 it refuses a size int cannot
// hold before calling the plugin (so the plugin logs nothing).
TEST_P(EachVersion, NetApiNarrowsSizesOnlyForV8) {
  initAndCount();
  clearLog();
  void* req = nullptr;
  const size_t threeGiB = size_t{3} << 30;
  EXPECT_EQ(net_.isend(nullptr, nullptr, threeGiB, 0, nullptr, &req), ncclInvalidArgument);
  if (GetParam() == 8) {
    EXPECT_FALSE(warned({"isend"})) << "the wrapper should have refused the size itself:" << allWarnings();
  } else {
    EXPECT_TRUE(warned({"isend", "sendComm is NULL"})) << allWarnings();
  }
  EXPECT_EQ(net_.finalize(), ncclSuccess);
}

TEST(NetApi, ParsesVersionNames) {
  EXPECT_EQ(netapi::parseVersion("v8"), 8);
  EXPECT_EQ(netapi::parseVersion("v9"), 9);
  EXPECT_EQ(netapi::parseVersion("10"), 10);
  EXPECT_EQ(netapi::parseVersion("V11"), 11);
  EXPECT_EQ(netapi::parseVersion("v12"), 12);
  EXPECT_EQ(netapi::parseVersion("v13"), 0);
  EXPECT_EQ(netapi::parseVersion("v7"), 0);
  EXPECT_EQ(netapi::parseVersion(""), 0);
  EXPECT_EQ(netapi::parseVersion("v"), 0);
}

TEST_F(AbiVersions, NetApiRefusesUnknownVersions) {
  ASSERT_NO_FATAL_FAILURE(openLibrary());
  netapi::NetApi net;
  std::string why;
  EXPECT_FALSE(net.bind(lib_, 13, &why));
  EXPECT_NE(why.find("unknown ncclNet version 13"), std::string::npos) << why;
  int ndev = 0;
  EXPECT_EQ(net.devices(&ndev), ncclInvalidUsage) << "an unbound NetApi calls nothing";
}

// --- v8 --------------------------------------------------------------------------------------

// v8 sizes are int, and NCCL never gives a v8 plugin more than 1 GiB per message.
TEST_F(AbiVersions, V8RefusesSendsOverOneGiB) {
  const auto* v8 = table<ncclNet_v8_t>("ncclNetPlugin_v8");
  ASSERT_NE(v8, nullptr);
  ASSERT_EQ(v8->init(captureLog), ncclSuccess);
  void* req = reinterpret_cast<void*>(0x1);
  // A NULL comm: the size is refused before the comm is looked at, and were it not, the NULL
  // check would answer with another message (the test fails; it does not crash the binary).
  EXPECT_EQ(v8->isend(nullptr, nullptr, (1 << 30) + 1, 0, nullptr, &req), ncclInvalidArgument);
  EXPECT_TRUE(warned({"isend", "1 GiB"})) << allWarnings();
  EXPECT_FALSE(warned({"sendComm is NULL"})) << allWarnings();
  clearLog();
  EXPECT_EQ(v8->isend(nullptr, nullptr, INT_MAX, 0, nullptr, &req), ncclInvalidArgument);
  EXPECT_TRUE(warned({"isend", "1 GiB"})) << allWarnings();
  clearLog();
  EXPECT_EQ(v8->isend(nullptr, nullptr, -1, 0, nullptr, &req), ncclInvalidArgument);
  EXPECT_TRUE(warned({"isend", "negative size"})) << allWarnings();
  // irecv looks for a NULL comm before the sizes: it needs one, never dereferenced while the
  // negative size is refused first.
  alignas(64) char fakeComm[256] = {};
  int sizes[1] = {-5};
  int tags[1] = {0};
  char buf[8];
  void* data[1] = {buf};
  void* mhs[1] = {nullptr};
  EXPECT_EQ(v8->irecv(fakeComm, 1, data, sizes, tags, mhs, &req), ncclInvalidArgument);
  EXPECT_TRUE(warned({"irecv", "negative size"})) << allWarnings();
}

// --- v10 -------------------------------------------------------------------------------------

// A class the GRH cannot carry is reported and replaced by the default, never an error
// (NCCL's IB transport takes the value unchecked); the connect goes on as with any class, so
// here it stops at the zeroed handle exactly as a valid class does.
TEST_F(AbiVersions, V10ConnectReportsAnOutOfRangeTrafficClassAndGoesOn) {
  const auto* v10 = table<ncclNet_v10_t>("ncclNetPlugin_v10");
  ASSERT_NE(v10, nullptr);
  ASSERT_EQ(v10->init(captureLog, nullptr), ncclSuccess);  // no profiler: accepted
  char handle[NCCL_NET_HANDLE_MAXSIZE] = {};
  void* comm = nullptr;
  ncclNetCommConfig_v10_t good = {106};
  ncclResult_t expected = v10->connect(0, &good, handle, &comm, nullptr);
  EXPECT_NE(expected, ncclSuccess) << "a zeroed handle";
  ncclNetCommConfig_v10_t bad = {256};
  EXPECT_EQ(v10->connect(0, &bad, handle, &comm, nullptr), expected);
  EXPECT_TRUE(warned({"traffic class 256", "0..255", "using the default"})) << allWarnings();
  clearLog();
  EXPECT_EQ(v10->connect(0, &bad, handle, &comm, nullptr), expected);
  EXPECT_FALSE(warned({"traffic class 256"})) << "NCCL's next try of the same connect: reported once";
  bad.trafficClass = -2;
  EXPECT_EQ(v10->connect(0, &bad, handle, &comm, nullptr), expected);
  EXPECT_TRUE(warned({"traffic class -2"})) << allWarnings();
  // UNDEF, or no config at all (NCCL's GPUDirect probe passes NULL) get as far too; a NULL
  // handle is still caught.
  ncclNetCommConfig_v10_t undef = {NCCL_NET_TRAFFIC_CLASS_UNDEF};
  EXPECT_EQ(v10->connect(0, &undef, handle, &comm, nullptr), expected);
  EXPECT_EQ(v10->connect(0, &good, nullptr, &comm, nullptr), ncclInvalidArgument);
  EXPECT_EQ(v10->connect(0, &undef, nullptr, &comm, nullptr), ncclInvalidArgument);
  EXPECT_EQ(v10->connect(0, nullptr, nullptr, &comm, nullptr), ncclInvalidArgument);
}

// --- v11 and v12: per-communicator contexts ------------------------------------------------

template <typename Table>
struct ContextTableSymbol;
template <>
struct ContextTableSymbol<ncclNet_v11_t> {
  static constexpr const char* kName = "ncclNetPlugin_v11";
};
template <>
struct ContextTableSymbol<ncclNet_v12_t> {
  static constexpr const char* kName = "ncclNetPlugin_v12";
};

// The raw v11 and v12 tables (the same 21 entry points and context rules).
template <typename Table>
class ContextTables : public AbiVersions {
 protected:
  void SetUp() override {
    AbiVersions::SetUp();
    net_ = this->template table<Table>(ContextTableSymbol<Table>::kName);
    ASSERT_NE(net_, nullptr) << "no " << ContextTableSymbol<Table>::kName;
  }
  void* initContext(uint64_t commId, ncclNetCommConfig_v11_t* config) {
    void* ctx = nullptr;
    EXPECT_EQ(this->net_->init(&ctx, commId, config, captureLog, nullptr), ncclSuccess) << allWarnings();
    EXPECT_NE(ctx, nullptr);
    return ctx;
  }
  const Table* net_ = nullptr;
};

struct ContextTableNames {
  template <typename T>
  static std::string GetName(int) {
    return ContextTableSymbol<T>::kName + 14;  // "v11" / "v12"
  }
};
using ContextTableTypes = ::testing::Types<ncclNet_v11_t, ncclNet_v12_t>;
TYPED_TEST_SUITE(ContextTables, ContextTableTypes, ContextTableNames);

// One context per communicator; the plugin underneath is initialized once and survives the
// last finalize (only the library destructor tears it down).
TYPED_TEST(ContextTables, TwoCommunicatorsInitAndFinalize) {
  ncclNetCommConfig_v11_t config = {NCCL_NET_TRAFFIC_CLASS_UNDEF};
  void* a = this->initContext(0xaaaa, &config);
  void* b = this->initContext(0xbbbb, nullptr);  // no config: defaults
  EXPECT_NE(a, b);
  int ndev = -1;
  EXPECT_EQ(this->net_->devices(&ndev), ncclSuccess);
  EXPECT_EQ(this->net_->finalize(a), ncclSuccess);
  EXPECT_EQ(this->net_->devices(&ndev), ncclSuccess) << "finalizing one communicator must not stop the plugin";
  EXPECT_EQ(this->net_->finalize(b), ncclSuccess);
  int again = -1;
  EXPECT_EQ(this->net_->devices(&again), ncclSuccess) << "the last finalize must not tear the plugin down";
  EXPECT_EQ(again, ndev);
  void* c = this->initContext(0xcccc, &config);
  EXPECT_EQ(this->net_->finalize(c), ncclSuccess);
}

TYPED_TEST(ContextTables, NullOrStaleContextIsAnErrorNotACrash) {
  void* ctx = this->initContext(0x1, nullptr);
  char handle[NCCL_NET_HANDLE_MAXSIZE] = {};
  void* comm = reinterpret_cast<void*>(0x1);
  EXPECT_EQ(this->net_->listen(nullptr, 0, handle, &comm), ncclInvalidArgument);
  EXPECT_EQ(this->net_->connect(nullptr, 0, handle, &comm, nullptr), ncclInvalidArgument);
  EXPECT_TRUE(warned({"ctx is NULL"})) << allWarnings();
  int foreign = 0;  // never returned by init: looked up, not dereferenced
  EXPECT_EQ(this->net_->listen(&foreign, 0, handle, &comm), ncclInvalidArgument);
  EXPECT_EQ(this->net_->connect(&foreign, 0, handle, &comm, nullptr), ncclInvalidArgument);
  EXPECT_EQ(this->net_->finalize(&foreign), ncclInvalidArgument);
  EXPECT_TRUE(warned({"not a live context"})) << allWarnings();
  // NCCL never passes NULL (2.28.9/2.30.7 src/plugin/net.cc finalize only a context its init
  // returned), and NCCL IB's finalize accepts it (2.28.9 net_ib.cc ncclIbFinalize: free(ctx)):
  // success, and no WARN in NCCL's log.
  clearLog();
  EXPECT_EQ(this->net_->finalize(nullptr), ncclSuccess);
  EXPECT_FALSE(warned({"finalize"})) << allWarnings();
  EXPECT_EQ(this->net_->init(nullptr, 0x2, nullptr, captureLog, nullptr), ncclInvalidArgument);

  EXPECT_EQ(this->net_->finalize(ctx), ncclSuccess);
  EXPECT_EQ(this->net_->finalize(ctx), ncclInvalidArgument) << "double finalize";
  EXPECT_EQ(this->net_->listen(ctx, 0, handle, &comm), ncclInvalidArgument) << "listen after finalize";
  EXPECT_EQ(this->net_->connect(ctx, 0, handle, &comm, nullptr), ncclInvalidArgument) << "connect after finalize";
}

// A live context gets as far as the missing device; its NULL pointers are still caught.
TYPED_TEST(ContextTables, ListenAndConnectWithALiveContext) {
  void* ctx = this->initContext(0x1, nullptr);
  int ndev = -1;
  ASSERT_EQ(this->net_->devices(&ndev), ncclSuccess);
  char handle[NCCL_NET_HANDLE_MAXSIZE] = {};
  void* comm = nullptr;
  EXPECT_EQ(this->net_->listen(ctx, 0, nullptr, &comm), ncclInvalidArgument);
  EXPECT_EQ(this->net_->connect(ctx, 0, nullptr, &comm, nullptr), ncclInvalidArgument);
  if (ndev == 0) {
    EXPECT_NE(this->net_->listen(ctx, 0, handle, &comm), ncclSuccess);
    EXPECT_EQ(comm, nullptr);
  }
  EXPECT_EQ(this->net_->finalize(ctx), ncclSuccess);
}

// NCCL 2.28.9/2.30.7 take a failed init as "this plugin is unusable" and quietly run the
// communicator, and every later one, over their own transports (src/plugin/net.cc): a class
// the GRH cannot carry is reported, and the communicator gets the default.
TYPED_TEST(ContextTables, AnOutOfRangeTrafficClassAtInitIsReportedNotFatal) {
  ncclNetCommConfig_v11_t config = {300};
  void* ctx = this->initContext(0x1, &config);
  EXPECT_TRUE(warned({"traffic class 300", "0..255", "using the default"})) << allWarnings();
  EXPECT_TRUE(logged({"communicator 0000000000000001 (traffic class -1: NCCL_MESH_IB_TC)"}));
  EXPECT_EQ(this->net_->finalize(ctx), ncclSuccess);
  for (int tc : {0, 106, 255, NCCL_NET_TRAFFIC_CLASS_UNDEF}) {
    config.trafficClass = tc;
    void* ok = this->initContext(0x2, &config);
    EXPECT_EQ(this->net_->finalize(ok), ncclSuccess) << "traffic class " << tc;
  }
}

TYPED_TEST(ContextTables, SetNetAttrIsAccepted) {
  void* ctx = this->initContext(0x1, nullptr);
  ncclNetAttr_v11_t attr;
  attr.sendCommAttr = {4, NCCL_NET_ATTR_UNDEF, 2, NCCL_NET_ATTR_UNDEF};
  attr.recvCommAttr = {4, NCCL_NET_ATTR_UNDEF, 2, NCCL_NET_ATTR_UNDEF};
  attr.op = 1u << 4;
  attr.algo = static_cast<uint32_t>(NCCL_NET_ATTR_UNDEF);
  attr.proto = static_cast<uint32_t>(NCCL_NET_ATTR_UNDEF);
  EXPECT_EQ(this->net_->setNetAttr(ctx, &attr), ncclSuccess);
  EXPECT_EQ(this->net_->setNetAttr(ctx, nullptr), ncclInvalidArgument);
  EXPECT_EQ(this->net_->setNetAttr(nullptr, &attr), ncclInvalidArgument);
  EXPECT_EQ(this->net_->finalize(ctx), ncclSuccess);
  EXPECT_EQ(this->net_->setNetAttr(ctx, &attr), ncclInvalidArgument) << "after finalize";
}

// NCCL 2.28.9 calls setNetAttr before every try of a connect that is not done yet
// (src/transport/net.cc sendProxyConnect/recvProxyConnect), thousands of times per relayed
// connect: the recorder (NCCL_MESH_TRACE) writes a run of identical calls (same thread,
// context and result) as one record with again=N; another result starts a new record. The
// unload writes the file.
TYPED_TEST(ContextTables, TheRecorderWritesARunOfIdenticalSetNetAttrAsOneRecord) {
  char dir[] = "/tmp/mesh-abi-trace.XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  std::string prefix = std::string(dir) + "/t";
  setenv("NCCL_MESH_TRACE", prefix.c_str(), 1);
  void* ctx = this->initContext(0x1, nullptr);
  unsetenv("NCCL_MESH_TRACE");
  ncclNetAttr_v11_t attr;
  memset(&attr, 0, sizeof(attr));
  attr.algo = static_cast<uint32_t>(NCCL_NET_ATTR_UNDEF);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(this->net_->setNetAttr(ctx, &attr), ncclSuccess);
  EXPECT_EQ(this->net_->setNetAttr(ctx, nullptr), ncclInvalidArgument);
  EXPECT_EQ(this->net_->setNetAttr(ctx, &attr), ncclSuccess);
  EXPECT_EQ(this->net_->finalize(ctx), ncclSuccess);
  ASSERT_TRUE(this->closeLibrary());
  std::vector<std::string> calls;
  std::string last;
  DIR* d = opendir(dir);
  ASSERT_NE(d, nullptr);
  int files = 0;
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (name[0] == '.') continue;
    std::string path = std::string(dir) + "/" + name;
    ++files;
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) {
      size_t at = line.find(" setnetattr ");
      if (at != std::string::npos) calls.push_back(line.substr(at + 1));
      last = line;
    }
    unlink(path.c_str());
  }
  closedir(d);
  rmdir(dir);
  EXPECT_EQ(files, 1);
  EXPECT_EQ(last, "end exit") << "the unload ends the file with its complete-recording mark";
  ASSERT_EQ(calls.size(), 3u) << ::testing::PrintToString(calls);
  EXPECT_NE(calls[0].find(" r=0 again=4"), std::string::npos) << calls[0];
  EXPECT_NE(calls[1].find(" r=4"), std::string::npos) << calls[1];
  EXPECT_EQ(calls[1].find("again="), std::string::npos) << calls[1];
  EXPECT_NE(calls[2].find(" r=0"), std::string::npos) << calls[2];
  EXPECT_EQ(calls[2].find("again="), std::string::npos) << calls[2];
}

// Communicators NCCL never finalized (an aborted job) are freed by the library's unload;
// the fixture checks the unload itself, sanitizer builds check the memory.
TYPED_TEST(ContextTables, ContextsLeftOpenAreReleasedAtUnload) {
  this->initContext(0x1, nullptr);
  this->initContext(0x2, nullptr);
}

// --- the set of symbols, as NCCL's loader sees it ----------------------------------------------

// NCCL 2.30 takes the first of v12, v11, ... it finds; 2.28 the first of v11, v10, v9, v8.
// Exactly the five net tables are there, and no collective-network table (the plugin has
// none).
TEST_F(AbiVersions, ExportsV8ToV12AndNothingElseNcclLooksFor) {
  ASSERT_NO_FATAL_FAILURE(openLibrary());
  for (int v : netapi::kVersions) {
    EXPECT_NE(dlsym(lib_, netapi::symbolFor(v)), nullptr) << netapi::symbolFor(v);
  }
  for (const char* absent : {"ncclNetPlugin_v13", "ncclNetPlugin_v7", "ncclNetPlugin_v6", "ncclNetPlugin_v5",
                             "ncclCollNetPlugin_v12", "ncclCollNetPlugin_v11", "ncclCollNetPlugin_v10",
                             "ncclCollNetPlugin_v9", "ncclCollNetPlugin_v8"}) {
    EXPECT_EQ(dlsym(lib_, absent), nullptr) << absent << " should not be exported";
  }
}

// The tests assume the plugin's defaults: drop NCCL_MESH_* settings from the caller's shell.
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
