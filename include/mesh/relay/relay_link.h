// SPDX-License-Identifier: Apache-2.0
// The relay's data path at the middle node B (issue 15; the protocol is in docs/relay.md).
//
// A relayed connection A -> C through B is two ordinary RC connections that B splices:
//  - the leg A -> B: A holds a plain SendComm; B holds a RelayLegComm (a receiver whose
//    control region carries a staging ring of NCCL_MESH_RELAY_DEPTH slots of
//    NCCL_MESH_RELAY_CHUNK bytes);
//  - the hop B -> C: B holds a RelayFwdComm (a SendComm) connected to C's listener as any
//    sender would be; C's RecvComm and NCCL's accept are unchanged.
// Receiver-driven end to end: C's FIFO slots land in the RelayFwdComm; B copies each group
// (tags, sizes, count) into A's FIFO with its ring's geometry (FifoSlot::relayRing), so A's
// isend is NULL until C posted, matches C's tags and truncates to C's sizes. A writes the
// group's sizes, then its bytes as tickets (comm.h): chunk-sized pieces, each a
// WRITE_WITH_IMM into the next ring slot, striped over every QP of the leg (every link:
// both functions of a Spark cable). B takes the tickets in order whatever order they land
// in, writes each piece straight into C's posted buffer at its offset (over every QP of the
// hop, too) and frees ring slots in ticket order as those WRITEs complete (an 8-byte WRITE
// of the released count into A's SendCtrl); after the last piece B writes the final
// immediates (and the sizes array) C expects. GPU memory stays at the ends; B touches only
// its host staging ring, and never copies a byte with the CPU.
//
// Threads: a RelayLink and its two comms belong to the relay service's thread.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "mesh/datapath/comm.h"
#include "mesh/platform/check.h"

namespace mesh {

// How long a link whose receiver closed keeps its leg up for the sender's last WRs (below).
constexpr int kRelayReceiverGoneGraceMs = 1000;
// How long a link whose sender closed in the middle of a message waits for the message's
// missing pieces before it fails both ends (below).
constexpr int kRelaySenderGoneGraceMs = 1000;

struct RelayGeometry {
  uint32_t depth = 8;
  uint32_t chunk = 512u << 10;
  size_t ringBytes() const { return size_t{depth} * chunk; }
};

// B's end of the leg from A.
class RelayLegComm : public Comm {
 public:
  RelayLegComm(const Discovery* disc, CommSettings settings, RelayGeometry geometry);
  ~RelayLegComm() override;

  uint8_t* ring() const;
  RelayGeometry geometry() const { return geometry_; }
  // Copies C's FIFO group (n entries) into A's FIFO at `slot` as sequence seq + 1.
  ncclResult_t forwardGroup(int slot, uint64_t seq, const FifoSlot* group, int n);
  // Tells A that `released` ring slots are free again (monotonic). *posted false: not now
  // (send queue reserved for FIFO copies); the caller tries again next round.
  ncclResult_t sendReleased(uint64_t released, bool* posted);
  // The sizes A wrote for the group in `slot` (valid once its first chunk's immediate came).
  uint64_t groupSize(int slot, int entry) const;
  // Polls the CQ; the tickets that arrived are handed to onTicket(imm, ticket) in ticket
  // order, each as soon as every earlier one has been handed over.
  template <typename F>
  ncclResult_t poll(F&& onTicket) {
    MESH_CHECK(progress());
    for (;;) {
      Arrival& a = arrived_[next_ % kRelayMaxDepth];
      if (!a.valid) break;
      a.valid = false;
      uint64_t ticket = next_++;
      MESH_CHECK(onTicket(a.imm, ticket));
      MESH_CHECK(postRecv(a.qp));  // the receive that ticket used, back on its QP
    }
    return failure_;
  }
  // Tickets handed over so far.
  uint64_t ticketsTaken() const { return next_; }
  ncclResult_t failure() const { return failure_; }
  ncclResult_t checkAlive(const char* doing) { return checkPeer(doing); }
  const std::string& failureText() const { return failureText_; }

