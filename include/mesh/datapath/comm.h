// SPDX-License-Identifier: Apache-2.0
// Data-path comms: the receiver-driven FIFO protocol over RC QPs.
//
// Protocol (one grouped receive = one FIFO slot, seq = per-comm counter, slot = seq % 32):
//  1. irecv posts one RECV per QP (for the completion immediates), fills n FifoSlots in its
//     local staging area and RDMA-WRITEs them into the sender's FIFO[slot].
//  2. isend looks only at the NEXT slot (seq): until FIFO[slot] holds seq+1 in both seqHead
//     and seqTail of every entry of the group it returns a NULL request. Then its tag picks
//     an entry of the group that no send has taken yet; no such entry (the tag belongs to a
//     later group, or to none) is a NULL request too, retried by NCCL. A send larger than
//     its entry is truncated to it. Once all n entries have their send, the group's data is
//     RDMA-WRITTEN, split over the comm's QPs (128-byte aligned chunks above
//     NCCL_MESH_SPLIT_MIN) and across parallel links, and seq moves on. (As NCCL 2.28.9
//     net_ib.cc ncclIbIsend; why the group waits for its last send: docs/DESIGN-notes.md.)
//  3. The last WR of the group on every QP carries an immediate: the byte count when n==1
//     and it fits 31 bits; otherwise (grouped receive, or a send of 2 GiB or more) the
//     immediate is kImmViaSizes and QP 0's last WR writes the sizes into the receiver's
//     sizes[slot], so they are in place before the receiver counts that completion.
//  4. The receive completes when every QP's immediate arrived; the send when every QP's
//     signaled final WR completed. A GPUDirect flush reads through every device of the comm.
//
// Remote-written memory (who writes, who reads, what orders it; the full list with the
// cross-thread state is in docs/DESIGN-notes.md, "Memory ordering"). x86 never reorders
// loads with loads or stores with stores, so a missing barrier here only shows on a weaker
// model: aarch64 (DGX Spark's GB10, Grace) may.
//  - SendCtrl::fifo: written by the RECEIVER's NIC, read by the sender's CPU. A slot is
//    accepted only when seqHead and seqTail (first and last 8 bytes) both equal seq+1
//    (fifoSlotArrived: acquire loads of both before any other field is read). The slot
//    is one 64-byte-aligned line written by one WRITE through a strictly ordered MR (the
//    control region has no relaxed ordering), which NICs place whole and in order; NCCL's
//    IB transport relies on the same with one index word. Both words are a second guard.
//  - RecvCtrl::sizes: written by the SENDER's NIC before the final immediate on QP 0; read
//    by the receiver's CPU only after that completion was polled: progress() issues an
//    acquire fence after every poll that returned completions, so no load of sizes (nor
//    NCCL's loads of the received data, after test() says done) is satisfied before the CQE
//    was seen.
//  - RecvCtrl::flushWord: target of the GPUDirect flush READs; its value is never used.
// Local memory a NIC reads (RecvCtrl::stage, SendCtrl::sizesStage, NCCL's send buffers):
// written by the CPU with plain stores, then ibv_post_send; postBatch() issues a release
// fence first, so those stores are visible before the work request can be (rdma-core's
// providers add their own device barrier before the doorbell).
//
// Verbs objects: the comm owns its QPs, flush QPs, CQs, control memory and its MRs; close()
// releases them in one order (every QP to ERR, drain, QPs, MRs, CQs, memory), whatever
// state the comm is in. The devices (context, PD) belong to the plugin and outlive it.
//
// Threads: a comm is used by one NCCL thread at a time; nothing here locks. `asyncEvent_`
// is the only field another thread (the reactor) writes (atomic).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "err.h"
#include "mesh/connect/transport.h"
#include "mesh/datapath/data_ops.h"
#include "mesh/datapath/wr_id.h"
#include "mesh/discovery/nic_discovery.h"
#include "mesh/rdma/mr_cache.h"
#include "mesh/rdma/qp.h"
#include "mesh/stats/stats.h"
#include "mesh/wire/handshake_proto.h"

