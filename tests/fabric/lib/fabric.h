// SPDX-License-Identifier: Apache-2.0
// meshfab: a userspace RoCE v2 fabric behind rdma-core's libibverbs ABI.
//
// Owns the process-wide state of the library: the devices found on this network
// namespace's netdevs, every verbs object the application created, the connections to
// other processes and the NIC thread that moves their packets.
//
// Locking: ONE mutex, Fabric::mu, guards every field below that is not marked otherwise.
// Every verbs entry point takes it (post_send, poll_cq ... included); the NIC thread takes
// it for each progress pass and drops it to sleep in epoll_wait. Blocking calls
// (ibv_get_cq_event, ibv_get_async_event) wait on an fd outside the lock. Copies into and
// out of application memory happen under the lock, in dmaWrite()/dmaRead() (the emulated
// DMA engine; see the TSan suppressions in tests/fabric/tsan.supp).
//
// Layering: exports.cpp (the C ABI) -> device.cpp, memory.cpp, cq.cpp, qp.cpp (verbs
// objects) -> engine*.cpp (the RC protocol: engine_requester.cpp, engine_responder.cpp, and
// engine.cpp's progress pass and timers) -> transport.cpp (rings, connections, registry,
// NIC thread).
#pragma once

#include <infiniband/verbs.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "meshfab/stats.h"
#include "pace.h"
#include "wire.h"

