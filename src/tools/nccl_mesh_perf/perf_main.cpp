// SPDX-License-Identifier: Apache-2.0
// nccl-mesh-perf: point-to-point latency and bandwidth of a ncclNet plugin between two
// ranks, measured through the plugin's ABI exactly as NCCL drives it: dlopen of the .so
// (--plugin), dlsym("ncclNetPlugin_v8"), non-blocking connect/accept, registered host
// buffers, isend/irecv/test. Of the modules it uses only the tools' helpers (the control
// channel, the data pattern, the report), never the plugin's own code.
//
//   rank 0 <-> rank 1: ping-pong latency (half the round trip; typical = median, as
//   perftest's t_typical), then rank 0 -> rank 1 bandwidth with a window of outstanding
//   sends (from the first accepted isend to the last send completion, as perftest). After
//   each size's timed transfers, one verified transfer: the sender writes a pattern, the
//   receiver (its buffer cleared first) counts the bytes that differ.
//
// How the two ranks meet:
//   --server / --client HOST[:PORT]  two real hosts, over TCP on the management network;
//       the server (rank 1) takes the client's (rank 0's) parameters and serves one run.
//   --rank R --rendezvous DIR         the lab: handles in files of a shared directory (each
//       written under a temporary name and rename()d); both ranks must be given the same
//       options.
// Rank 0 prints nccl-tests-style tables (GB/s = 1e9 B/s) and, for scripts, one line per
// measurement (MB = 2^20 B, perftest's unit; scripts/bench-lab.sh reads them):
//   PERF lat size=8 usec=<typical> avg=<> min=<> iters=<n> wrong=<bytes>
//   PERF bw size=65536 MBps=<> GBps=<> iters=<n> window=<w> wrong=<bytes>
// Exit status: 0 done and every check exact; 1 a failure (plugin, network, timeout); 2 bad
// command line; 3 hung past --timeout; 4 the data check found wrong bytes.
#include <dlfcn.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "mesh/platform/page.h"
#include "mesh/platform/text.h"
#include "mesh/platform/version.h"
#include "mesh/tools/perf_report.h"
#include "mesh/tools/tool_net.h"
#include "net_v8.h"

