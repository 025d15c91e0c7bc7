// SPDX-License-Identifier: Apache-2.0
// The relay node's data path: RelayLegComm (from A), RelayFwdComm (to C) and the RelayLink
// that splices them (mesh/relay/relay_link.h; protocol: docs/relay.md).
#include "mesh/relay/relay_link.h"

#include <arpa/inet.h>

#include <cerrno>
#include <cstring>

#include "mesh/platform/check.h"
#include "mesh/platform/log.h"

namespace mesh {

// --- RelayLegComm -----------------------------------------------------------------------------

RelayLegComm::RelayLegComm(const Discovery* disc, CommSettings settings, RelayGeometry geometry)
    : Comm(false, disc, settings), geometry_(geometry) {}

RelayLegComm::~RelayLegComm() { close(); }

size_t RelayLegComm::ringOffset() const { return (sizeof(Ctrl) + 4095) & ~size_t{4095}; }

size_t RelayLegComm::ctrlBytes() const { return ringOffset() + geometry_.ringBytes(); }

uint8_t* RelayLegComm::ring() const { return static_cast<uint8_t*>(ctrlMem_) + ringOffset(); }

// A writes sizes[] at the start of this region, as it would a receiver's.
void RelayLegComm::describeCtrl(uint64_t* addr) const { *addr = reinterpret_cast<uintptr_t>(ctrl()->recv.sizes); }

ncclResult_t RelayLegComm::postRecv() {
  ibv_recv_wr wr{};
  wr.wr_id = encodeWrId(WrId{WrKind::Recv, 0, 0, 0});
  ibv_recv_wr* bad = nullptr;
  int rc = settings_.ops->postRecv(qps_[0].qp.get(), &wr, &bad);
  if (rc != 0) fail(std::string("ibv_post_recv on the relay leg failed: ") + strerror(rc), ncclSystemError);
  return failure_;
}

// Every chunk's immediate consumes a receive on QP 0: keep the queue full. One is posted
// back per immediate handed to the link (poll), so at most kChunkQueue are ever waiting.
ncclResult_t RelayLegComm::activateExtra() {
  for (int i = 0; i < kChunkQueue; ++i) MESH_CHECK(postRecv());
  return ncclSuccess;
}

void RelayLegComm::onCompletion(const ibv_wc& wc) {
  WrId id = decodeWrId(wc.wr_id);
  if (id.kind == WrKind::Ctrl) {
    returnCredits(0);
  } else if (id.kind == WrKind::Recv) {
    chunks_[chunkTail_ % kChunkQueue] = ntohl(wc.imm_data);
    ++chunkTail_;
  }
}

ncclResult_t RelayLegComm::forwardGroup(int slot, uint64_t seq, const FifoSlot* group, int n) {
  MESH_REQUIRE(qps_[0].credits > 0, ncclInternalError, "relay leg: no send credit for a FIFO slot");
  uint64_t seqMark = seq + 1;
  FifoSlot* stage = ctrl()->recv.stage[slot];
  for (int r = 0; r < n; ++r) {
    FifoSlot& s = stage[r];
    s.seqHead = seqMark;
    s.addr = reinterpret_cast<uintptr_t>(ring());
    for (size_t l = 0; l < links_.size(); ++l) s.rkeys[l] = devs_[links_[l].devSlot].ctrlMr->rkey;
    s.size = group[r].size;
    s.tag = group[r].tag;
    s.nreqs = n;
    s.relayRing = relayRingWord(geometry_.depth, geometry_.chunk);
    s.seqTail = seqMark;
  }
  return postCtrlWrite(stage, static_cast<uint32_t>(n * sizeof(FifoSlot)),
                       static_cast<uint64_t>(slot) * sizeof(SendCtrl::fifo[0]), static_cast<uint16_t>(slot));
}

// At most one FIFO copy per slot (kFifoDepth) plus these are in flight; a release waits
// while fewer than kFifoDepth send credits are left, so FIFO copies never run short.
ncclResult_t RelayLegComm::sendReleased(uint64_t released, bool* posted) {
  *posted = false;
  if (qps_[0].credits <= kFifoDepth) return progress();  // the caller retries next round
  *posted = true;
  __atomic_store_n(&ctrl()->releasedStage, released, __ATOMIC_RELAXED);
  return postCtrlWrite(&ctrl()->releasedStage, sizeof(uint64_t), offsetof(SendCtrl, relayReleased), 0);
}

uint64_t RelayLegComm::groupSize(int slot, int entry) const {
  return __atomic_load_n(&ctrl()->recv.sizes[slot][entry], __ATOMIC_RELAXED);
}

// --- RelayFwdComm -----------------------------------------------------------------------------

RelayFwdComm::RelayFwdComm(const Discovery* disc, CommSettings settings) : SendComm(disc, settings) {}

RelayFwdComm::~RelayFwdComm() { close(); }

ncclResult_t RelayFwdComm::registerRing(void* base, size_t bytes) {
  ringBase_ = static_cast<uint8_t*>(base);
  for (int s = 0; s < ndevs_; ++s) {
    const VerbsDevice* d = devs_[s].dev;
    ringMr_[s] = d->api().regMr(d->pd(), base, bytes, IBV_ACCESS_LOCAL_WRITE);
    MESH_REQUIRE(ringMr_[s] != nullptr, ncclSystemError, "registering the %zu-byte relay ring on %s failed: %s",
                 bytes, d->name().c_str(), strerror(errno));
  }
  return ncclSuccess;
}

void RelayFwdComm::releaseExtra() {
  for (int s = 0; s < ndevs_; ++s) {
    if (ringMr_[s] != nullptr && devs_[s].dev->api().deregMr(ringMr_[s]) != 0) {
      MESH_WARN("ibv_dereg_mr (relay ring) on %s failed: %s", devs_[s].dev->name().c_str(), strerror(errno));
    }
    ringMr_[s] = nullptr;
  }
}

const FifoSlot* RelayFwdComm::peekGroup(uint64_t seq, int* n) {
  const FifoSlot* slots = ctrl()->fifo[seq % kFifoDepth];
  if (!fifoSlotArrived(slots[0], seq + 1)) return nullptr;
  int nreqs = slots[0].nreqs;
  if (nreqs < 1 || nreqs > kGroupMax) {
    fail("corrupt FIFO slot from the receiver (nreqs " + std::to_string(nreqs) + ")", ncclRemoteError);
    return nullptr;
  }
  for (int r = 1; r < nreqs; ++r) {
    if (!fifoSlotArrived(slots[r], seq + 1)) return nullptr;
  }
  *n = nreqs;
  return slots;
}

ncclResult_t RelayFwdComm::postOne(int q, ibv_send_wr wr, ibv_sge sge) {
  MESH_REQUIRE(qps_[q].credits > 0, ncclInternalError, "relay hop: send queue full");
  sges_[0] = sge;
  wrs_[0] = wr;
  wrs_[0].sg_list = sge.length > 0 ? &sges_[0] : nullptr;
  wrs_[0].num_sge = sge.length > 0 ? 1 : 0;
  return postBatch(q, 1);
}

ncclResult_t RelayFwdComm::enqueue(const Op& op) {
  MESH_REQUIRE(opTail_ - opHead_ < kOpQueue, ncclInternalError, "relay hop: work queue full");
  ops_[opTail_ % kOpQueue] = op;
  ++opTail_;
  return pump();
}

ncclResult_t RelayFwdComm::beginGroup(int slot, int n, const uint64_t* sizes) {
  if (!relayedSlot(slot)) return ncclSuccess;  // a direct C gets the sizes with the final WRs
  for (int r = 0; r < n; ++r) ctrl()->sizesStage[slot][r] = sizes[r];
  Op op;
  op.kind = Op::Kind::Sizes;
  op.slot = static_cast<uint16_t>(slot);
  op.n = n;
  return enqueue(op);
}

ncclResult_t RelayFwdComm::writeChunk(int slot, int entry, uint64_t off, uint64_t ringOff, uint32_t len) {
  if (off + len > ctrl()->fifo[slot][entry].size) {
    fail("the sender wrote beyond the buffer the receiver posted", ncclRemoteError);
    return failure_;
  }
  Op op;
  op.kind = Op::Kind::Chunk;
  op.slot = static_cast<uint16_t>(slot);
  op.entry = static_cast<uint8_t>(entry);
  op.off = off;
  op.ringOff = ringOff;
  op.len = len;
  return enqueue(op);
}

ncclResult_t RelayFwdComm::finishGroup(int slot, int n, const uint64_t* sizes) {
  for (int r = 0; r < n; ++r) ctrl()->sizesStage[slot][r] = sizes[r];
  Op op;
  op.kind = Op::Kind::Finish;
  op.slot = static_cast<uint16_t>(slot);
  op.n = n;
  return enqueue(op);
}

ncclResult_t RelayFwdComm::pump() {
  while (opHead_ != opTail_ && failure_ == ncclSuccess) {
    bool failed = false;
    if (!postOp(ops_[opHead_ % kOpQueue], &failed)) break;
    if (failed) return failure_ != ncclSuccess ? failure_ : ncclInternalError;
    ++opHead_;
  }
  return failure_;
}

// One queued op. Direct C: chunk WRITEs on QP 0, then what a direct sender's final WRs are
// (comm.h, step 3): the immediate on every QP, the sizes array with QP 0's for a grouped
// receive. Relayed downstream: the sizes WRITE, chunks as WRITE_WITH_IMM into its ring as
// it frees slots, and a 0-byte WRITE_WITH_IMM carrying kRelayLastChunk.
bool RelayFwdComm::postOp(const Op& op, bool* failed) {
  const FifoSlot* slots = ctrl()->fifo[op.slot];
  const Qp& qp0 = qps_[0];
  bool down = relayedSlot(op.slot);
  int need = op.kind == Op::Kind::Finish && !down ? nqps_ : 1;
  for (int q = 0; q < need; ++q) {
    if (qps_[q].credits < 1) return false;
  }
  ibv_sge sge{};
  ibv_send_wr wr{};
  switch (op.kind) {
    case Op::Kind::Sizes:
      sge.addr = reinterpret_cast<uintptr_t>(ctrl()->sizesStage[op.slot]);
      sge.length = static_cast<uint32_t>(op.n * sizeof(uint64_t));
      sge.lkey = devs_[qp0.devSlot].ctrlMr->lkey;
      wr.opcode = IBV_WR_RDMA_WRITE;
      wr.wr.rdma.remote_addr = remoteSizes(qp0.link, op.slot);
      wr.wr.rdma.rkey = links_[qp0.link].remoteRkey;
      wr.wr_id = encodeWrId(WrId{WrKind::Ctrl, 0, op.slot, 0});
      *failed = postOne(0, wr, sge) != ncclSuccess;
      return true;
    case Op::Kind::Chunk: {
      sge.addr = reinterpret_cast<uintptr_t>(ringBase_ + op.ringOff);
      sge.length = op.len;
      sge.lkey = ringMr_[qp0.devSlot]->lkey;
      wr.wr_id = encodeWrId(WrId{WrKind::SendBatch, 0, op.slot, 0});
      if (!down) {
        wr.opcode = IBV_WR_RDMA_WRITE;
        wr.wr.rdma.remote_addr = slots[op.entry].addr + op.off;
        wr.wr.rdma.rkey = slots[op.entry].rkeys[qp0.link];
        *failed = postOne(0, wr, sge) != ncclSuccess;
        return true;
      }
      uint64_t depth = relayRingDepth(slots[0].relayRing);
      uint32_t chunk = relayRingChunk(slots[0].relayRing);
      if (op.len > chunk || depth == 0) {
        fail("the next relay's NCCL_MESH_RELAY_CHUNK is smaller than ours (set it the same on every node)",
             ncclInvalidUsage);
        *failed = true;
        return true;
      }
      if (downPosted_ - __atomic_load_n(&ctrl()->relayReleased, __ATOMIC_ACQUIRE) >= depth) return false;
      wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
      wr.imm_data = htonl(op.len);
      wr.wr.rdma.remote_addr = slots[0].addr + (downPosted_ % depth) * chunk;
      wr.wr.rdma.rkey = slots[0].rkeys[qp0.link];
      ++downPosted_;
      *failed = postOne(0, wr, sge) != ncclSuccess;
      return true;
    }
    case Op::Kind::Finish:
      break;
  }
  if (down) {
    wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    wr.imm_data = htonl(kRelayLastChunk);
    wr.wr.rdma.remote_addr = slots[0].addr;
    wr.wr.rdma.rkey = slots[0].rkeys[qp0.link];
    wr.wr_id = encodeWrId(WrId{WrKind::SendFinal, 0, op.slot, 0});
    *failed = postOne(0, wr, sge) != ncclSuccess;
    return true;
  }
  bool viaSizes = sizesViaArray(op.n, ctrl()->sizesStage[op.slot][0]);
  for (int q = 0; q < nqps_; ++q) {
    const Qp& qp = qps_[q];
    sge = ibv_sge();
    wr = ibv_send_wr();
    wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    wr.wr.rdma.remote_addr = slots[0].addr;
    wr.wr.rdma.rkey = slots[0].rkeys[qp.link];
    if (viaSizes && q == 0) {
      sge.addr = reinterpret_cast<uintptr_t>(ctrl()->sizesStage[op.slot]);
      sge.length = static_cast<uint32_t>(op.n * sizeof(uint64_t));
      sge.lkey = devs_[qp.devSlot].ctrlMr->lkey;
      wr.wr.rdma.remote_addr = remoteSizes(qp.link, op.slot);
      wr.wr.rdma.rkey = links_[qp.link].remoteRkey;
    }
    wr.imm_data = htonl(viaSizes ? kImmViaSizes : static_cast<uint32_t>(ctrl()->sizesStage[op.slot][0]));
    wr.wr_id = encodeWrId(WrId{WrKind::SendFinal, static_cast<uint8_t>(q), op.slot, 0});
    if (postOne(q, wr, sge) != ncclSuccess) {
      *failed = true;
      return true;
    }
  }
  return true;
}

bool RelayFwdComm::idle() const {
  if (opHead_ != opTail_) return false;
  for (int q = 0; q < nqps_; ++q) {
    if (qps_[q].credits != kSendQueueDepth) return false;
  }
  return true;
}

// Every WR is signaled (postOne posts batches of one); chunk WRITEs on QP 0 complete in
// order, so their count is the number of ring slots free again.
void RelayFwdComm::onCompletion(const ibv_wc& wc) {
  WrId id = decodeWrId(wc.wr_id);
  if (id.qp >= nqps_) return;
  returnCredits(id.qp);
  if (id.kind == WrKind::SendBatch && id.qp == 0) ++released_;
}

// --- RelayLink --------------------------------------------------------------------------------

RelayLink::RelayLink(std::unique_ptr<RelayLegComm> leg, std::unique_ptr<RelayFwdComm> fwd, std::string name)
    : leg_(std::move(leg)), fwd_(std::move(fwd)), name_(std::move(name)) {}

// The hop first: its WRs read the leg's ring.
RelayLink::~RelayLink() {
  fwd_.reset();
  leg_.reset();
}

std::string RelayLink::failureText() const {
  if (!error_.empty()) return error_;
  if (leg_->failure() != ncclSuccess) return "leg from the sender: " + leg_->failureText();
  if (fwd_->failure() != ncclSuccess) return "hop to the receiver: " + fwd_->failureText();
  return "closed";
}

ncclResult_t RelayLink::step(bool* active) {
  *active = false;
  MESH_CHECK(fwd_->pollCompletions());
  MESH_CHECK(fwd_->pump());  // a relayed downstream frees ring slots by remote write
  // C's receives, as they are posted, to A.
  while (forwardSeq_ - dataSeq_ < static_cast<uint64_t>(kFifoDepth)) {
    int n = 0;
    const FifoSlot* group = fwd_->peekGroup(forwardSeq_, &n);
    MESH_CHECK(fwd_->failure());
    if (group == nullptr) break;
    MESH_CHECK(leg_->forwardGroup(static_cast<int>(forwardSeq_ % kFifoDepth), forwardSeq_, group, n));
    ++forwardSeq_;
    *active = true;
  }
  MESH_CHECK(leg_->poll([&](uint32_t imm) {
    *active = true;
    return onChunk(imm);
  }));
  if (fwd_->released() > releasedSent_) {
    uint64_t released = fwd_->released();
    bool posted = false;
    MESH_CHECK(leg_->sendReleased(released, &posted));
    if (posted) releasedSent_ = released;
    *active = true;
  }
  // An end that closed its control socket without an error closed its comm (or exited).
  // A's sends completed only once their chunks were in our ring, so what A sent is still
  // delivered before the link ends; when C closed there is nobody left to deliver to.
  auto closedClean = [](const PreparedConn& c) {
    return c.control != nullptr && c.control->closed.load(std::memory_order_acquire) &&
           c.control->error.load(std::memory_order_relaxed) == 0;
  };
  if (closedClean(*fwd_)) {
    closedCleanly_ = true;
    error_ = "the receiver closed the connection";
    return ncclRemoteError;
  }
  if (closedClean(*leg_)) {
    if (!draining_) {
      draining_ = true;
      *active = true;  // one more round: completions the close overtook
      return ncclSuccess;
    }
    if (!*active && ringRecv_ == fwd_->released() && !haveSizes_ && fwd_->idle()) {
      closedCleanly_ = true;
      error_ = "the sender closed the connection";
      return ncclRemoteError;
    }
    return fwd_->checkAlive("while relaying");
  }
  MESH_CHECK(leg_->checkAlive("while relaying"));
  return fwd_->checkAlive("while relaying");
}

ncclResult_t RelayLink::onChunk(uint32_t imm) {
  int slot = static_cast<int>(dataSeq_ % kFifoDepth);
  if (dataSeq_ >= forwardSeq_) {
    error_ = "the sender wrote a chunk for a receive that was never posted";
    return ncclRemoteError;
  }
  const FifoSlot* posted = fwd_->peekGroup(dataSeq_, &n_);
  if (posted == nullptr) {
    error_ = "the receiver's FIFO slot changed under a group in flight";
    return ncclRemoteError;
  }
  if (!haveSizes_) {
    for (int r = 0; r < n_; ++r) {
      sizes_[r] = leg_->groupSize(slot, r);
      if (sizes_[r] > posted[r].size) {
        error_ = "the sender's size " + std::to_string(sizes_[r]) + " exceeds the " + std::to_string(posted[r].size) +
                 " bytes the receiver posted";
        return ncclRemoteError;
      }
    }
    entry_ = 0;
    off_ = 0;
    haveSizes_ = true;
    MESH_CHECK(fwd_->beginGroup(slot, n_, sizes_));
  }
  uint32_t len = imm & ~kRelayLastChunk;
  if (len > 0) {
    while (entry_ < n_ && off_ >= sizes_[entry_]) {
      ++entry_;
      off_ = 0;
    }
    if (entry_ >= n_ || off_ + len > sizes_[entry_] || len > leg_->geometry().chunk) {
      error_ = "the sender wrote more bytes than its sizes announced";
      return ncclRemoteError;
    }
    uint64_t ringOff = (ringRecv_ % leg_->geometry().depth) * uint64_t{leg_->geometry().chunk};
    MESH_CHECK(fwd_->writeChunk(slot, entry_, off_, ringOff, len));
    ++ringRecv_;
    off_ += len;
    bytes_ += len;
  }
  if ((imm & kRelayLastChunk) != 0) {
    // Every announced byte must have come.
    while (entry_ < n_ && off_ >= sizes_[entry_]) {
      ++entry_;
      off_ = 0;
    }
    if (entry_ != n_) {
      error_ = "the sender ended a group before all its bytes came";
      return ncclRemoteError;
    }
    MESH_CHECK(fwd_->finishGroup(slot, n_, sizes_));
    ++dataSeq_;
    haveSizes_ = false;
  }
  return ncclSuccess;
}

}  // namespace mesh