namespace meshfab {

using Clock = std::chrono::steady_clock;

struct Context;
struct Qp;
struct Cq;
struct Conn;

// --- settings (environment, read once per Fabric) -------------------------------------------
struct Settings {
  std::string dir;              // MESHFAB_DIR: the fabric directory every process shares
  std::string netdevs;          // MESHFAB_NETDEVS: comma list of names/globs ("" = 198.18/16)
  double timeoutScale = 1.0;    // MESHFAB_TIMEOUT_SCALE: multiplies QP ACK timeouts
  int resolveMs = 1000;         // MESHFAB_RESOLVE_MS: modify_qp(RTR) address resolution time
  size_t reqRing = 4u << 20;    // MESHFAB_RING_KB: request ring bytes per connection
  size_t respRing = 1u << 20;   // response ring (a quarter of the request ring, >= 256 KiB)
  size_t segment = 256u << 10;  // MESHFAB_SEGMENT_KB: largest payload per packet
  size_t pacedSegment = 64u << 10;  // MESHFAB_PACED_SEGMENT_KB: the same on a capped port
  std::string rates;            // MESHFAB_RATES: the link rates file (default <dir>/rates)
  int64_t burstNs = 500000;     // MESHFAB_PACE_BURST_US: how far a late sender may catch up
  bool trace = false;           // MESHFAB_TRACE=1: protocol events on stderr
  int stallMs = 0;              // MESHFAB_STALL_MS: the stall watchdog's threshold (stall_watch.cpp); 0 = off
  // MESHFAB_ECE: "off" (ibv_query_ece / ibv_set_ece answer EOPNOTSUPP, as rxe) or
  // "VENDOR:OPTIONS" in hex: every QP offers them, as mlx5 (qp.cpp). Default 15b3:30000001.
  bool ece = true;
  uint32_t eceVendor = 0x15b3;
  uint32_t eceOptions = 0x30000001;
  // MESHFAB_PORT_SPEED: how a port reports its rate (device.cpp). "" (default): EDR 4X in
  // active_speed, and ibv_query_port_speed answers EOPNOTSUPP (rdma-core's dummy op, as a
  // provider without it); "xdr": XDR 4X as a kernel reports it, active_speed 0 and
  // active_speed_ex 0x100 (rdma-core >= 49); "query:N": ibv_query_port_speed answers N
  // (100 Mb/s units) as well.
  uint32_t portSpeedEx = 0;
  uint64_t portSpeedQuery = 0;
  void load();
};

// --- devices --------------------------------------------------------------------------------
struct Ipv4Net {
  uint32_t addr = 0;  // host order
  int prefix = 0;
  bool contains(uint32_t a) const {
    uint32_t mask = prefix == 0 ? 0 : ~uint32_t{0} << (32 - prefix);
    return (a & mask) == (addr & mask);
  }
};

struct Port {
  std::string netdev;
  int ifindex = 0;
  uint8_t mac[6] = {};
  int mtu = 1500;
  std::vector<Ipv4Net> addrs;
  std::vector<ibv_gid> gids;  // [0] link-local (EUI-64 of the MAC), then one per IPv4 address
  bool up = false;            // IFF_UP && IFF_RUNNING (carrier)
  ibv_mtu activeMtu() const;  // rxe's rule: the largest IB MTU below netdev MTU - headers
};

// The prefix of rdma-core's struct verbs_device: providers' *dv_is_supported() read `ops`
// (NULL here: no provider claims our devices).
struct DeviceHead {
  ibv_device dev;
  const void* ops;
};

struct Device {
  DeviceHead head;  // first: ibv_device* == &head.dev
  std::string name;  // fab_<netdev>
  std::string key;   // registry key: the netdev's MAC in hex
  Port port;
  uint64_t guidBe = 0;  // node GUID (EUI-64 of the MAC), network order
  int index = 0;
  DevStats* stats = nullptr;
  std::vector<Context*> contexts;
  bool present = true;  // false once its netdev disappeared from the namespace
  bool fatal = false;   // meshfab_test_device_fatal: it completes nothing any more
  Pacer pacer;          // its link's rate caps and delay (pace.h); uncapped by default
  bool paceLoaded = false;
};

struct Context {
  verbs_context vctx;  // first; the application's ibv_context* is &vctx.context
  Device* dev = nullptr;
  int asyncFd = -1;    // eventfd (semaphore mode): one count per queued async event
  std::deque<ibv_async_event> events;  // queued, not yet read
};

inline Context* contextOf(ibv_context* c) {
  return reinterpret_cast<Context*>(reinterpret_cast<char*>(c) - offsetof(verbs_context, context));
}

// --- memory ---------------------------------------------------------------------------------
struct Pd {
  ibv_pd pd;  // first
  Context* ctx = nullptr;
  int users = 0;  // MRs and QPs on it
};

struct Mr {
  ibv_mr mr;  // first
  Pd* pd = nullptr;
  uint64_t iova = 0;
  int access = 0;
};

// --- completions ----------------------------------------------------------------------------
struct Channel {
  ibv_comp_channel ch;  // first
  int refs = 0;         // CQs attached
  std::deque<Cq*> events;
};

struct Cqe {
  ibv_wc wc;
  bool solicited = false;  // a receive whose sender asked for a solicited event
  Qp* qp = nullptr;
  bool send = false;
  uint64_t wqe = 0;  // the SQ/RQ index it completes: polling it frees the slots up to it
};

struct Cq {
  ibv_cq cq;  // first
  Context* ctx = nullptr;
  Channel* chan = nullptr;
  std::vector<Cqe> ring;
  size_t head = 0;
  std::atomic<size_t> count{0};  // written under Fabric::mu; read without it by pollCq's fast path
  bool armed = false, solicitedOnly = false;
  bool overflowed = false;
  uint32_t eventsRead = 0, eventsAcked = 0;  // completion events (get_cq_event / ack)
  int asyncOut = 0;  // async events read, not yet acked
  int users = 0;     // QPs on it
};

// --- queue pairs ----------------------------------------------------------------------------
struct SendWqe {
  uint64_t wrId = 0;
  ibv_wr_opcode opcode = IBV_WR_RDMA_WRITE;
  bool signaled = false, solicited = false, inlined = false;
  uint32_t imm = 0;
  uint64_t raddr = 0;
  uint32_t rkey = 0;
  uint32_t nsge = 0;
  uint64_t len = 0;
  uint32_t psn = 0, npsn = 0;
  uint64_t readDone = 0;  // READ: response bytes placed so far
  bool done = false;      // READ: every response arrived
};

struct RecvWqe {
  uint64_t wrId = 0;
  uint32_t nsge = 0;
};

// Responder state of one message that arrives in several packets.
struct InMsg {
  bool active = false;
  PktOp op = PktOp::Write;
  uint32_t firstPsn = 0;
  uint64_t offset = 0;   // bytes placed so far
  uint64_t rq = 0;       // SEND: the receive WQE it fills
  bool haveRq = false;
};

struct Qp {
  ibv_qp_ex qpx;  // first; ibv_qp* == &qpx.qp_base
  Context* ctx = nullptr;
  Device* dev = nullptr;
  Pd* pd = nullptr;
  Cq* scq = nullptr;
  Cq* rcq = nullptr;
  ibv_qp_cap cap{};
  bool sigAll = false;
  ibv_qp_attr attr{};  // as last modified (query_qp returns it)
  bool eceSet = false;      // ibv_set_ece named options (before RTR)
  uint32_t eceOptions = 0;  // ... which, ANDed with the device's, it uses from RTR on
  bool eceCleared = false;  // set since the last modify: a query reads 0 options (as mlx5)
  uint64_t generation = 0;  // bumped on RESET/ERR: stale packets and timers are ignored
  std::string regPath;      // its QPN entry in the registry
  int asyncOut = 0;         // async events read, not yet acked
  Pacer* inbound = nullptr; // the destination's inbound caps (a switch port, pace.h); set at RTR
  int64_t inboundSlot = 0;  // the next request packet's slot there (0: none yet)
  int64_t respInboundSlot = 0;  // the next READ response packet's