namespace mesh {

// Capacity. NCCL's plugin README: a comm must take NCCL_NET_MAX_REQUESTS (32) requests of
// up to maxRecvs (8) buffers each; running out of anything is a NULL request, never an
// error.
constexpr int kFifoDepth = 32;                        // grouped receives in flight
constexpr int kGroupMax = 8;                          // maxRecvs: buffers per grouped receive
constexpr int kRequestPool = kFifoDepth * kGroupMax;  // 256 sends, or receives + flushes
constexpr int kMaxLinks = kHsMaxLinks;
constexpr int kMaxQps = 16;                           // data QPs per comm, over all links
constexpr int kMaxBatch = 32;                         // WRs per post_send call
constexpr int kSendQueueDepth = 128;                  // sender's data QPs
constexpr int kCtrlQueueDepth = 2 * kFifoDepth;       // receiver's QP 0: FIFO slot writes
constexpr int kRecvQueueDepth = 2 * kFifoDepth;       // receiver's QPs: one RECV per irecv
constexpr int kFlushQueueDepth = kRequestPool;        // flush QPs: one READ per flush request
constexpr uint32_t kImmViaSizes = 0xffffffffu;        // immediate: "read sizes[slot]"

static_assert(kMaxQps <= (1 << kWrIdQpBits) && kMaxLinks <= (1 << kWrIdQpBits), "QPs fit the wr_id qp field");
static_assert(kRequestPool <= (1 << kWrIdIndexBits), "requests fit the wr_id index field");
static_assert(kFifoDepth <= (1 << kWrIdIndexBits), "FIFO slots fit the wr_id index field");
static_assert(kRecvQueueDepth >= kFifoDepth, "a RECV per QP for every grouped receive in flight");
static_assert(kCtrlQueueDepth >= kFifoDepth, "a slot write for every grouped receive in flight");
// The receiver signals one FIFO slot write in this many (NCCL's IB transport: one in 32 per
// device); the unsignaled ones between hold at most this many of QP 0's slots.
constexpr int kFifoSignalEvery = 16;
static_assert(kFifoSignalEvery <= kCtrlQueueDepth - kFifoDepth,
              "unsignaled FIFO writes never hold the slots a grouped receive in flight needs");
static_assert(kFlushQueueDepth >= kRequestPool, "flush READs cannot run out before requests do");
static_assert(kSendQueueDepth > kMaxBatch, "a batch always fits an empty send queue");

struct alignas(64) FifoSlot {
  uint64_t seqHead;            // seq + 1; first field written
  uint64_t addr;               // receive buffer
  uint32_t rkeys[kMaxLinks];   // its rkey on each link's device
  uint64_t size;               // receive buffer size
  int32_t tag;
  int32_t nreqs;               // buffers in this grouped receive (same in each slot)
  // 0: a direct receiver; addr/rkeys name the receive buffer. Otherwise the receiver is a
  // relay (issue 15, docs/relay.md): relayRingDepth(v) slots of relayRingChunk(v) bytes at
  // addr/rkeys, and size/tag are the FINAL receiver's, so tags and truncation are its own.
  uint64_t relayRing;
  uint64_t seqTail;            // seq + 1; last field written
};
static_assert(sizeof(FifoSlot) == 64, "FIFO slot is one cache line");
static_assert(offsetof(FifoSlot, seqTail) == 56, "seqTail must be the slot's last word");

// Whether FIFO entry `s` holds the receive posted as sequence `expect` (seq + 1).
// Writer: the receiver's NIC (one RDMA WRITE of the staged entries). Reader: the sender's
// NCCL thread in isend. Ordering: seqTail, then seqHead, each an acquire load; the caller
// reads the other fields only after this returned true, so those loads cannot be satisfied
// before both sequence words matched. Without the acquires an aarch64 core may read
// tag/size/addr from before the NIC's write while seqTail already shows the new sequence,
// and post data to a stale buffer; x86 hides that. Both ends are checked as a second guard:
// what keeps a slot from being read half-written is that it is one aligned line written by
// one WRITE through the strictly ordered control MR (as NCCL's single idx word relies on),
// not the two words (bytes placed in any order could match both before the middle landed).
// tests/unit/fifo_litmus_test.cpp runs this protocol between two threads (TSan flags a
// missing acquire as a race).
inline bool fifoSlotArrived(const FifoSlot& s, uint64_t expect) {
  return __atomic_load_n(&s.seqTail, __ATOMIC_ACQUIRE) == expect &&
         __atomic_load_n(&s.seqHead, __ATOMIC_ACQUIRE) == expect;
}

struct SendCtrl {
  // Remote-written by the receiver's NIC; read by isend through fifoSlotArrived (acquire).
  FifoSlot fifo[kFifoDepth][kGroupMax];
  // Written by the CPU, read by the local NIC (the sizes WRITE): release fence in postBatch.
  uint64_t sizesStage[kFifoDepth][kGroupMax];
  // Relayed comms only: staging-ring slots the relay has forwarded and freed (monotonic).
  // Remote-written by the relay's NIC (one aligned 8-byte WRITE); read with an acquire load
  // before a slot is reused, so the slot is free before our NIC can overwrite it.
  alignas(64) uint64_t relayReleased;
};

// The relay's staging-ring geometry as FifoSlot::relayRing carries it.
inline uint64_t relayRingWord(uint32_t depth, uint32_t chunk) { return (uint64_t{depth} << 32) | chunk; }
inline uint32_t relayRingDepth(uint64_t v) { return static_cast<uint32_t>(v >> 32); }
inline uint32_t relayRingChunk(uint64_t v) { return static_cast<uint32_t>(v); }
// Tickets (docs/DESIGN-notes.md, "Relay"). Every WRITE_WITH_IMM a sender posts into a relay's
// staging ring is a ticket: its k-th (k = 0, 1, ...) takes ring slot k % depth and needs
// k - released < depth (SendCtrl::relayReleased: tickets the relay has freed, in order).
// Tickets are striped over every QP of the comm (Comm::pickRelayQp), so they may land out of
// order; the immediate names the ticket (k mod 2^16), so the relay puts them back in
// order, and says whether it carries bytes and whether it ends its group. A data ticket's
// length is not sent: both ends cut every entry of a group into chunk-sized pieces in
// order (the last piece of an entry shorter), so the relay derives it from the group's
// sizes, which the sender writes on the QP of the group's first ticket just before it.
// A group's last data ticket carries kRelayLast; a group without bytes is one ticket with
// kRelayNoData | kRelayLast.
constexpr uint32_t kRelayLast = 0x80000000u;
constexpr uint32_t kRelayNoData = 0x40000000u;
constexpr uint32_t kRelayTicketMask = 0xffffu;
constexpr int kRelayMaxDepth = 64;  // NCCL_MESH_RELAY_DEPTH's maximum: tickets in flight per leg
inline uint32_t relayImm(uint64_t ticket, bool last, bool noData) {
  return static_cast<uint32_t>(ticket & kRelayTicketMask) | (last ? kRelayLast : 0u) | (noData ? kRelayNoData : 0u);
}
// The ticket an immediate names, given the oldest ticket not yet taken (`base`): tickets in
// flight are within [base, base + depth), depth <= kRelayMaxDepth < 2^16.
inline uint64_t relayTicket(uint32_t imm, uint64_t base) {
  return base + ((static_cast<uint64_t>(imm & kRelayTicketMask) - base) & kRelayTicketMask);
}
// The bytes of data ticket number `piece` of a group's entry of `size` bytes cut into
// `chunk`-byte pieces: the same walk on both ends of a leg.
inline uint64_t relayPieceBytes(uint64_t size, uint64_t off, uint32_t chunk) {
  return size - off < chunk ? size - off : chunk;
}

// Whether a group's final immediate is kImmViaSizes with the sizes array on QP 0 (a grouped
// receive, or one size that does not fit the 31-bit immediate), or the size itself.
inline bool sizesViaArray(int n, uint64_t firstSize) { return n > 1 || firstSize > 0x7fffffffu; }
struct RecvCtrl {
  // Remote-written by the sender's NIC before QP 0's final immediate; read after that CQE
  // was polled (acquire fence in progress()), with atomic loads.
  uint64_t sizes[kFifoDepth][kGroupMax];
  // Written by the CPU, read by the local NIC (the slot WRITE): release fence in postBatch.
  FifoSlot stage[kFifoDepth][kGroupMax];
  uint64_t flushWord;  // target of flush READs; never read
};

class Comm;
class TwinComm;

struct Request {
  enum class Kind : uint8_t { Free, Send, Recv, Flush };
  Kind kind = Kind::Free;
  uint16_t index = 0;
  uint16_t gen = 0;
  Comm* comm = nullptr;
  int pending = 0;               // completions still expected
  int n = 1;
  int slot = 0;
  size_t sizes[kGroupMax] = {};
  bool viaSizes = false;         // recv: the sender wrote the sizes array
  // A two-relay connection's request (mesh/relay/relay_twin.h): the other leg's part.
  bool twinned = false;
  // Send only.
  const char* data = nullptr;
  size_t size = 0;
  const MrHandle* mh = nullptr;
};

struct CommSettings {
  int qpsPerLink = 1;
  size_t splitMin = 65536;
  size_t maxWrBytes = 1u << 30;
  int mtuCap = 0;
  int gidIndex = -1;             // NCCL_MESH_GID_INDEX: forced GID index, -1 per address
  bool forceFlush = false;       // flush host memory too (tests)
  bool gdrFlushDisable = false;
  bool flushQps = true;          // receivers create GPUDirect flush QPs (false: host memory only)
  int envTrafficClass = -1;      // NCCL_MESH_IB_TC; -1: unset (see resolveTrafficClass)
  int fifoTrafficClass = -1;     // NCCL_MESH_IB_FIFO_TC: a receiver's data QPs; -1: unset
  bool ece = true;               // NCCL_MESH_IB_ECE_ENABLE: a sender offers its QPs' ECE
  QpTuning tuning;               // trafficClass is resolved per connection
  const DataOps* ops = verbsDataOps();  // the data path's verbs calls (a fake in unit tests)
};

// NCCL's precedence (2.28.9 net_ib.cc ncclIbConnect, 2.30.7 net_ib/connect.cc
// ncclIbConnectImpl): the environment's class when set, else the communicator's
// (ncclNet v10+ config), else 0. Decided by the connecting (sending) side.
int resolveTrafficClass(int envTrafficClass, int commTrafficClass);

// Everything both comm kinds own: links, QPs, CQs, control region, request pool.
class Comm : public PreparedConn {
 public:
  Comm(bool sender, const Discovery* disc, CommSettings settings);
  ~Comm() override;