 private:
  // Receives kept posted on every QP: any QP may carry every ticket in flight.
  static constexpr int kChunkQueue = kRelayMaxDepth;
  static_assert(kChunkQueue <= kRecvQueueDepth, "a receive for every ticket in flight on one QP");
  struct Ctrl {
    RecvCtrl recv;                   // sizes[] written by A; stage[] our FIFO copies
    alignas(64) uint64_t releasedStage;
  };
  Ctrl* ctrl() const { return static_cast<Ctrl*>(ctrlMem_); }
  size_t ringOffset() const;
  size_t ctrlBytes() const override;
  void describeCtrl(uint64_t* addr) const override;
  void onCompletion(const ibv_wc& wc) override;
  ncclResult_t activateExtra() override;
  ncclResult_t postRecv(int q);

  struct Arrival {
    bool valid = false;
    uint8_t qp = 0;
    uint32_t imm = 0;
  };
  RelayGeometry geometry_;
  Arrival arrived_[kRelayMaxDepth];  // by ticket % kRelayMaxDepth
  uint64_t next_ = 0;                // the next ticket to hand over
};

// B's sender to C.
class RelayFwdComm : public SendComm {
 public:
  RelayFwdComm(const Discovery* disc, CommSettings settings);
  ~RelayFwdComm() override;

  // Registers the leg's staging ring on this comm's devices (B's two legs may sit on
  // different NICs); `chunk` is the leg's piece size, which a relayed downstream must share.
  ncclResult_t registerRing(void* base, size_t bytes, uint32_t chunk);
  // C's group for sequence `seq` once every entry of it has landed; else nullptr.
  const FifoSlot* peekGroup(uint64_t seq, int* n);
  // The downstream receiver is C itself (direct) or the next relay's leg (relayed: its FIFO
  // slots carry a ring). Work is queued and posted in order by pump(); a relayed downstream
  // takes chunks only as its ring frees slots, like a relayed A (datapath_send.cpp).
  // A group's sizes, known at its first ticket (relayed downstream: written just ahead of
  // the group's first ticket there, on that ticket's QP).
  ncclResult_t beginGroup(int slot, int n, const uint64_t* sizes);
  // Writes `len` bytes at ring offset `ringOff` (the leg's ticket `ticket`) into entry
  // `entry` of C's slot at `off`; `last`: the group's last piece. The ticket is freed when
  // that WRITE has completed.
  ncclResult_t writeChunk(int slot, int entry, uint64_t off, uint64_t ringOff, uint32_t len, uint64_t ticket,
                          bool last);
  // The group's end: C's final immediates (and its sizes array when C needs one); a relayed
  // downstream's no-data ticket when the group had no bytes (else its last piece said it).
  ncclResult_t finishGroup(int slot, int n, const uint64_t* sizes, bool hadBytes);
  // A leg ticket that carried no bytes is free at once (in ticket order with the others).
  void ticketDone(uint64_t ticket);
  // Posts queued work as credits allow.
  ncclResult_t pump();
  ncclResult_t pollCompletions() { return progress(); }
  // Every WR posted has completed.
  bool idle() const;
  // Leg tickets freed, in order (monotonic): what the leg's sender may reuse.
  uint64_t released() const { return released_; }
  ncclResult_t failure() const { return failure_; }
  ncclResult_t checkAlive(const char* doing) { return checkPeer(doing); }
  const std::string& failureText() const { return failureText_; }

 private:
  void onCompletion(const ibv_wc& wc) override;
  void afterPoll() override {}
  void releaseExtra() override;
  ncclResult_t postOne(int q, ibv_send_wr wr, ibv_sge sge);
  struct Op {
    enum class Kind : uint8_t { Chunk, Finish } kind = Kind::Chunk;
    uint8_t entry = 0;
    uint16_t slot = 0;
    bool last = false;      // Chunk: the group's last piece; Finish: the group had bytes
    int n = 0;
    uint32_t len = 0;
    uint64_t off = 0, ringOff = 0, ticket = 0;
  };
  ncclResult_t enqueue(const Op& op);
  // false: not now (credits); *failed when the op is impossible.
  bool postOp(const Op& op, bool* failed);
  // A relayed downstream: one ticket (a piece, or no data) into its ring on the QP its
  // number picks, the group's sizes first when it is the group's first.
  bool postDownTicket(const Op& op, bool noData, bool* failed);