namespace {

using Clock = std::chrono::steady_clock;
using mesh::strf;
constexpr int kDefaultPort = 18600;
constexpr int kExitFail = 1, kExitUsage = 2, kExitHung = 3, kExitWrongData = 4;

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// --- the plugin's log ------------------------------------------------------------------

std::mutex gLogMutex;
std::string gLastWarn;
bool gVerbose = false;

extern "C" void perfLogger(ncclDebugLogLevel level, unsigned long, const char*, int, const char* fmt, ...) {
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  std::lock_guard<std::mutex> lock(gLogMutex);
  if (level == NCCL_LOG_WARN) {
    gLastWarn = buf;
    fprintf(stderr, "nccl-mesh-perf: plugin WARN %s\n", buf);
  } else if (gVerbose && level <= NCCL_LOG_INFO) {
    fprintf(stderr, "nccl-mesh-perf: plugin %s\n", buf);
  }
}

const char* resultName(ncclResult_t r) {
  static const char* const kNames[] = {"ncclSuccess", "ncclUnhandledCudaError", "ncclSystemError",
                                       "ncclInternalError", "ncclInvalidArgument", "ncclInvalidUsage",
                                       "ncclRemoteError", "ncclInProgress"};
  return r >= 0 && r < ncclNumResults ? kNames[r] : "ncclResult(unknown)";
}

void check(ncclResult_t r, const std::string& what) {
  if (r == ncclSuccess) return;
  std::lock_guard<std::mutex> lock(gLogMutex);
  throw Error(strf("%s returned %s (%d)%s%s", what.c_str(), resultName(r), static_cast<int>(r),
                   gLastWarn.empty() ? "" : "; plugin's last WARN: ", gLastWarn.c_str()));
}

// --- options ----------------------------------------------------------------------------

enum class Mode { Files, Server, Client };

struct Options {
  Mode mode = Mode::Files;
  int rank = -1;
  std::string rendezvous, tag = "perf";
  std::string host, bind;
  int port = kDefaultPort;
  std::string plugin = "libnccl-net-mesh.so";
  int dev = 0;
  mesh::PerfParams p;
  int bwIdleSleepUs = 0;  // bandwidth phase, after an empty poll: 0 = sched_yield(), N = sleep N us
  double timeout = 300;
  std::string csvFile, jsonFile;
  bool progress = false;
};

void usage(FILE* out) {
  fprintf(out,
          "usage: nccl-mesh-perf --server [--port P] [--bind ADDR] [options]     (on one host)\n"
          "       nccl-mesh-perf --client HOST[:P] [options]                     (on the other)\n"
          "       nccl-mesh-perf --rank R --rendezvous DIR [options]              (lab: both ranks)\n"
          "       nccl-mesh-perf --version | --help\n"
          "Meeting:\n"
          "  --server            rank 1: wait for one client on TCP port P (%d) of the management\n"
          "                      network, take its parameters, serve one run, exit\n"
          "  --client HOST[:P]   rank 0: connect to the server, run, print the results\n"
          "  --bind ADDR         the server's listening address (default: every interface)\n"
          "  --rank R            0 or 1 (default $VMESH_RANK), with --rendezvous DIR: a directory\n"
          "                      both ranks can write (default $VMESH_SHARED); --tag NAME file\n"
          "                      prefix in DIR (perf), new for each run in a reused directory\n"
          "Plugin:\n"
          "  --plugin PATH       plugin library (libnccl-net-mesh.so via LD_LIBRARY_PATH)\n"
          "  --dev D             plugin device (0)\n"
          "Sizes (K/M/G suffixes, binary):\n"
          "  --min-lat B --max-lat B --lat-factor F   latency sizes (8 .. 64K, x4; max always run)\n"
          "  --lat-sizes B,B,... latency sizes, explicitly\n"
          "  --iters N | --lat-iters N   ping-pongs per size (30); --lat-warmup N (5)\n"
          "  --min-bw B --max-bw B --bw-factor F      bandwidth sizes (4K .. 64M, x4)\n"
          "  --bw-sizes B,B,...  bandwidth sizes, explicitly\n"
          "  --bw-iters N (20) --bw-warmup N (2, within a quarter of --bw-bytes)\n"
          "  --bw-window W       outstanding sends (8, at most 32)\n"
          "  --bw-bytes B        cap on bytes per bandwidth size: iters = min(bw-iters,\n"
          "                      max(1, B / size)) (8M; raise it on real hardware, e.g. 4G)\n"
          "  --no-lat | --no-bw  skip a part\n"
          "  --no-check          skip the verified transfer after each size\n"
          "Output (rank 0):\n"
          "  --csv FILE, --json FILE   the results as CSV / JSON as well (plot the CSV with\n"
          "                      scripts/plot-perf.py)\n"
          "  --progress          a progress line on stderr even when it is not a terminal\n"
          "                      (on a terminal it is always shown)\n"
          "  -v | --verbose      echo the plugin's INFO lines\n"
          "Other:\n"
          "  --timeout S         give up after S seconds (300)\n"
          "  --bw-idle-sleep-us N  in the bandwidth phase, after a poll that found nothing,\n"
          "                      sleep N us instead of sched_yield() (0). Receivers poll as NCCL's\n"
          "                      proxy does (spin, yielding the CPU when idle); only in emulated\n"
          "                      labs, where a spinning poller takes the host CPU the emulated\n"
          "                      NIC needs, does sleeping measure better\n"
          "Exit status: 0 ok; 1 failure; 2 bad command line; 3 hung; 4 wrong data received.\n",
          kDefaultPort);
}

size_t parseSize(const std::string& s) {
  char* end = nullptr;
  unsigned long long v = strtoull(s.c_str(), &end, 10);
  if (end == s.c_str()) throw Error("bad size '" + s + "'");
  std::string suf(end);
  if (suf == "K" || suf == "k") v <<= 10;
  else if (suf == "M" || suf == "m") v <<= 20;
  else if (suf == "G" || suf == "g") v <<= 30;
  else if (!suf.empty()) throw Error("bad size '" + s + "'");
  return static_cast<size_t>(v);
}

std::vector<size_t> parseList(const std::string& s) {
  std::vector<size_t> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t comma = s.find(',', start);
    std::string item = s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!item.empty()) out.push_back(parseSize(item));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

std::vector<size_t> geometric(size_t lo, size_t hi, size_t factor) {
  std::vector<size_t> out;
  if (factor < 2) throw Error("size factor must be >= 2");
  for (size_t s = lo; s <= hi && s != 0; s *= factor) out.push_back(s);
  if (out.empty() || out.back() != hi) out.push_back(hi);
  return out;
}

void validate(const mesh::PerfParams& p) {
  if (p.latIters < 1 || p.latWarmup < 0 || p.bwIters < 1 || p.bwWarmup < 0) {
    throw Error("iterations must be >= 1, warmups >= 0");
  }
  if (p.bwWindow < 1 || p.bwWindow > NCCL_NET_MAX_REQUESTS) throw Error("--bw-window must be 1..32");
  for (size_t s : p.latSizes) {
    if (s > (1u << 30)) throw Error("sizes must be <= 1 GiB (v8 isend takes an int)");
  }
  for (size_t s : p.bwSizes) {
    if (s == 0 || s > (1u << 30)) throw Error("bandwidth sizes must be 1 B .. 1 GiB");
  }
}

Options parseArgs(int argc, char** argv) {
  Options o;
  const char* r = getenv("VMESH_RANK");
  if (r && *r) o.rank = atoi(r);
  const char* d = getenv("VMESH_SHARED");
  if (d) o.rendezvous = d;
  size_t minLat = 8, maxLat = 64 << 10, latFactor = 4, minBw = 4 << 10, maxBw = 64 << 20, bwFactor = 4;
  bool latList = false, bwList = false, portSet = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw Error("option " + a + " needs a value");
      return argv[++i];
    };
    if (a == "-h" || a == "--help") {
      usage(stdout);
      exit(0);
    } else if (a == "--version") {
      printf("nccl-mesh-perf: %s\n", mesh::versionText().c_str());
      exit(0);
    } else if (a == "--server") o.mode = Mode::Server;
    else if (a == "--client") o.mode = Mode::Client, o.host = value();
    else if (a == "--port") o.port = atoi(value().c_str()), portSet = true;
    else if (a == "--bind") o.bind = value();
    else if (a == "--rank") o.rank = atoi(value().c_str());
    else if (a == "--rendezvous") o.rendezvous = value();
    else if (a == "--tag") o.tag = value();
    else if (a == "--plugin") o.plugin = value();
    else if (a == "--dev") o.dev = atoi(value().c_str());
    else if (a == "--min-lat") minLat = parseSize(value());
    else if (a == "--max-lat") maxLat = parseSize(value());
    else if (a == "--lat-factor") latFactor = parseSize(value());
    else if (a == "--lat-sizes") o.p.latSizes = parseList(value()), latList = true;
    else if (a == "--iters" || a == "--lat-iters") o.p.latIters = atoi(value().c_str());
    else if (a == "--lat-warmup" || a == "--warmup") o.p.latWarmup = atoi(value().c_str());
    else if (a == "--min-bw") minBw = parseSize(value());
    else if (a == "--max-bw") maxBw = parseSize(value());
    else if (a == "--bw-factor") bwFactor = parseSize(value());
    else if (a == "--bw-sizes") o.p.bwSizes = parseList(value()), bwList = true;
    else if (a == "--bw-iters") o.p.bwIters = atoi(value().c_str());
    else if (a == "--bw-warmup") o.p.bwWarmup = atoi(value().c_str());
    else if (a == "--bw-window") o.p.bwWindow = atoi(value().c_str());
    else if (a == "--bw-bytes") o.p.bwBytes = parseSize(value());
    else if (a == "--no-lat") o.p.lat = false;
    else if (a == "--no-bw") o.p.bw = false;
    else if (a == "--no-check") o.p.check = false;
    else if (a == "--bw-idle-sleep-us") o.bwIdleSleepUs = atoi(value().c_str());
    else if (a == "--timeout") o.timeout = atof(value().c_str());
    else if (a == "--csv") o.csvFile = value();
    else if (a == "--json") o.jsonFile = value();
    else if (a == "--progress") o.progress = true;
    else if (a == "-v" || a == "--verbose") gVerbose = true;
    else throw Error("unknown option " + a + " (see --help)");
  }
  if (!latList) o.p.latSizes = geometric(minLat, maxLat, latFactor);
  if (!bwList) o.p.bwSizes = geometric(minBw, maxBw, bwFactor);
  if (o.mode == Mode::Client) {
    std::string error, spec = o.host;
    if (!mesh::parseHostPort(spec, portSet ? o.port : kDefaultPort, &o.host, &o.port, &error)) {
      throw Error("--client " + error);
    }
  }
  if (o.port < (o.mode == Mode::Server ? 0 : 1) || o.port > 65535) {
    throw Error("--port must be 1..65535 (0 for --server: any free port, printed at start)");
  }
  if (o.mode == Mode::Files) {
    if (o.rank != 0 && o.rank != 1) throw Error("need --server, --client HOST, or --rank 0|1 (or VMESH_RANK)");
    if (o.rendezvous.empty()) throw Error("need --rendezvous DIR (or VMESH_SHARED) with --rank");
  } else {
    o.rank = o.mode == Mode::Client ? 0 : 1;
  }
  validate(o.p);
  return o;
}