  // Send queue: monotonically increasing indices; slot = index % sq.size().
  std::vector<SendWqe> sq;
  std::vector<ibv_sge> sqSge;      // cap.max_send_sge per slot
  std::vector<uint8_t> sqInline;   // cap.max_inline_data per slot
  uint64_t sqHead = 0;  // next to post
  uint64_t sqFree = 0;  // slots below are free again (a polled completion released them)
  uint64_t sqDone = 0;  // WRs below are complete (CQE generated or unsignaled and acked)
  uint64_t txIdx = 0;   // the WR being transmitted
  uint64_t txOff = 0;   // bytes of it sent
  uint32_t nextPsn = 0;
  uint32_t ackedPsn = 0;     // last PSN acknowledged (valid when anyAcked)
  bool anyAcked = false;
  int retriesLeft = 0, rnrRetriesLeft = 0;
  Clock::time_point ackDeadline{};  // retransmit when it passes (armed when WRs are in flight)
  bool timerArmed = false;
  Clock::time_point rnrUntil{};     // no transmission before (RNR back-off)
  bool rnrWait = false;
  int readsOut = 0;
  Conn* conn = nullptr;             // where its requests go (resolved at the first send)
  // Where its last packet ended in conn's request ring: until the responder has consumed
  // past it, the packet is still queued in the "NIC", not on the wire (see runTimers).
  uint64_t txRingPos = 0;
  bool inTxList = false;
  uint32_t passedOver = 0;  // packets other QPs of its port sent while it waited in the tx list

  // Receive queue.
  std::vector<RecvWqe> rq;
  std::vector<ibv_sge> rqSge;
  uint64_t rqHead = 0, rqFree = 0, rqNext = 0;

  // Responder.
  uint32_t expectedPsn = 0;
  bool nakSent = false;  // a NAK is outstanding: drop requests until the expected PSN
  InMsg in;

  // ibv_qp_ex builder (wr_start .. wr_complete).
  std::vector<ibv_send_wr> exWrs;
  std::vector<ibv_sge> exSges;
  std::vector<std::vector<uint8_t>> exInline;
  int exError = 0;