  static constexpr uint32_t kOpQueue = 256;  // > ring slots (64) + 1 op x 32 groups
  Op ops_[kOpQueue];
  uint32_t opHead_ = 0, opTail_ = 0;
  uint64_t downPosted_ = 0;  // tickets written into the downstream relay's ring
  int sizesDue_[kFifoDepth] = {};  // relayed downstream: the group's entry count while its sizes are unwritten
  uint64_t hopPieces_ = 0;   // direct downstream: pieces written (their QP: this % nqps)
  ibv_mr* ringMr_[kMaxLinks] = {};
  uint8_t* ringBase_ = nullptr;
  uint32_t chunk_ = 0;
  bool done_[kRelayMaxDepth] = {};  // leg tickets whose WRITE completed, by ticket % depth
  uint64_t released_ = 0;
};

// One relayed connection at B: the leg from A and the hop to C, spliced.
class RelayLink {
 public:
  RelayLink(std::unique_ptr<RelayLegComm> leg, std::unique_ptr<RelayFwdComm> fwd, std::string name);
  ~RelayLink();
  // One round of work; *active when anything moved. An error means the link is dead: the
  // caller closes it (both comms, both control links), which A and C see as their peer
  // gone.
  ncclResult_t step(bool* active);
  // The link ended because an end closed it (NCCL closed the comm, or its process exited),
  // after everything A had sent was delivered to C: no error, just the end.
  bool closedCleanly() const { return closedCleanly_; }
  const std::string& name() const { return name_; }
  // Why it failed, for the log.
  std::string failureText() const;
  RelayLegComm* leg() { return leg_.get(); }
  RelayFwdComm* fwd() { return fwd_.get(); }
  size_t ringBytes() const { return leg_->geometry().ringBytes(); }
  uint64_t bytesRelayed() const { return bytes_; }
  // How long the leg stays up after the receiver closed while the sender has not (tests).
  void setReceiverGoneGraceMs(int ms) { receiverGoneGraceMs_ = ms; }
  // How long a sender that closed mid-message has to deliver the rest (tests).
  void setSenderGoneGraceMs(int ms) { senderGoneGraceMs_ = ms; }

 private:
  ncclResult_t onTicket(uint32_t imm, uint64_t ticket);

  std::unique_ptr<RelayLegComm> leg_;
  std::unique_ptr<RelayFwdComm> fwd_;
  std::string name_;
  uint64_t forwardSeq_ = 0;   // next group of C to copy to A
  uint64_t dataSeq_ = 0;      // group A's chunks are for
  bool haveSizes_ = false;
  int n_ = 0;
  uint64_t sizes_[kGroupMax] = {};
  int entry_ = 0;
  uint64_t off_ = 0;
  uint64_t bytesLeft_ = 0;    // of the group in flight, not yet taken
  uint64_t releasedSent_ = 0;
  uint64_t bytes_ = 0;
  std::string error_;
  bool draining_ = false;       // A closed: deliver what it sent, then end
  // A closed while a group of its was in flight: the group's missing pieces can only come
  // from A's QPs (completions the close overtook); after this long without any, A died or
  // aborted mid-message and the link fails, so that C's receive fails instead of waiting.
  int senderGoneGraceMs_ = kRelaySenderGoneGraceMs;
  std::chrono::steady_clock::time_point drainQuietSince_;
  // C closed: the leg stays up (its QPs acknowledging A's last WRs) until A closes or this
  // long has passed.
  int receiverGoneGraceMs_ = kRelayReceiverGoneGraceMs;
  bool receiverGone_ = false;
  std::chrono::steady_clock::time_point receiverGoneAt_;
  bool closedCleanly_ = false;
};

}  // namespace mesh