  // `trafficClass`: resolved by resolveTrafficClass(); a receiver replaces it (and the
  // service level) with the sender's from its HELLO in activate().
  ncclResult_t prepare(const std::vector<Route>& routes, int trafficClass, HsMessage* local);
  // `reply`: a receiver's ACCEPT as prepare() described it; activate adds what only the
  // HELLO decides (the ECE its QPs settled on). nullptr on the sender's side.
  ncclResult_t activate(const HsMessage& remote, HsMessage* reply = nullptr);
  ncclResult_t test(Request* req, int* done, size_t* sizes);
  // Releases every verbs object the comm owns, in order (see the header comment). Safe with
  // requests in flight and on a half-built comm; idempotent.
  void close();
  // Reactor thread: a fatal asynchronous event hit one of this comm's QPs or its CQ. The comm
  // is alive (ibv_destroy_qp and ibv_destroy_cq wait until the event is acknowledged); the
  // next call fails.
  void markAsyncError(int eventType) { asyncEvent_.store(eventType, std::memory_order_release); }
  bool sender() const { return sender_; }
  // The local ports (LocalNic::index) the comm's links leave on, each once.
  std::vector<int> localPorts() const;
  // The RDMA devices (Discovery::devices index) the comm's links use, each once.
  std::vector<int> deviceIndexes() const;
  // Live counters (mesh/stats/stats.h). prepare() gives every link its slot; countAs() gives
  // the comm its flow (a relayed connection, a relay's forwarding); markOpen(): the comm is
  // NCCL's (or the relay's) now: a comm without a flow gets the direct one to its peer (its
  // lowest address on our cables), the flow counts it opened, and close() counts it closed.
  // A relayed or forwarded flow's posts also count as relay-path bytes of their cable ends.
  void countAs(stats::FlowKind kind, uint32_t peerAddr, uint32_t viaAddr, uint32_t originAddr) {
    stats::FlowSlot* f = stats::Publisher::flow(kind, peerAddr, viaAddr, originAddr);
    flowStats_ = f != nullptr ? f : &sinkFlow_;
    for (size_t l = 0; l < links_.size(); ++l) {
      relayTx_[l] = kind == stats::FlowKind::Direct ? nullptr : stats::Publisher::relayPathCounter(linkStats_[l]);
    }
  }
  uint32_t peerAddr() const { return peerAddr_; }
  // A receiver whose sender is a relay: the relayed connection's sender, as the relay's
  // HELLO named it (0: a direct connection, or a relay that predates the field).
  uint32_t originAddr() const { return originAddr_; }
  // A receiver: 1 or 2 when the sender's HELLO named this connection a leg of a two-relay
  // connection (the accept pairs it with the other leg, mesh/relay/relay_twin.h); else 0.
  int twinLeg() const { return twinLeg_; }
  // The two-relay connection this comm is a leg of (NULL: none). Its first leg owns it.
  TwinComm* twin() const { return twin_; }
  void setTwin(TwinComm* t) { twin_ = t; }
  // The live counters of this comm's links (cable ends); a link's may be the comm's own sink.
  int linkCount() const { return static_cast<int>(links_.size()); }
  const stats::LinkSlot* linkSlot(int link) const { return linkStats_[link]; }
  // What relay paths posted on link `l`'s cable end (NULL: its counters are unpublished).
  const uint64_t* relayPathTx(int link) const { return stats::Publisher::relayPathCounter(linkStats_[link]); }
  // Whether the peer is still there (false once the control link closed or the comm failed).
  // Polls the comm's completions and fails it if its peer is gone (a request that waits on
  // another comm's progress: a two-relay connection's part).
  ncclResult_t pollAlive(const char* doing) {
    ncclResult_t r = progress();
    return r != ncclSuccess ? r : checkPeer(doing);
  }
  bool peerAlive() const {
    return failure_ == ncclSuccess && (control == nullptr || !control->closed.load(std::memory_order_acquire));
  }
  void markOpen() {
    if (open_) return;
    if (flowStats_ == &sinkFlow_) countAs(stats::FlowKind::Direct, peerAddr_, 0, 0);
    stats::add(&flowStats_->opened, 1);
    open_ = true;
  }
  // Whether `mh` has a registration on every device of this comm (a handle registered
  // through another comm may not).
  bool covers(const MrHandle* mh) const {
    for (int s = 0; s < ndevs_; ++s) {
      if (mh->regs[devs_[s].deviceIndex] == nullptr) return false;
    }
    return true;
  }

