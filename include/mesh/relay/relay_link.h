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
// group's sizes, then its bytes chunk by chunk into ring slots (WRITE_WITH_IMM each); B
// writes each chunk straight into C's posted buffer at its offset and frees the slot when
// that WRITE completed (an 8-byte WRITE of the released count into A's SendCtrl); after the
// last chunk B writes the final immediates (and the sizes array) C expects. GPU memory
// stays at the ends; B touches only its host staging ring.
//
// Threads: a RelayLink and its two comms belong to the relay service's thread.
#pragma once

#include <memory>
#include <string>

#include "mesh/datapath/comm.h"
#include "mesh/platform/check.h"

namespace mesh {

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
  // Polls the CQ; the immediates that arrived, in order, are handed to onChunk.
  template <typename F>
  ncclResult_t poll(F&& onChunk) {
    MESH_CHECK(progress());
    while (chunkHead_ != chunkTail_) {
      uint32_t imm = chunks_[chunkHead_ % kChunkQueue];
      ++chunkHead_;
      MESH_CHECK(onChunk(imm));
      MESH_CHECK(postRecv());  // the receive that immediate used, back
    }
    return failure_;
  }
  ncclResult_t failure() const { return failure_; }
  ncclResult_t checkAlive(const char* doing) { return checkPeer(doing); }
  const std::string& failureText() const { return failureText_; }

 private:
  static constexpr int kChunkQueue = kRecvQueueDepth;
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
  ncclResult_t postRecv();

  RelayGeometry geometry_;
  uint32_t chunks_[kChunkQueue] = {};
  uint64_t chunkHead_ = 0, chunkTail_ = 0;
};

// B's sender to C.
class RelayFwdComm : public SendComm {
 public:
  RelayFwdComm(const Discovery* disc, CommSettings settings);
  ~RelayFwdComm() override;

  // Registers the leg's staging ring on this comm's devices (B's two legs may sit on
  // different NICs).
  ncclResult_t registerRing(void* base, size_t bytes);
  // C's group for sequence `seq` once every entry of it has landed; else nullptr.
  const FifoSlot* peekGroup(uint64_t seq, int* n);
  // The downstream receiver is C itself (direct) or the next relay's leg (relayed: its FIFO
  // slots carry a ring). Work is queued and posted in order by pump(); a relayed downstream
  // takes chunks only as its ring frees slots, like a relayed A (datapath_send.cpp).
  // A group's sizes, known at its first chunk (relayed downstream: written ahead of it).
  ncclResult_t beginGroup(int slot, int n, const uint64_t* sizes);
  // Writes `len` bytes at ring offset `ringOff` into entry `entry` of C's slot at `off`.
  ncclResult_t writeChunk(int slot, int entry, uint64_t off, uint64_t ringOff, uint32_t len);
  // The group's final immediates (and its sizes array when C needs one).
  ncclResult_t finishGroup(int slot, int n, const uint64_t* sizes);
  // Posts queued work as credits allow.
  ncclResult_t pump();
  ncclResult_t pollCompletions() { return progress(); }
  // Every WR posted has completed.
  bool idle() const;
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
    enum class Kind : uint8_t { Sizes, Chunk, Finish } kind = Kind::Chunk;
    uint8_t entry = 0;
    uint16_t slot = 0;
    int n = 0;
    uint32_t len = 0;
    uint64_t off = 0, ringOff = 0;
  };
  ncclResult_t enqueue(const Op& op);
  // false: not now (credits); *failed when the op is impossible.
  bool postOp(const Op& op, bool* failed);

  static constexpr uint32_t kOpQueue = 256;  // > ring slots (64) + 2 ops x 32 groups
  Op ops_[kOpQueue];
  uint32_t opHead_ = 0, opTail_ = 0;
  uint64_t downPosted_ = 0;  // chunks written into the downstream relay's ring
  ibv_mr* ringMr_[kMaxLinks] = {};
  uint8_t* ringBase_ = nullptr;
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

 private:
  ncclResult_t onChunk(uint32_t imm);

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
  uint64_t ringRecv_ = 0;     // chunks received into the ring
  uint64_t releasedSent_ = 0;
  uint64_t bytes_ = 0;
  std::string error_;
  bool draining_ = false;       // A closed: deliver what it sent, then end
  bool closedCleanly_ = false;
};

}  // namespace mesh