  ibv_qp* ibv() { return &qpx.qp_base; }
  uint32_t qpn() const { return qpx.qp_base.qp_num; }
  ibv_qp_state state() const { return qpx.qp_base.state; }
  SendWqe& swqe(uint64_t i) { return sq[i % sq.size()]; }
  ibv_sge* sges(uint64_t i) { return &sqSge[(i % sq.size()) * cap.max_send_sge]; }
  uint8_t* inlineData(uint64_t i) { return &sqInline[(i % sq.size()) * cap.max_inline_data]; }
  RecvWqe& rwqe(uint64_t i) { return rq[i % rq.size()]; }
  ibv_sge* rsges(uint64_t i) { return &rqSge[(i % rq.size()) * cap.max_recv_sge]; }
};

// --- transport ------------------------------------------------------------------------------
struct RingView {
  RingCtl* ctl = nullptr;
  char* data = nullptr;
  uint64_t size = 0;
  uint64_t avail() const;  // reader: bytes readable
  uint64_t space() const;  // writer: bytes writable
  void peek(uint64_t off, void* dst, size_t n) const;  // reader: copy from tail+off
  void put(uint64_t off, const void* src, size_t n);   // writer: copy to head+off
};

// A queued response (responder side): an ACK/NAK header, or a READ response that is
// streamed from this process's memory one segment at a time.
struct RespItem {
  Packet hdr;
  Qp* qp = nullptr;         // READ: the responder QP (checked by generation)
  uint64_t gen = 0;
  uint64_t sent = 0;        // READ: bytes sent so far
};

struct Conn {
  enum class State { Handshake, Up, Dead };
  State state = State::Handshake;
  bool initiator = false;  // we created it: we send requests, read responses
  int sock = -1;
  std::string peerEp;      // the peer's endpoint name
  int peerPid = 0;
  void* rings = nullptr;   // the memfd mapping (both rings)
  size_t ringsLen = 0;
  RingView tx, rx;
  ProcStatus* peerStatus = nullptr;
  int peerDoorbell = -1;
  bool kick = false;       // published bytes or freed space since the last doorbell check
  bool waitingSpace = false;  // the last write found no room for needSpace bytes
  size_t needSpace = 0;
  std::deque<RespItem> resp;  // responder: responses not yet written
  std::deque<Qp*> txQps;      // requester: QPs with packets to send (round robin)
  std::string why;            // Dead: the reason (trace)
  // Link rates (pace.h), as steady_clock nanoseconds; 0 = not waiting. txReadyAt: every
  // port with packets queued here waits for its cap until then. rxReadyAt: the packet at
  // the head of rx reaches this end of its cable then (the cable's delay).
  int64_t txReadyAt = 0;
  int64_t rxReadyAt = 0;
  bool draining = false;      // the peer died: what it sent arrives now, delay or not
};

// --- the process ----------------------------------------------------------------------------
class Fabric {
 public:
  static Fabric* get();        // the process's instance (a new one in a forked child)
  static Fabric* existing();   // nullptr if none was created (or this is a forked child)
  static void shutdown();      // library unload / exit: stop the thread, free everything

  std::mutex mu;
  Settings settings;
  bool paced = false;  // some device has a rate or a delay (pace.h): pollers yield when idle
  pid_t pid = 0;
  uint64_t nonce = 0;
  uint64_t netns = 0;

  // devices (device.cpp)
  std::vector<std::unique_ptr<Device>> devices;  // every device ever listed; never freed early
  void refreshDevices();                         // rescans netdevs (holds mu)
  Device* deviceForGid(const uint8_t gid[16]);
  int openContexts = 0;
  void portStateChanged();                       // re-reads link flags, queues port events
  void queueAsyncEvent(Context* c, const ibv_async_event& ev);

  // objects
  std::unordered_map<uint32_t, Mr*> mrs;                 // by key (lkey == rkey)
  std::unordered_map<uint64_t, Qp*> qps;                 // by (device index << 32 | qpn)
  std::vector<Cq*> cqs;
  uint32_t nextKey = 0;
  uint32_t qpnCursor = 0x1000;  // next QPN to try (random start per process)
  Mr* findMr(uint32_t key) const;
  Qp* findQp(const Device* d, uint32_t qpn) const;

  // transport (transport.cpp)
  std::string endpoint;     // our name in <dir>/ep/
  int listenFd = -1, epollFd = -1, doorbellFd = -1, statusFd = -1, netlinkFd = -1, ioctlFd = -1;
  int timerFd = -1;  // the NIC thread's wake-up (timerfd: link rates need microseconds)
  ProcStatus* status = nullptr;
  StatsFile* stats = nullptr;
  std::string statsPath;
  std::map<std::string, std::unique_ptr<Conn>> outgoing;  // by peer endpoint
  std::vector<std::unique_ptr<Conn>> incoming;
  std::thread nic;
  std::thread stallWatch;             // MESHFAB_STALL_MS (stall_watch.cpp)
  std::atomic<bool> stallStop{false};
  std::atomic<int> nicPhase{0};  // 0 working, 1 waiting for mu, 2 in epoll_wait, 3 yielding
  void stallWatchLoop(int ms);
  bool stopping = false;
  bool nicRunning = false;
  // When the NIC thread sleeps: when it will wake by itself (a timer armed earlier than
  // that must ring its doorbell). While it runs: min(), since it reads the timers first.
  Clock::time_point nicWakeAt = Clock::time_point::min();
  std::condition_variable cv;  // destroy_cq / destroy_qp wait for event acks