 protected:
  struct Link {
    Route route;
    const MeshPort* port = nullptr;
    int devSlot = 0;
    uint64_t remoteCtrl = 0;
    uint32_t remoteRkey = 0;
    uint8_t gid[16] = {};
    // ECE of this link's QPs: a sender's offer (prepare) and then what it set from the
    // ACCEPT; a receiver's options after set + RTR (activate). hasEce false: none in use.
    bool hasEce = false;
    Ece ece;
  };
  struct DevSlot {
    const VerbsDevice* dev = nullptr;
    int deviceIndex = 0;
    int firstLink = 0;            // the flush QP loops back through this link's port
    CompletionQueue cq;
    ibv_mr* ctrlMr = nullptr;
    QueuePair flushQp;            // receiver only: the GPUDirect flush READs
  };
  struct Qp {
    QueuePair qp;
    int link = 0;
    int devSlot = 0;
    int credits = 0;
    uint16_t batches[kSendQueueDepth] = {};  // WR counts of signaled batches in flight
    int batchHead = 0, batchTail = 0;
    uint32_t batchBytes[kSendQueueDepth] = {};  // bytes of those batches
    uint64_t bytesInFlight = 0;                  // their sum (pickRelayQp)
    // Unsignaled WRs posted since the last signaled batch: their slots come back with the
    // next signaled batch's completion (RC completes a QP's WRs in order).
    int unsignaled = 0;
    uint32_t unsignaledBytes = 0;
  };

