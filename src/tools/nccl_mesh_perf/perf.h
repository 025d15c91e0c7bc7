// SPDX-License-Identifier: Apache-2.0
// nccl-mesh-perf's parts, one file each: the plugin's log, the results and main
// (perf_main.cpp), the command line (perf_options.cpp), how the two ranks meet
// (perf_rendezvous.cpp) and the benchmark itself (perf_bench.cpp). Private to the tool.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>

#include "mesh/platform/page.h"
#include "mesh/platform/text.h"
#include "mesh/tools/perf_report.h"
#include "net_v8.h"

namespace perf {

using Clock = std::chrono::steady_clock;
using mesh::strf;
constexpr int kDefaultPort = 18600;
constexpr int kExitFail = 1, kExitUsage = 2, kExitHung = 3, kExitWrongData = 4;

inline double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// --- the plugin's log (perf_main.cpp) -----------------------------------------------------

extern std::mutex gLogMutex;
extern std::string gLastWarn;
extern bool gVerbose;

// Throws Error naming the call, its result and the plugin's last WARN unless r is ncclSuccess.
void check(ncclResult_t r, const std::string& what);

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

void usage(FILE* out);
Options parseArgs(int argc, char** argv);
// Throws Error when the parameters are out of range (the client's, too, on the server).
void validate(const mesh::PerfParams& p);

// --- how the ranks meet -------------------------------------------------------------------

// One message each way per named step, in the same order on both ranks.
class Rendezvous {
 public:
  virtual ~Rendezvous() = default;
  virtual std::string exchange(const std::string& step, const std::string& mine) = 0;
  virtual std::string describe() const = 0;
};

// FileRendezvous (--rank, --rendezvous) or TcpRendezvous (--server, --client), by o.mode.
std::unique_ptr<Rendezvous> makeRendezvous(const Options& o, Clock::time_point deadline);

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

}  // namespace perf