  bool startTransport(std::string* why);  // endpoint, epoll, stats, NIC thread (holds mu)
  void stopTransport(std::unique_lock<std::mutex>& lk);  // joins the NIC thread
  Conn* connectTo(const std::string& ep);
  uint32_t allocQpn(Device* d, std::string* regPath);
  bool lookupQp(const uint8_t dgid[16], uint32_t qpn, std::string* ep);
  void registerDevice(Device* d);
  void kickSelf();                   // wake the NIC thread if it sleeps
  void flushKicks(Conn* c);          // ring the peer's doorbell if it sleeps and we published
  void closeConn(Conn* c, const std::string& why);
  DevStats* devStats(Device* d);
  void countFds();                   // publishes the transport's fd count (stats.h)

  // the RC engine (engine.cpp; qpError, qpReset, forgetQp, scheduleTx: engine_requester.cpp)
  void progress();             // one pass over every connection: read, then write
  void drainRx(Conn* c);       // the peer died: take in what it had already sent
  void scheduleTx(Qp* qp);     // the QP has packets to send
  void runTimers(Clock::time_point now);
  Clock::time_point nextTimer() const;
  void qpError(Qp* qp);        // RTS/RTR/... -> ERR: flush both queues
  void qpReset(Qp* qp);        // -> RESET: forget everything
  void forgetQp(Qp* qp);       // destroy: drop references from connections and CQs
  void forgetMr(Mr* mr);
  void waitUntil(int64_t* slot, int64_t ns);  // a conn waits for a cap or a delay until ns
  void loadPace(Device* d);    // the device's caps from the rates file (device.cpp)
  const std::map<std::string, PaceConfig>& rateTable();  // the rates file, parsed once
  std::map<std::string, PaceConfig> rates;
  bool ratesRead = false;
  // The inbound caps of IPv4 address `addr` (host order; a switch's port towards it, pace.h),
  // or nullptr when it has none. Opened once per address, kept until the fabric shuts down.
  Pacer* inboundPacer(uint32_t addr);
  std::map<uint32_t, std::unique_ptr<Pacer>> inbound;  // by address; nullptr: no caps

  // completions (cq.cpp)
  bool pushCqe(Cq* cq, const Cqe& e);
  void completeSend(Qp* qp, uint64_t idx, ibv_wc_status st);
  void completeRecv(Qp* qp, uint64_t idx, ibv_wc_status st, uint32_t len, ibv_wc_opcode op,
                    bool imm, uint32_t immData, bool solicited);

 private:
  Fabric() = default;
  void nicLoop();
  void handleEpoll(void* tag, uint32_t events);
  void acceptConns();
  void handshake(Conn* c);
  bool anyWork() const;
};

// Emulated DMA: the only places the fabric writes to or reads from application memory
// (named in tests/fabric/tsan.supp). Out of line so that sanitizer reports name them.
void dmaWrite(void* dst, const void* src, size_t n);
void dmaRead(void* dst, const void* src, size_t n);

// Validates [va, va+len) against `key` for `pd` and `access` (IBV_ACCESS_* needed);
// returns the host address or nullptr.
char* translate(Fabric* f, Pd* pd, uint32_t key, uint64_t va, uint64_t len, int access);

// Diagnostics (MESHFAB_TRACE=1).
void trace(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
extern bool gTrace;

// steady_clock (CLOCK_MONOTONIC) <-> nanoseconds: the clock of Packet::arriveNs and pace.h.
inline int64_t toNs(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}
inline Clock::time_point fromNs(int64_t ns) {
  return Clock::time_point(std::chrono::duration_cast<Clock::duration>(std::chrono::nanoseconds(ns)));
}

// PSN arithmetic (24 bits).
inline uint32_t psnAdd(uint32_t a, uint32_t b) { return (a + b) & 0xffffff; }
inline int32_t psnDiff(uint32_t a, uint32_t b) {  // a - b in (-2^23, 2^23]
  int32_t d = static_cast<int32_t>((a - b) & 0xffffff);
  return d >= (1 << 23) ? d - (1 << 24) : d;
}

// ACK timeout of a QP: 4.096 us * 2^timeout (0 = wait forever), times MESHFAB_TIMEOUT_SCALE.
Clock::duration ackTimeout(const Fabric* f, const Qp* qp);
// RNR timer codes (IB spec table): microseconds for min_rnr_timer 0..31.
uint32_t rnrDelayUs(uint8_t code);

}  // namespace meshfab