  Request* allocRequest(Request::Kind kind);
  void freeRequest(Request* r);
  ncclResult_t progress();
  // The fatal events the reactor published for this comm (its QPs, its CQ, its devices):
  // atomic loads, no poll. The part of progress() a call that polls nothing still owes.
  ncclResult_t checkEvents();
  ncclResult_t health(const Request* waiting) const;
  // The comm's failure, if any; else fails it once its control link is gone (a dead or
  // unreachable peer never posts another FIFO slot nor completes a transfer). `doing`
  // names the call for the message.
  ncclResult_t checkPeer(const char* doing);
  // Posts wrs_[0..count) on QP q; the last one signaled unless `signal` is false (then the
  // batch's send-queue slots return with the next signaled batch of that QP).
  ncclResult_t postBatch(int q, int count, bool signal = true);
  // One WRITE on QP 0 of `len` bytes of our control region at `local` into the peer's
  // control region at `remoteOffset` (FIFO slots, a relay's released count); signaled
  // unless `signal` is false.
  ncclResult_t postCtrlWrite(const void* local, uint32_t len, uint64_t remoteOffset, uint16_t index,
                             bool signal = true);
  // A signaled batch on QP q completed: its WRs' send-queue slots are free again.
  void returnCredits(int q);
  // The QP for the next relayed piece (a ticket, or a piece a relay forwards) with `need`
  // credits: the one with the fewest bytes in flight (ties: from QP rr % nqps on); -1 when
  // none has the credits. Work-conserving and byte-aware: a QP whose link runs slower (a
  // busier PCIe function) holds its bytes longer and gets fewer pieces instead of holding
  // the others back (the relay frees its ring in ticket order, so one starved QP would stall
  // the whole relayed stream), and equal links carry equal bytes whatever the pieces' sizes
  // (taking QPs in turn gave one every 4 KiB piece and the other every 64 KiB one when those
  // alternated: 0.44 / 0.56 on a Spark cable's functions).
  int pickRelayQp(uint64_t rr, int need) const;
  void fail(const std::string& why, ncclResult_t code);
  // A completed request's payload into the live counters (test()).
  void countDone(const Request& r);
  virtual void onCompletion(const ibv_wc& wc) = 0;
  // Runs at the end of every progress(): work that waits on remote-written memory rather
  // than on a completion (a relayed sender's ring credits).
  virtual void afterPoll() {}
  // Bytes of control memory (registered as ctrlMr on every device of the comm).
  virtual size_t ctrlBytes() const;
  // Extra registrations of a subclass, released by close() after the QPs are gone.
  virtual void releaseExtra() {}
  ncclResult_t completionError(const ibv_wc& wc);

