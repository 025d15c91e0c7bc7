// nccl-mesh-perf: point-to-point latency and bandwidth of a ncclNet plugin between two
// ranks, measured through the plugin's ABI exactly as NCCL drives it: dlopen of the .so
// (--plugin), dlsym("ncclNetPlugin_v8"), non-blocking connect/accept, registered host
// buffers, isend/irecv/test. It calls nothing of mesh_core even though the build links it.
//
//   rank 0 <-> rank 1: ping-pong latency (half the round trip; typical = median, as
//   perftest's t_typical), then rank 0 -> rank 1 bandwidth with a window of outstanding
//   sends (from the first accepted isend to the last send completion, as perftest).
//   MB = 2^20 bytes, as perftest reports MB/sec.
//
// Rendezvous: both ranks write their listen handle to files in --rendezvous DIR (default
// $VMESH_SHARED), each written under a temporary name and rename()d.
// Output (rank 0): a table, plus one machine-readable line per measurement:
//   PERF lat size=8 usec=<typical> avg=<> min=<> iters=<n>
//   PERF bw size=65536 MBps=<> iters=<n> window=<w>
#include <dlfcn.h>
#include <sched.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <deque>
#include <cerrno>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "mesh/version.h"
#include "net_v8.h"

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::string strf(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string strf(const char* fmt, ...) {
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  return buf;
}

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// --- the plugin's log ------------------------------------------------------------------

std::mutex gLogMutex;
std::string gLastWarn;
bool gVerbose = false;

extern "C" void perfLogger(ncclDebugLogLevel level, unsigned long, const char*, int,
                           const char* fmt, ...) {
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

struct Options {
  int rank = -1;
  std::string rendezvous;
  std::string plugin = "libnccl-net-mesh.so";
  std::string tag = "perf";
  int dev = 0;
  std::vector<size_t> latSizes, bwSizes;
  int latIters = 30, latWarmup = 5;
  int bwIters = 20, bwWarmup = 2, bwWindow = 8;
  int bwIdleSleepUs = 0;  // bandwidth phase, after an empty poll: 0 = sched_yield(), N = sleep N us
  size_t bwBytes = 8u << 20;  // per size: iterations shrink so size * iters <= this
  double timeout = 300;
  bool lat = true, bw = true;
};

void usage(FILE* out) {
  fprintf(out,
          "usage: nccl-mesh-perf [options]   (run once on each of two ranks)\n"
          "  --rank R            0 or 1 (default $VMESH_RANK)\n"
          "  --rendezvous DIR    directory both ranks can write (default $VMESH_SHARED)\n"
          "  --tag NAME          file name prefix in DIR (perf); use a new one for each run\n"
          "                      in a reused directory (vmesh gives every run a fresh one)\n"
          "  --plugin PATH       plugin library (libnccl-net-mesh.so via LD_LIBRARY_PATH)\n"
          "  --dev D             plugin device (0)\n"
          "  --min-lat B --max-lat B --lat-factor F   latency sizes (8 .. 64K, x4; max always run)\n"
          "  --lat-sizes B,B,... latency sizes, explicitly\n"
          "  --iters N | --lat-iters N   ping-pongs per size (30); --lat-warmup N (5)\n"
          "  --min-bw B --max-bw B --bw-factor F      bandwidth sizes (4K .. 64M, x4)\n"
          "  --bw-sizes B,B,...  bandwidth sizes, explicitly\n"
          "  --bw-iters N (20) --bw-warmup N (2, within a quarter of --bw-bytes)\n"
          "  --bw-window W       outstanding sends (8, at most 32)\n"
          "  --bw-bytes B        cap on bytes per bandwidth size: iters = min(bw-iters,\n"
          "                      max(1, B / size)) (8M; raise it on real hardware)\n"
          "  --no-lat | --no-bw  skip a part\n"
          "  --timeout S         give up after S seconds (300)\n"
          "  --bw-idle-sleep-us N  in the bandwidth phase, after a poll that found nothing,\n"
          "                      sleep N us instead of sched_yield() (0). In emulated labs a\n"
          "                      spinning poller takes the host CPU the emulated NIC needs\n"
          "                      (perftest's ib_write_bw server does not poll at all)\n"
          "  -v | --verbose      echo the plugin's INFO lines\n"
          "Sizes take K/M/G suffixes (binary). MB/s means 2^20 bytes per second, as perftest.\n");
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

Options parseArgs(int argc, char** argv) {
  Options o;
  const char* r = getenv("VMESH_RANK");
  if (r && *r) o.rank = atoi(r);
  const char* d = getenv("VMESH_SHARED");
  if (d) o.rendezvous = d;
  size_t minLat = 8, maxLat = 64 << 10, latFactor = 4, minBw = 4 << 10, maxBw = 64 << 20, bwFactor = 4;
  bool latList = false, bwList = false;
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
    } else if (a == "--rank") o.rank = atoi(value().c_str());
    else if (a == "--rendezvous") o.rendezvous = value();
    else if (a == "--tag") o.tag = value();
    else if (a == "--plugin") o.plugin = value();
    else if (a == "--dev") o.dev = atoi(value().c_str());
    else if (a == "--min-lat") minLat = parseSize(value());
    else if (a == "--max-lat") maxLat = parseSize(value());
    else if (a == "--lat-factor") latFactor = parseSize(value());
    else if (a == "--lat-sizes") o.latSizes = parseList(value()), latList = true;
    else if (a == "--iters" || a == "--lat-iters") o.latIters = atoi(value().c_str());
    else if (a == "--lat-warmup" || a == "--warmup") o.latWarmup = atoi(value().c_str());
    else if (a == "--min-bw") minBw = parseSize(value());
    else if (a == "--max-bw") maxBw = parseSize(value());
    else if (a == "--bw-factor") bwFactor = parseSize(value());
    else if (a == "--bw-sizes") o.bwSizes = parseList(value()), bwList = true;
    else if (a == "--bw-iters") o.bwIters = atoi(value().c_str());
    else if (a == "--bw-warmup") o.bwWarmup = atoi(value().c_str());
    else if (a == "--bw-window") o.bwWindow = atoi(value().c_str());
    else if (a == "--bw-bytes") o.bwBytes = parseSize(value());
    else if (a == "--no-lat") o.lat = false;
    else if (a == "--no-bw") o.bw = false;
    else if (a == "--bw-idle-sleep-us") o.bwIdleSleepUs = atoi(value().c_str());
    else if (a == "--timeout") o.timeout = atof(value().c_str());
    else if (a == "-v" || a == "--verbose") gVerbose = true;
    else throw Error("unknown option " + a + " (see --help)");
  }
  if (!latList) o.latSizes = geometric(minLat, maxLat, latFactor);
  if (!bwList) o.bwSizes = geometric(minBw, maxBw, bwFactor);
  if (o.rank != 0 && o.rank != 1) throw Error("need --rank 0 or 1 (or VMESH_RANK)");
  if (o.rendezvous.empty()) throw Error("need --rendezvous DIR (or VMESH_SHARED)");
  if (o.latIters < 1 || o.latWarmup < 0 || o.bwIters < 1 || o.bwWarmup < 0) throw Error("iterations must be >= 1, warmups >= 0");
  if (o.bwWindow < 1 || o.bwWindow > NCCL_NET_MAX_REQUESTS) throw Error("--bw-window must be 1..32");
  for (size_t s : o.latSizes) if (s > (1u << 30)) throw Error("sizes must be <= 1 GiB (v8 isend takes an int)");
  for (size_t s : o.bwSizes) if (s == 0 || s > (1u << 30)) throw Error("bandwidth sizes must be 1 B .. 1 GiB");
  return o;
}

// Both ranks must run the same sequence of messages.
std::string paramsOf(const Options& o) {
  std::string s = strf("v1 lat=%d bw=%d li=%d lw=%d bi=%d bw=%d win=%d bb=%zu", o.lat, o.bw, o.latIters,
                       o.latWarmup, o.bwIters, o.bwWarmup, o.bwWindow, o.bwBytes);
  for (size_t x : o.latSizes) s += strf(" l%zu", x);
  for (size_t x : o.bwSizes) s += strf(" b%zu", x);
  return s;
}

// --- rendezvous files -------------------------------------------------------------------

void publish(const std::string& path, const std::string& bytes) {
  std::string tmp = strf("%s.tmp%d", path.c_str(), static_cast<int>(getpid()));
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error("cannot create " + tmp + ": " + strerror(errno));
  bool ok = write(fd, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size());
  ok = close(fd) == 0 && ok;
  if (!ok || rename(tmp.c_str(), path.c_str()) != 0) throw Error("cannot write " + path + ": " + strerror(errno));
}

std::string fetch(const std::string& path, Clock::time_point deadline) {
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
    if (Clock::now() > deadline) throw Error("timed out waiting for the peer's " + path);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

// --- the benchmark ----------------------------------------------------------------------

struct Buffer {
  void* p = nullptr;
  size_t size = 0;
  explicit Buffer(size_t n) : size(std::max<size_t>(n, 1)) {
    if (posix_memalign(&p, 4096, size) != 0) throw Error(strf("cannot allocate %zu bytes", n));
    memset(p, 0, size);
  }
  ~Buffer() { free(p); }
  char* at(size_t off) const { return static_cast<char*>(p) + off; }
};

class Perf {
 public:
  Perf(const Options& o, const ncclNet_v8_t* net) : o_(o), net_(net), peer_(1 - o.rank) {}

  void connect();
  void latency();
  void bandwidth();
  void close();
  void printTable() const;

 private:
  void* postSend(void* data, int size, int tag);
  void* postRecv(void* data, int size, int tag);
  // Polls test() until done; returns the reported size.
  int wait(void* req, const char* what, size_t size);
  bool poll(void* req, const char* what, size_t size, int* got);
  void checkDeadline(const char* what, size_t size) const;

  const Options& o_;
  const ncclNet_v8_t* net_;
  int peer_;
  Clock::time_point deadline_;
  int idleSleepUs_ = 0;  // what poll() does when it found nothing (see --bw-idle-sleep-us)
  void* listenComm_ = nullptr;
  void* sendComm_ = nullptr;
  void* recvComm_ = nullptr;
  std::unique_ptr<Buffer> sendBuf_, recvBuf_;
  void* sendMh_ = nullptr;
  void* recvMh_ = nullptr;
  struct LatRow { double typ, avg, min; int iters; };
  struct BwRow { double mbps; int iters; };
  std::map<size_t, LatRow> lat_;
  std::map<size_t, BwRow> bw_;

 public:
  void setDeadline(Clock::time_point d) { deadline_ = d; }
};

void Perf::checkDeadline(const char* what, size_t size) const {
  if (Clock::now() > deadline_) {
    throw Error(strf("timed out (--timeout %.0f s) in %s, size %zu, rank %d <-> rank %d", o_.timeout, what,
                     size, o_.rank, peer_));
  }
}

void Perf::connect() {
  alignas(16) char handle[NCCL_NET_HANDLE_MAXSIZE] = {};
  check(net_->listen(o_.dev, handle, &listenComm_), strf("listen(dev %d)", o_.dev));
  std::string base = o_.rendezvous + "/nccl-mesh-perf." + o_.tag + ".";
  publish(base + std::to_string(o_.rank), std::string(handle, sizeof(handle)) + paramsOf(o_));
  std::string theirs = fetch(base + std::to_string(peer_), deadline_);
  if (theirs.size() < sizeof(handle)) throw Error("the peer's rendezvous file is truncated");
  if (theirs.substr(sizeof(handle)) != paramsOf(o_)) {
    throw Error("the two ranks were started with different options:\n  mine:   " + paramsOf(o_) +
                "\n  theirs: " + theirs.substr(sizeof(handle)));
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
  size_t maxLat = o_.lat && !o_.latSizes.empty() ? *std::max_element(o_.latSizes.begin(), o_.latSizes.end()) : 0;
  size_t maxBw = o_.bw && !o_.bwSizes.empty() ? *std::max_element(o_.bwSizes.begin(), o_.bwSizes.end()) : 0;
  // Distinct slots per outstanding message when that fits in 64 MiB.
  size_t bwArena = std::max(maxBw, std::min(maxBw * static_cast<size_t>(o_.bwWindow), size_t(64) << 20));
  size_t n = std::max({maxLat, bwArena, size_t(8)});
  sendBuf_.reset(new Buffer(n));
  recvBuf_.reset(new Buffer(n));
  memset(sendBuf_->p, 0x5a, n);
  check(net_->regMr(sendComm_, sendBuf_->p, n, NCCL_PTR_HOST, &sendMh_), "regMr(send buffer)");
  check(net_->regMr(recvComm_, recvBuf_->p, n, NCCL_PTR_HOST, &recvMh_), "regMr(recv buffer)");
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

// Like NCCL's proxy thread, yield the CPU after a poll that found nothing: in a 1-vCPU lab
// guest a tight spin would take the CPU from Soft-RoCE's own packet processing.
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

void Perf::latency() {
  for (size_t size : o_.latSizes) {
    int n = static_cast<int>(size);
    std::vector<double> samples;
    int total = o_.latWarmup + o_.latIters;
    // Receives are posted two messages ahead, as NCCL keeps its pipeline steps posted, so
    // each FIFO slot travels during the previous round trip, not in front of the data.
    std::deque<void*> ahead;
    auto postAhead = [&](int index) {
      if (index < total) ahead.push_back(postRecv(recvBuf_->p, n, 1));
    };
    postAhead(0);
    postAhead(1);
    if (o_.rank == 0) {
      for (int i = 0; i < total; ++i) {
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
        double us = since(t0) * 1e6 / 2;
        if (got != n) throw Error(strf("pong of %zu bytes reported %d bytes", size, got));
        if (i >= o_.latWarmup) samples.push_back(us);
      }
      std::sort(samples.begin(), samples.end());
      double sum = 0;
      for (double s : samples) sum += s;
      LatRow row{samples[samples.size() / 2], sum / samples.size(), samples.front(), o_.latIters};
      lat_[size] = row;
      printf("PERF lat size=%zu usec=%.2f avg=%.2f min=%.2f iters=%d\n", size, row.typ, row.avg, row.min, row.iters);
    } else {
      for (int i = 0; i < total; ++i) {
        void* rr = ahead.front();
        ahead.pop_front();
        int got = wait(rr, "ping irecv", size);
        if (got != n) throw Error(strf("ping of %zu bytes reported %d bytes", size, got));
        void* sr = postSend(sendBuf_->p, n, 1);
        postAhead(i + 2);
        wait(sr, "pong isend", size);
      }
    }
    fflush(stdout);
  }
}

void Perf::bandwidth() {
  idleSleepUs_ = o_.bwIdleSleepUs;
  for (size_t size : o_.bwSizes) {
    int n = static_cast<int>(size);
    int iters = static_cast<int>(std::min<size_t>(static_cast<size_t>(o_.bwIters), std::max<size_t>(1, o_.bwBytes / size)));
    // Warmup costs at most a quarter of the byte budget: big sizes are their own warmup.
    int warm = static_cast<int>(std::min<size_t>(static_cast<size_t>(std::min(o_.bwWarmup, iters)), o_.bwBytes / 4 / size));
    size_t slots = std::max<size_t>(1, std::min<size_t>(static_cast<size_t>(o_.bwWindow), sendBuf_->size / size));
    for (int pass = 0; pass < 2; ++pass) {  // warmup, then the measured pass
      int count = pass == 0 ? warm : iters;
      if (count == 0) continue;
      std::vector<void*> reqs;  // outstanding, in posting order
      int posted = 0, completed = 0;
      unsigned spins = 0;
      Clock::time_point t0;
      while (completed < count) {
        while (posted < count && static_cast<int>(reqs.size()) < o_.bwWindow) {
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
        }
      }
      if (pass == 1 && o_.rank == 0) {
        double mbps = static_cast<double>(size) * iters / since(t0) / 1048576.0;
        bw_[size] = BwRow{mbps, iters};
        printf("PERF bw size=%zu MBps=%.2f iters=%d window=%d\n", size, mbps, iters, o_.bwWindow);
        fflush(stdout);
      }
    }
  }
}

void Perf::close() {
  // The peer must be done with its side before the comms go away.
  std::string base = o_.rendezvous + "/nccl-mesh-perf." + o_.tag + ".done.";
  publish(base + std::to_string(o_.rank), "");
  fetch(base + std::to_string(peer_), deadline_);
  check(net_->deregMr(sendComm_, sendMh_), "deregMr(send buffer)");
  check(net_->deregMr(recvComm_, recvMh_), "deregMr(recv buffer)");
  check(net_->closeSend(sendComm_), "closeSend");
  check(net_->closeRecv(recvComm_), "closeRecv");
  check(net_->closeListen(listenComm_), "closeListen");
}

void Perf::printTable() const {
  printf("\n# nccl-mesh-perf: rank 0 <-> rank 1 through the plugin; latency = half round trip,\n"
         "# typical = median; bandwidth rank 0 -> rank 1, window %d; MB = 2^20 bytes\n", o_.bwWindow);
  printf("%12s %14s %12s %12s %8s %12s %8s\n", "size(B)", "lat_typ(us)", "lat_avg(us)", "lat_min(us)",
         "iters", "bw(MB/s)", "iters");
  std::vector<size_t> sizes;
  for (auto& kv : lat_) sizes.push_back(kv.first);
  for (auto& kv : bw_) sizes.push_back(kv.first);
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  for (size_t s : sizes) {
    auto l = lat_.find(s);
    auto b = bw_.find(s);
    std::string latCols = l == lat_.end() ? strf("%14s %12s %12s %8s", "-", "-", "-", "-")
                                          : strf("%14.2f %12.2f %12.2f %8d", l->second.typ, l->second.avg,
                                                 l->second.min, l->second.iters);
    std::string bwCols = b == bw_.end() ? strf("%12s %8s", "-", "-") : strf("%12.2f %8d", b->second.mbps, b->second.iters);
    printf("%12zu %s %s\n", s, latCols.c_str(), bwCols.c_str());
  }
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
    return 2;
  }
  // A hung peer or plugin must not hang the run.
  double limit = o.timeout;
  std::thread([limit] {
    std::this_thread::sleep_for(std::chrono::duration<double>(limit + 15));
    fprintf(stderr, "nccl-mesh-perf: FAIL: still running %.0f s after --timeout; exiting\n", limit + 15);
    _exit(3);
  }).detach();
  try {
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
    if (o.rank == 0) {
      printf("# plugin %s, dev %d (%s, %d Mbps), rank %d <-> rank 1\n", net->name, o.dev,
             props.name ? props.name : "?", props.speed, o.rank);
    }
    Perf perf(o, net);
    perf.setDeadline(Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.timeout)));
    perf.connect();
    if (o.lat) perf.latency();
    if (o.bw) perf.bandwidth();
    perf.close();
    if (o.rank == 0) perf.printTable();
    else printf("nccl-mesh-perf: rank 1 served rank 0\n");
    dlclose(lib);
    return 0;
  } catch (const std::exception& e) {
    fprintf(stderr, "nccl-mesh-perf: FAIL (rank %d): %s\n", o.rank, e.what());
    fflush(stderr);
    _exit(1);  // no teardown through a plugin in an unknown state
  }
}

}  // namespace

int main(int argc, char** argv) { return run(argc, argv); }
