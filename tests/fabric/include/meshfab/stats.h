// SPDX-License-Identifier: Apache-2.0
// The fabric's equivalent of `rdma res show` and rxe's sysfs hw_counters: every process
// that opens a fabric device maps one file <fabric dir>/stats/<pid>.<nonce> holding, per
// device, its object counts (pd, cq, qp, mr, ctx) and port counters named as rxe names
// them. The library updates it with relaxed atomics (no syscalls); readers (tests/e2e's
// probes, `meshfab-stat`) sum the files of live processes in their own network namespace,
// which is what `rdma res show` and /sys/class/infiniband show on a node.
// Header-only so that readers need not link the library.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

namespace meshfab {

constexpr uint32_t kStatsMagic = 0x4d465354;  // "MFST"
constexpr uint32_t kStatsVersion = 4;  // 2: sent_bytes, rcvd_bytes, paced_waits; 3: executed_reads;
                                       // 4: max_passed_over
constexpr int kStatsMaxDevices = 32;

enum StatsRes { kResPd, kResCq, kResQp, kResMr, kResCtx, kResCount };
inline const char* resName(int r) {
  static const char* const kNames[kResCount] = {"pd", "cq", "qp", "mr", "ctx"};
  return kNames[r];
}

// Port counters; the names are rxe's hw_counters where rxe has the same counter.
enum StatsCounter {
  kSentPkts,            // packets sent (one per path-MTU of payload, as on the wire)
  kRcvdPkts,            // packets received
  kDuplicateRequest,    // responder: a request it had already executed (a retransmission)
  kOutOfSeqRequest,     // responder: a request ahead of the expected PSN
  kCompleterRetryErr,   // requester: retransmissions after an ACK timeout or sequence NAK
  kRetryExceededErr,    // requester: WRs failed with transport retry counter exceeded
  kRcvdRnrErr,          // requester: RNR NAKs received
  kSendRnrNak,          // responder: RNR NAKs sent
  kRcvdSeqErr,          // requester: sequence NAKs received
  kUnreachableDrops,    // packets not sent: port down or destination not cabled to it
  kSentBytes,           // payload bytes sent (WRITE/SEND data, READ responses)
  kRcvdBytes,           // payload bytes received and placed
  kPacedWaits,          // times a packet waited for its port's or wire's rate cap
  kExecutedReads,       // responder: RDMA READ requests executed (the fabric's own; rxe has none)
  // requester: the most packets other QPs of this port sent while one QP had a packet ready
  // and waited for its turn (a maximum, not a sum; the fabric's own). Round robin keeps it
  // below the number of QPs sending on the port at once; tens or more mean one QP took the
  // port's turns while another waited.
  kMaxPassedOver,
  kCounterCount
};
inline const char* counterName(int c) {
  static const char* const kNames[kCounterCount] = {
      "sent_pkts",          "rcvd_pkts",         "duplicate_request", "out_of_seq_request",
      "completer_retry_err", "retry_exceeded_err", "rcvd_rnr_err",      "send_rnr_nak",
      "rcvd_seq_err",       "unreachable_drops", "sent_bytes",        "rcvd_bytes",
      "paced_waits",        "executed_reads",    "max_passed_over"};
  return kNames[c];
}

struct DevStats {
  char name[32];    // fab_p1
  char netdev[16];  // p1
  std::atomic<int64_t> res[kResCount];
  std::atomic<uint64_t> counters[kCounterCount];
};

struct StatsFile {
  uint32_t magic;
  uint32_t version;
  int32_t pid;
  uint32_t ndev;     // entries of dev[] in use (each written before ndev grows)
  uint64_t netns;    // inode of the owner's /proc/self/ns/net
  uint64_t nonce;
  // File descriptors the fabric's transport holds in the owner (its endpoint, epoll,
  // doorbell, and per connection a socket and the peer's doorbell): tests that count a
  // process's fds to find leaks subtract these, which come and go with peer processes.
  std::atomic<int64_t> transportFds;
  DevStats dev[kStatsMaxDevices];
};

// The inode of this thread's network namespace, or 0.
inline uint64_t currentNetns() {
  struct stat st;
  return stat("/proc/thread-self/ns/net", &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
}

// Calls fn(const StatsFile&) for every stats file under <dir>/stats whose owner is alive
// and, when netns != 0, lives in that network namespace. Returns the number visited.
template <typename Fn>
int forEachStats(const std::string& dir, uint64_t netns, Fn fn) {
  std::string sdir = dir + "/stats";
  DIR* d = opendir(sdir.c_str());
  if (d == nullptr) return 0;
  int n = 0;
  while (struct dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::string path = sdir + "/" + e->d_name;
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size < static_cast<off_t>(sizeof(StatsFile))) {
      close(fd);  // still being created
      continue;
    }
    void* m = mmap(nullptr, sizeof(StatsFile), PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) continue;
    const auto* f = static_cast<const StatsFile*>(m);
    bool alive = f->magic == kStatsMagic && f->version == kStatsVersion &&
                 (kill(f->pid, 0) == 0 || errno == EPERM);
    if (alive && (netns == 0 || f->netns == netns)) {
      fn(*f);
      ++n;
    }
    munmap(m, sizeof(StatsFile));
  }
  closedir(d);
  return n;
}

}  // namespace meshfab