  const bool sender_;
  const Discovery* disc_;
  const CommSettings settings_;
  QpTuning tuning_;                  // settings_.tuning with this connection's classes
  std::vector<Link> links_;
  DevSlot devs_[kMaxLinks];
  int ndevs_ = 0;
  Qp qps_[kMaxQps];
  int nqps_ = 0;
  void* ctrlMem_ = nullptr;          // whole pages (fork safety: see prepare())
  size_t ctrlSize_ = 0;
  uint64_t seq_ = 0;
  Request reqs_[kRequestPool];
  Request* freeList_[kRequestPool];
  int nfree_ = 0;
  // Written by the reactor (release, markAsyncError), read by NCCL's thread in progress()
  // (acquire): the event's QP state is seen with it. The only cross-thread field of a comm.
  std::atomic<int> asyncEvent_{-1};
  ncclResult_t failure_ = ncclSuccess;
  std::string failureText_;
  // The failure so far is only a flushed WR: the WR whose error put the QP in the error
  // state may complete after the flushes, and then it names the real cause.
  bool failureIsFlush_ = false;
  bool closed_ = false;
  // test(): when this end first saw the peer's close with a request pending (its grace
  // starts then; empty before), and whether a request completing after it was logged.
  std::optional<std::chrono::steady_clock::time_point> peerGoneAt_;
  bool lateNoted_ = false;
  bool open_ = false;                // markOpen() was called
  uint32_t peerAddr_ = 0;            // the peer's lowest address on the comm's links
  uint32_t originAddr_ = 0;          // originAddr()
  int twinLeg_ = 0;                  // twinLeg()
  TwinComm* twin_ = nullptr;         // twin()
  stats::LinkSlot sinkLink_ = {};    // where counts go when they are not published
  stats::FlowSlot sinkFlow_ = {};
  stats::LinkSlot* linkStats_[kMaxLinks];  // per link; the sink until prepare()
  uint64_t* relayTx_[kMaxLinks] = {};      // per link: a relayed or forwarded flow's (countAs)
  stats::FlowSlot* flowStats_ = &sinkFlow_;
  ibv_send_wr wrs_[kMaxBatch] = {};
  ibv_sge sges_[kMaxBatch] = {};