// --- how the ranks meet -------------------------------------------------------------------

// One message each way per named step, in the same order on both ranks.
class Rendezvous {
 public:
  virtual ~Rendezvous() = default;
  virtual std::string exchange(const std::string& step, const std::string& mine) = 0;
  virtual std::string describe() const = 0;
};

// The lab: files in a directory both ranks see.
class FileRendezvous : public Rendezvous {
 public:
  FileRendezvous(const Options& o, Clock::time_point deadline)
      : base_(o.rendezvous + "/nccl-mesh-perf." + o.tag + "."), rank_(o.rank), dir_(o.rendezvous), deadline_(deadline) {}
  std::string exchange(const std::string& step, const std::string& mine) override {
    std::string prefix = base_ + (step == "hello" ? "" : step + ".");
    publish(prefix + std::to_string(rank_), mine);
    return fetch(prefix + std::to_string(1 - rank_));
  }
  std::string describe() const override { return "files in " + dir_; }

 private:
  void publish(const std::string& path, const std::string& bytes) {
    std::string tmp = strf("%s.tmp%d", path.c_str(), static_cast<int>(getpid()));
    int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) throw Error("cannot create " + tmp + ": " + strerror(errno));
    bool ok = write(fd, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size());
    ok = close(fd) == 0 && ok;
    if (!ok || rename(tmp.c_str(), path.c_str()) != 0) throw Error("cannot write " + path + ": " + strerror(errno));
  }
  std::string fetch(const std::string& path) {
    for (;;) {
      int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd >= 0) {
        std::string out;
        char buf[4096];
        ssize_t n;
        while ((n = read(fd, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
        close(fd);
        return out;
      }
      if (Clock::now() > deadline_) throw Error("timed out waiting for the peer's " + path);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  std::string base_;
  int rank_;
  std::string dir_;
  Clock::time_point deadline_;
};

// Two hosts: one TCP connection over the management network, open for the whole run.
class TcpRendezvous : public Rendezvous {
 public:
  TcpRendezvous(const Options& o, Clock::time_point deadline) : deadline_(deadline) {
    std::string error;
    if (o.mode == Mode::Client) {
      if (!mesh::ctrlConnect(o.host, o.port, deadline, &sock_, &error)) throw Error("--client: " + error);
      peer_ = o.host + ":" + std::to_string(o.port);
      return;
    }
    mesh::CtrlListener listener;
    if (!listener.listen(o.bind, o.port, &error)) throw Error("--server: " + error);
    fprintf(stderr, "nccl-mesh-perf: server listening on %s port %d; waiting for a client\n",
            o.bind.empty() ? "every interface" : o.bind.c_str(), listener.port());
    if (!listener.accept(&sock_, &peer_, deadline, &error)) throw Error("--server: " + error);
    fprintf(stderr, "nccl-mesh-perf: client %s connected\n", peer_.c_str());
  }
  std::string exchange(const std::string& step, const std::string& mine) override {
    std::string error, theirs;
    if (!sock_.send(step + "\n" + mine, deadline_, &error) || !sock_.recv(&theirs, deadline_, &error)) {
      throw Error("control connection to " + peer_ + " (step " + step + "): " + error);
    }
    if (theirs.compare(0, step.size() + 1, step + "\n") != 0) {
      throw Error("the peer at " + peer_ + " is out of step (expected '" + step +
                  "'); is it nccl-mesh-perf of the same version?");
    }
    return theirs.substr(step.size() + 1);
  }
  std::string describe() const override { return "TCP " + peer_; }

 private:
  mesh::CtrlSocket sock_;
  std::string peer_;
  Clock::time_point deadline_;
};

// --- progress ------------------------------------------------------------------------------

// One line on stderr, rewritten in place on a terminal; with --progress and no terminal,
// a line at most every 2 s. Never on stdout, which carries the results.
class Progress {
 public:
  explicit Progress(bool forced) : tty_(isatty(STDERR_FILENO) == 1), on_(forced || tty_) {}
  void show(const std::string& what) {
    if (!on_) return;
    Clock::time_point now = Clock::now();
    if (!tty_ && shown_ && now - last_ < std::chrono::seconds(2)) return;
    last_ = now;
    shown_ = true;
    fprintf(stderr, tty_ ? "\r\033[Knccl-mesh-perf: %s" : "nccl-mesh-perf: %s\n", what.c_str());
  }
  void done() {
    if (on_ && tty_ && shown_) fprintf(stderr, "\r\033[K");
  }

 private:
  bool tty_;
  bool on_;
  bool shown_ = false;
  Clock::time_point last_;
};

// --- the benchmark ----------------------------------------------------------------------

struct Buffer {
  void* p = nullptr;
  size_t size = 0;
  // Whole pages of the system's size, as NCCL's own buffers are: the registration (and
  // rdma-core's fork protection) then covers nothing but this buffer.
  explicit Buffer(size_t n) {
    p = mesh::allocPages(n, mesh::systemPageSize(), &size);
    if (p == nullptr) throw Error(strf("cannot allocate %zu bytes", n));
  }
  ~Buffer() { free(p); }
  char* at(size_t off) const { return static_cast<char*>(p) + off; }
};

// Seeds of the verified transfers: each size, direction and window slot its own pattern, so
// data landing in the wrong buffer or left over from a previous transfer is caught.
uint64_t pingSeed(size_t size) { return (uint64_t(size) << 8) | 1; }
uint64_t pongSeed(size_t size) { return (uint64_t(size) << 8) | 2; }
uint64_t slotSeed(size_t size, size_t slot) { return (uint64_t(size) << 8) | (0x40 + slot); }

class Perf {
 public:
  Perf(const Options& o, const ncclNet_v8_t* net, Rendezvous* rv, Clock::time_point deadline)
      : o_(o), net_(net), rv_(rv), peer_(1 - o.rank), deadline_(deadline), progress_(o.progress) {}

  void connect();
  void latency();
  void bandwidth();
  // Sends this rank's check counts to the other; rank 0 keeps rank 1's in the report.
  void exchangeChecks();
  void close();
  mesh::PerfReport& report() { return report_; }
  const mesh::PerfReport& report() const { return report_; }
  const mesh::PerfParams& params() const { return p_; }
  long long myWrong() const;

 private:
  void* postSend(void* data, int size, int tag);
  void* postRecv(void* data, int size, int tag);
  int wait(void* req, const char* what, size_t size);
  bool poll(void* req, const char* what, size_t size, int* got);
  void checkDeadline(const char* what, size_t size) const;
  void timedPingPong(size_t size);
  long long verifiedPingPong(size_t size);
  void timedStream(size_t size, int count, bool measured, size_t slots);
  long long verifiedStream(size_t size, size_t slots);

  const Options& o_;
  mesh::PerfParams p_;  // the client's in TCP mode
  const ncclNet_v8_t* net_;
  Rendezvous* rv_;
  int peer_;
  Clock::time_point deadline_;
  Progress progress_;
  int idleSleepUs_ = 0;  // what poll() does when it found nothing (see --bw-idle-sleep-us)
  void* listenComm_ = nullptr;
  void* sendComm_ = nullptr;
  void* recvComm_ = nullptr;
  std::unique_ptr<Buffer> sendBuf_, recvBuf_;
  void* sendMh_ = nullptr;
  void* recvMh_ = nullptr;
  mesh::CheckCounts mine_;  // bytes wrong in what this rank received
  mesh::PerfReport report_;
};

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

void writeFile(const std::string& path, const std::string& text) {
  FILE* f = fopen(path.c_str(), "w");
  if (f == nullptr || fputs(text.c_str(), f) < 0 || fclose(f) != 0) {
    throw Error("cannot write " + path + ": " + strerror(errno));
  }
}

void printResults(const Options& o, const Perf& perf) {
  const mesh::PerfReport& r = perf.report();
  for (const mesh::LatRow& l : r.lat) {
    printf("PERF lat size=%zu usec=%.2f avg=%.2f min=%.2f iters=%d wrong=%lld\n", l.size, l.typUs, l.avgUs, l.minUs,
           l.iters, l.wrong);
  }
  for (const mesh::BwRow& b : r.bw) {
    printf("PERF bw size=%zu MBps=%.2f GBps=%.4f iters=%d window=%d wrong=%lld\n", b.size, b.mibPerSec(),
           b.algbwGBps(), b.iters, r.window, b.wrong);
  }
  printf("\n%s", mesh::formatTable(r).c_str());
  if (!o.csvFile.empty()) writeFile(o.csvFile, mesh::formatCsv(r));
  if (!o.jsonFile.empty()) writeFile(o.jsonFile, mesh::formatJson(r));
  fflush(stdout);
}

int run(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  Options o;
  try {
    o = parseArgs(argc, argv);
  } catch (const Error& e) {
    fprintf(stderr, "nccl-mesh-perf: %s\n", e.what());
    usage(stderr);
    return kExitUsage;
  }
  // A hung peer or plugin must not hang the run.
  double limit = o.timeout;
  std::thread([limit] {
    std::this_thread::sleep_for(std::chrono::duration<double>(limit + 15));
    fprintf(stderr, "nccl-mesh-perf: FAIL: still running %.0f s after --timeout; exiting\n", limit + 15);
    _exit(kExitHung);
  }).detach();
  try {
    Clock::time_point deadline =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.timeout));
    std::unique_ptr<Rendezvous> rv;
    if (o.mode == Mode::Files) rv.reset(new FileRendezvous(o, deadline));
    else rv.reset(new TcpRendezvous(o, deadline));
    void* lib = dlopen(o.plugin.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) throw Error(strf("dlopen(%s): %s", o.plugin.c_str(), dlerror()));
    auto* net = static_cast<const ncclNet_v8_t*>(dlsym(lib, "ncclNetPlugin_v8"));
    if (net == nullptr) throw Error(o.plugin + " has no ncclNetPlugin_v8");
    check(net->init(perfLogger), "init");
    int ndev = 0;
    check(net->devices(&ndev), "devices");
    if (o.dev < 0 || o.dev >= ndev) throw Error(strf("--dev %d, but the plugin reports %d device(s)", o.dev, ndev));
    ncclNetProperties_v8_t props;
    memset(&props, 0, sizeof(props));
    check(net->getProperties(o.dev, &props), "getProperties");
    Perf perf(o, net, rv.get(), deadline);
    perf.connect();
    if (perf.params().lat) perf.latency();
    if (perf.params().bw) perf.bandwidth();
    perf.exchangeChecks();
    perf.close();
    long long wrong = perf.myWrong();
    if (o.rank == 0) {
      mesh::PerfReport& r = perf.report();
      r.version = mesh::versionText();
      r.plugin = net->name;
      r.device = strf("%d: %s, %d Mbps", o.dev, props.name ? props.name : "?", props.speed);
      printResults(o, perf);
      wrong = std::max(wrong, r.totalWrong());
    } else {
      printf("nccl-mesh-perf: rank 1 served rank 0 (%s); data check: %s\n", rv->describe().c_str(),
             perf.params().check ? strf("%lld byte(s) wrong in what rank 1 received", wrong).c_str() : "off");
    }
    dlclose(lib);
    if (wrong > 0) {
      fprintf(stderr, "nccl-mesh-perf: FAIL: the data check found %lld wrong byte(s)\n", wrong);
      return kExitWrongData;
    }
    return 0;
  } catch (const std::exception& e) {
    fprintf(stderr, "nccl-mesh-perf: FAIL (rank %d): %s\n", o.rank, e.what());
    fflush(stderr);
    _exit(kExitFail);  // no teardown through a plugin in an unknown state
  }
}

}  // namespace

int main(int argc, char** argv) { return run(argc, argv); }
