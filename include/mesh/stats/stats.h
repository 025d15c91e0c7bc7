// SPDX-License-Identifier: Apache-2.0
// Live counters (issue 34): what every process that loaded the plugin has moved, published
// for a reader on the same node (nccl-mesh-info --watch/--json/--prometheus).
//
// Publication: one file per loaded plugin, NAME = "<host>.<pid>.<load>.<pidns>.stats", in the stats
// directory (NCCL_MESH_STATS_DIR, default /dev/shm/nccl-mesh-<uid>; created 0700, a file
// 0600: readable by the same user only, and root). The file is created whole under a
// temporary name and renamed into place, so a reader never sees it short; it is mapped
// shared and written in place, and removed when the plugin unloads. A process killed by a
// signal leaves it behind: readers recognise it (its pid is gone, or is another process now)
// and remove it when they may, or skip it.
//
// Layout (StatsFile): a header, then fixed arrays of link slots (one per local port ->
// peer address pair a comm used) and flow slots (one per peer and kind: direct, relayed
// through a relay, forwarded by this node's relay). A slot is claimed once and never
// reused within the file: its identity is written first, then `state` with a release
// store; a reader loads `state` with acquire before it reads the identity. Every counter is
// one aligned 64-bit word, added to with a relaxed atomic add and read with a relaxed
// atomic load: no counter can be read torn, and a reader needs no lock.
//
// Cost on the data path: two relaxed atomic adds per posted batch (link bytes, work requests)
// and a few at a request's completion (flow bytes; a receive's link bytes); measured in
// docs/watch.md ("What it costs").
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace mesh {
namespace stats {

constexpr uint64_t kMagic = 0x3153544d4853454eull;  // "NESHMTS1" little-endian: a stats file
constexpr uint32_t kLayoutVersion = 2;
constexpr int kMaxLinkSlots = 256;
constexpr int kMaxFlowSlots = 256;
constexpr size_t kNameBytes = 32;

enum class FlowKind : uint32_t {
  Direct = 1,     // a comm straight to the peer over our cables
  Relayed = 2,    // our comm to `peer` that goes through the relay node `via`
  Forwarded = 3,  // this node's relay moves `origin`'s bytes on to `peer`
};
// "direct", "relayed", "forwarded"; "unknown_<n>" for a kind a newer plugin wrote (each its own
// name: a Prometheus series per kind, never two alike).
std::string flowKindName(FlowKind k);

// Process-wide events (StatsHeader::events[]).
enum Event : int {
  kConnects = 0,     // comms connected (send side), including relayed ones
  kAccepts,          // comms accepted (receive side)
  kConnectFails,     // connects or accepts that failed
  kCloses,           // comms closed by NCCL
  kCommErrors,       // comms that failed after they were connected (a dead peer, a QP error)
  kRelayRetries,     // relay requests that failed and moved on to the next candidate (or, every
                     // 100 ms while the connect waits for a relay to start, to the same ones again)
  kTruncations,      // sends larger than the receive they matched
  kSlotsFull,        // links or flows that found no free slot (their bytes are not counted)
  kEventCount,
};
const char* eventName(int e);

struct alignas(64) LinkSlot {
  uint32_t state;                 // 0 free, 1 published (acquire/release)
  uint32_t port;                  // the local device's port number
  char device[kNameBytes];        // local RDMA device, e.g. rocep1s0f1
  uint32_t localAddr;             // our IPv4 address on the cable (host order)
  uint32_t peerAddr;              // the peer's address on it
  uint64_t txBytes;               // posted RDMA WRITE/READ payload, control writes included
  uint64_t rxBytes;               // received payload (see docs: the split at the receiver)
  uint64_t txOps;                 // work requests posted
  uint64_t errors;                // comm failures on this link
};

struct alignas(64) FlowSlot {
  uint32_t state;
  uint32_t kind;                  // FlowKind
  uint32_t peerAddr;              // the peer node (its first listen address)
  uint32_t viaAddr;               // Relayed: the relay node's address we reach it on
  uint32_t originAddr;            // Forwarded: the node whose bytes the relay forwards
  uint32_t pad;
  uint64_t txBytes;               // payload NCCL handed over (forwarded: moved on)
  uint64_t rxBytes;               // payload received
  uint64_t opened;                // comms opened
  uint64_t closed;                // comms closed
  uint64_t errors;                // comms of this flow that failed
};

struct alignas(64) StatsHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t headerBytes;
  uint64_t fileBytes;
  int64_t pid;
  uint64_t startTicks;            // /proc/<pid>/stat field 22: tells a reused pid apart
  uint64_t startUnixNs;           // when the plugin loaded
  uint64_t pidNs;                 // the writer's PID namespace (inode of /proc/self/ns/pid; 0 unknown)
  uint32_t linkCap, flowCap;
  char host[64];
  char process[kNameBytes];       // /proc/self/comm
  uint64_t events[kEventCount];
};

struct StatsFile {
  StatsHeader header;
  LinkSlot links[kMaxLinkSlots];
  FlowSlot flows[kMaxFlowSlots];
};

// --- counters, for the writers ----------------------------------------------------------------

inline void add(uint64_t* counter, uint64_t n) { __atomic_fetch_add(counter, n, __ATOMIC_RELAXED); }
inline uint64_t load(const uint64_t* counter) { return __atomic_load_n(counter, __ATOMIC_RELAXED); }

// The process's publication (one per loaded plugin). Thread-safe.
class Publisher {
 public:
  // Creates the file; false (with *why) when the directory is unusable: the comms then count
  // into their own sinks. `dir` empty: the default (defaultDir()).
  static bool open(const std::string& dir, std::string* path, std::string* why);
  // Unmaps and removes the file (in the process that created it only; not in a forked child).
  // `unmap` false: the mapping stays (comms that may still count into it are left to the
  // kernel at exit), only the file goes.
  static void close(bool unmap = true);
  static bool active();
  // The slot of (device, port, local -> peer), claimed on first use. NULL when the counters
  // are not published (off, or closed, or a forked child) or no slot is free: the caller then
  // counts into a sink of its own (a comm's: no other thread writes it, so the data path
  // costs the same with the counters off and never contends on one shared line).
  static LinkSlot* link(const std::string& device, int port, uint32_t localAddr, uint32_t peerAddr);
  static FlowSlot* flow(FlowKind kind, uint32_t peerAddr, uint32_t viaAddr, uint32_t originAddr);
  static void event(int e, uint64_t n = 1);
  // A process-local counter beside a published link slot (never in the file): the bytes that
  // relay paths posted on that cable end (relayed connections' sending legs, one relay or two,
  // and this node's forwarding for others), so that a two-relay connection can tell the
  // cable's direct traffic (NCCL's connections to the neighbour) from the rest
  // (mesh/relay/relay_twin.h). NULL for a slot not in the published file (a comm's own sink).
  static uint64_t* relayPathCounter(const LinkSlot* slot);
};

// NCCL_MESH_STATS_DIR's default: /dev/shm/nccl-mesh-<uid>.
std::string defaultDir();
// Creates `dir` (0700) or checks that it is ours and not writable by others; false with *why.
bool prepareDir(const std::string& dir, std::string* why);

// --- reading ----------------------------------------------------------------------------------

struct LinkCount {
  std::string device;
  int port = 0;
  uint32_t localAddr = 0, peerAddr = 0;
  uint64_t txBytes = 0, rxBytes = 0, txOps = 0, errors = 0;
  // Same cable end and peer address: the key merge() and rates() group by.
  bool sameKey(const LinkCount& o) const {
    return device == o.device && port == o.port && localAddr == o.localAddr && peerAddr == o.peerAddr;
  }
};

struct FlowCount {
  FlowKind kind = FlowKind::Direct;
  uint32_t peerAddr = 0, viaAddr = 0, originAddr = 0;
  uint64_t txBytes = 0, rxBytes = 0, opened = 0, closed = 0, errors = 0;
  bool sameKey(const FlowCount& o) const {
    return kind == o.kind && peerAddr == o.peerAddr && viaAddr == o.viaAddr && originAddr == o.originAddr;
  }
};

struct ProcessCounts {
  std::string file;               // the stats file's name
  int64_t pid = 0;
  uint64_t startTicks = 0;
  uint64_t pidNs = 0;             // the writer's PID namespace: pid means nothing in another
  std::string host, process;
  uint64_t events[kEventCount] = {};
  std::vector<LinkCount> links;
  std::vector<FlowCount> flows;
};

struct ReadResult {
  std::vector<ProcessCounts> processes;
  std::vector<std::string> warnings;  // files that could not be read, and why
  std::vector<std::string> removed;   // stale files (their process is gone) removed
  int staleSkipped = 0;               // stale files left in place (not ours to remove)
};

// Whether process `pid` that started at `startTicks` still runs (0 ticks: pid alone).
using AliveCheck = bool (*)(int64_t pid, uint64_t startTicks);
bool processAlive(int64_t pid, uint64_t startTicks);
// /proc/<pid>/stat's start time (clock ticks after boot); 0 when unknown.
uint64_t processStartTicks(int64_t pid);
// This process's PID namespace (the inode of /proc/self/ns/pid); 0 when unknown.
uint64_t pidNamespace();

// Reads one stats file; false with *why (not a stats file, another layout version, short).
bool readFile(const std::string& path, ProcessCounts* out, std::string* why);
// Every "*.stats" file in `dir`. Stale files are removed when `removeStale` and ours. A file
// written in another PID namespace (a container sharing /dev/shm, as `--ipc=host` does) is
// never judged stale: its pid names another process here; it is read as a live one.
ReadResult readDir(const std::string& dir, bool removeStale, AliveCheck alive = processAlive);
// The stats directories a reader looks at: `dir` when given, else the default one and,
// for root, every /dev/shm/nccl-mesh-* (every user's jobs).
std::vector<std::string> readerDirs(const std::string& dir);

// Sums of every process's counts, by key (LinkCount/FlowCount::sameKey).
struct Totals {
  uint64_t events[kEventCount] = {};
  std::vector<LinkCount> links;
  std::vector<FlowCount> flows;
  int processes = 0;
};
Totals merge(const std::vector<ProcessCounts>& processes);
// What moved from `before` to `after`, per key, summed over the processes of `after`
// (matched to `before` by file name and pid): a process (or a link, a flow) that appeared in
// between adds all it counted, since its file starts at zero; one that ended adds nothing,
// and no delta is ever negative. Divided by the seconds between them: the rates.
Totals deltas(const std::vector<ProcessCounts>& before, const std::vector<ProcessCounts>& after);

// For a long-running reader (--prometheus): the processes of `before` that are gone from
// `after` (matched by file name and pid) are added to *departed as last seen, their comms
// counted closed. merge(after + *departed) then never goes back when a process ends, which
// a Prometheus counter must not (a drop reads as a reset). *departed holds at most one
// record (file kDepartedFile, pid 0): every ended process summed by key, so it grows with
// the links and flows ever seen, not with the number of processes that ended.
constexpr const char* kDepartedFile = "(ended processes)";
void foldDeparted(const std::vector<ProcessCounts>& before, const std::vector<ProcessCounts>& after,
                  std::vector<ProcessCounts>* departed);

}  // namespace stats
}  // namespace mesh