 private:
  ncclResult_t allocCtrl();
  ncclResult_t refreshGid(Link* l) const;
  ncclResult_t createDevSlots();
  ncclResult_t createQps();
  void describe(HsMessage* local) const;
  ncclResult_t connectQp(int q, const HsQp& remote);
  ncclResult_t offerEce();
  ncclResult_t setEce(size_t link, const HsLink& remote);
  ncclResult_t settleEce(size_t link, HsMessage* reply);
  void logLink(size_t link, int peerMtu) const;
  QpTuning qpTuning() const;  // what this comm's data QPs are brought up with
  void drain();
  virtual ncclResult_t createExtra() { return ncclSuccess; }
  virtual ncclResult_t activateExtra() { return ncclSuccess; }
  virtual void describeCtrl(uint64_t* addr) const = 0;
};

class SendComm : public Comm {
 public:
  SendComm(const Discovery* disc, CommSettings settings);
  // *out NULL with ncclSuccess: not now (no slot posted, its tag not in the slot, or out
  // of requests); NCCL calls again.
  ncclResult_t isend(void* data, size_t size, int tag, const MrHandle* mh, Request** out);

 protected:
  SendCtrl* ctrl() const { return static_cast<SendCtrl*>(ctrlMem_); }
  // The group in `slot` goes to a relay's staging ring (FifoSlot::relayRing), not a buffer.
  bool relayedSlot(int slot) const { return ctrl()->fifo[slot][0].relayRing != 0; }
  // Where the receiver's sizes[slot] is, through link l.
  uint64_t remoteSizes(int l, int slot) const {
    return links_[l].remoteCtrl + offsetof(RecvCtrl, sizes) + slot * sizeof(RecvCtrl::sizes[0]);
  }

 private:
  struct Cursor {
    int r = 0;
    size_t off = 0;
    bool done = false;
  };
  struct Group {
    int nreqs = 0;        // 0: slot idle
    int assigned = 0;
    int pendingQps = 0;   // final WRs not yet completed
    bool relaySizesPosted = false;  // relayed: the sizes WRITE that precedes the first ticket
    int relayLastData = -1;         // relayed: the last entry with bytes (-1: none)
    uint32_t relayFinalsLeft = 0;   // relayed: QPs still owed their SendFinal (bit q)
    Request* reqs[kGroupMax] = {};
    Cursor cursor[kMaxQps];
  };
  void describeCtrl(uint64_t* addr) const override;
  void onCompletion(const ibv_wc& wc) override;
  bool slotArrived(int slot, int pos, uint64_t expect) const;
  // The next slot's group when it has fully arrived (NULL otherwise, or on a bad slot).
  ncclResult_t nextGroup(Group** out);
  void warnTruncation(size_t size, uint64_t posted, int tag);
  ncclResult_t queueGroup(int slot);
  ncclResult_t pump();
  ncclResult_t postShare(int slot, int q, bool* finished);
  // Relayed group: the chunks go into the relay's staging ring as its credits allow.
  ncclResult_t postRelayed(int slot, bool* finished);
  void afterPoll() override;
  void shareOf(const Request* r, int q, size_t* lo, size_t* hi) const;

  Group groups_[kFifoDepth];
  uint64_t ringPosted_ = 0;  // relayed: tickets written into the relay's ring so far
  int postQueue_[kFifoDepth] = {};
  int postHead_ = 0, postCount_ = 0;
  bool warnedTruncation_ = false;
};

class RecvComm : public Comm {
 public:
  RecvComm(const Discovery* disc, CommSettings settings);
  // *out NULL with ncclSuccess: not now (every FIFO slot or request in use).
  ncclResult_t irecv(int n, void** data, const size_t* sizes, const int* tags, MrHandle* const* mh,
                     Request** out);
  // *out NULL means "nothing to flush" to NCCL (src/transport/net.cc treats a NULL flush
  // request as done), so a flush that is due is posted or fails, never NULL.
  ncclResult_t iflush(int n, void** data, const int* sizes, MrHandle* const* mh, Request** out);

 private:
  RecvCtrl* ctrl() const { return static_cast<RecvCtrl*>(ctrlMem_); }
  void describeCtrl(uint64_t* addr) const override;
  void onCompletion(const ibv_wc& wc) override;
  void onRecv(const WrId& id, const ibv_wc& wc);
  ncclResult_t createExtra() override;
  ncclResult_t activateExtra() override;
  ncclResult_t postSlots(int n, void** data, const size_t* sizes, const int* tags, MrHandle* const* mh, int slot);

  Request* slotOwner_[kFifoDepth] = {};
};

// The Transport the handshake uses in production: builds SendComm/RecvComm objects.
class RdmaTransport : public Transport {
 public:
  RdmaTransport(const Discovery* disc, CommSettings settings, std::vector<int> portFilter = {});
  std::vector<LocalNic> localNics() const override;
  ncclResult_t prepare(bool sender, const std::vector<Route>& routes, const ConnOptions& opts,
                       std::unique_ptr<PreparedConn>* out, HsMessage* local) override;
  ncclResult_t activate(PreparedConn* conn, const HsMessage& remote, HsMessage* reply) override;

 protected:
  // The comm kind each side gets (the relay's transport builds its own kinds).
  virtual std::unique_ptr<Comm> makeComm(bool sender) const;
  const Discovery* disc_;
  CommSettings settings_;

 private:
  std::vector<int> portFilter_;
};

}  // namespace mesh
