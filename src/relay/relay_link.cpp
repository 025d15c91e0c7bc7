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

ncclResult_t RelayLegComm::postRecv(int q) {
  ibv_recv_wr wr{};
  wr.wr_id = encodeWrId(WrId{WrKind::Recv, static_cast<uint8_t>(q), 0, 0});
  ibv_recv_wr* bad = nullptr;
  int rc = settings_.ops->postRecv(qps_[q].qp.get(), &wr, &bad);
  if (rc != 0) fail(std::string("ibv_post_recv on the relay leg failed: ") + strerror(rc), ncclSystemError);
  return failure_;
}

// Every ticket's immediate consumes a receive on the QP it came on, and any QP may carry
// every ticket in flight (at most the ring's depth): keep kChunkQueue posted on each. One is
// posted back on its QP per ticket handed to the link (poll).
ncclResult_t RelayLegComm::activateExtra() {
  if (geometry_.depth < 1 || geometry_.depth > static_cast<uint32_t>(kRelayMaxDepth)) {
    fail("relay ring depth " + std::to_string(geometry_.depth) + " outside 1.." + std::to_string(kRelayMaxDepth),
         ncclInvalidUsage);
    return failure_;
  }
  for (int q = 0; q < nqps_; ++q) {
    for (int i = 0; i < kChunkQueue; ++i) MESH_CHECK(postRecv(q));
  }
  return ncclSuccess;
}

// A ticket may land before an earlier one (another QP); it waits in arrived_ until every
// earlier one was handed over. One that is not within the ring's depth of the next one to
// hand over, or that landed twice, breaks the protocol.
void RelayLegComm::onCompletion(const ibv_wc& wc) {
  WrId id = decodeWrId(wc.wr_id);
  if (id.kind == WrKind::Ctrl) {
    returnCredits(0);
  } else if (id.kind == WrKind::Recv) {
    uint32_t imm = ntohl(wc.imm_data);
    uint64_t ticket = relayTicket(imm, next_);
    Arrival& a = arrived_[ticket % kRelayMaxDepth];
    if (ticket - next_ >= geometry_.depth || a.valid) {
      fail("the sender wrote ticket " + std::to_string(ticket) + " into the relay ring while ticket " +
               std::to_string(next_) + " was the oldest expected (ring depth " + std::to_string(geometry_.depth) +
               ")",
           ncclRemoteError);
      return;
    }
    a.valid = true;
    a.qp = id.qp;
    a.imm = imm;
    // The relay's counters are exact: every ticket is counted on the QP it landed on.
    stats::add(&linkStats_[qps_[id.qp % kMaxQps].link]->rxBytes, wc.byte_len);
    stats::add(&flowStats_->rxBytes, wc.byte_len);
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

ncclResult_t RelayFwdComm::registerRing(void* base, size_t bytes, uint32_t chunk) {
  ringBase_ = static_cast<uint8_t*>(base);
  chunk_ = chunk;
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
    int rc = ringMr_[s] != nullptr ? devs_[s].dev->api().deregMr(ringMr_[s]) : 0;  // the error, not errno
    if (rc != 0) MESH_WARN("ibv_dereg_mr (relay ring) on %s failed: %s", devs_[s].dev->name().c_str(), strerror(rc));
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
  for (int r = 0; r < n; ++r) ctrl()->sizesStage[slot][r] = sizes[r];
  // A direct C gets the sizes with the final WRs; a relayed one before the first ticket.
  sizesDue_[slot] = relayedSlot(slot) ? n : 0;
  return ncclSuccess;
}

ncclResult_t RelayFwdComm::writeChunk(int slot, int entry, uint64_t off, uint64_t ringOff, uint32_t len,
                                      uint64_t ticket, bool last) {
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
  op.ticket = ticket;
  op.last = last;
  return enqueue(op);
}

ncclResult_t RelayFwdComm::finishGroup(int slot, int n, const uint64_t* sizes, bool hadBytes) {
  for (int r = 0; r < n; ++r) ctrl()->sizesStage[slot][r] = sizes[r];
  Op op;
  op.kind = Op::Kind::Finish;
  op.slot = static_cast<uint16_t>(slot);
  op.n = n;
  op.last = hadBytes;
  return enqueue(op);
}

// Leg tickets are freed in ticket order: released_ moves over every ticket done so far.
void RelayFwdComm::ticketDone(uint64_t ticket) {
  done_[ticket % kRelayMaxDepth] = true;
  while (done_[released_ % kRelayMaxDepth]) {
    done_[released_ % kRelayMaxDepth] = false;
    ++released_;
  }
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

bool RelayFwdComm::postDownTicket(const Op& op, bool noData, bool* failed) {
  const FifoSlot* slots = ctrl()->fifo[op.slot];
  uint64_t depth = relayRingDepth(slots[0].relayRing);
  uint32_t chunk = relayRingChunk(slots[0].relayRing);
  if (depth == 0 || depth > static_cast<uint64_t>(kRelayMaxDepth) || chunk != chunk_) {
    fail("the next relay's staging ring (NCCL_MESH_RELAY_CHUNK " + std::to_string(chunk) + ", depth " +
             std::to_string(depth) + ") does not take this relay's pieces of " + std::to_string(chunk_) +
             " bytes: set NCCL_MESH_RELAY_CHUNK the same on every node",
         ncclInvalidUsage);
    *failed = true;
    return true;
  }
  if (downPosted_ - __atomic_load_n(&ctrl()->relayReleased, __ATOMIC_ACQUIRE) >= depth) return false;
  int sizes = sizesDue_[op.slot];  // the group's entry count while its sizes are due
  int q = pickRelayQp(downPosted_, sizes > 0 ? 2 : 1);
  if (q < 0) return false;
  const Qp& qp = qps_[q];
  int count = 0;
  if (sizes > 0) {
    ibv_sge& sge = sges_[count];
    ibv_send_wr& wr = wrs_[count++];
    sge = ibv_sge{reinterpret_cast<uintptr_t>(ctrl()->sizesStage[op.slot]),
                  static_cast<uint32_t>(sizes * sizeof(uint64_t)), devs_[qp.devSlot].ctrlMr->lkey};
    wr = ibv_send_wr();
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.wr.rdma.remote_addr = remoteSizes(qp.link, op.slot);
    wr.wr.rdma.rkey = links_[qp.link].remoteRkey;
  }
  ibv_sge& sge = sges_[count];
  ibv_send_wr& wr = wrs_[count++];
  wr = ibv_send_wr();
  sge = ibv_sge{reinterpret_cast<uintptr_t>(ringBase_ + op.ringOff), op.len,
                noData ? 0u : ringMr_[qp.devSlot]->lkey};
  wr.sg_list = noData ? nullptr : &sge;
  wr.num_sge = noData ? 0 : 1;
  wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
  wr.imm_data = htonl(relayImm(downPosted_, noData || op.last, noData));
  wr.wr.rdma.remote_addr = slots[0].addr + (downPosted_ % depth) * chunk;
  wr.wr.rdma.rkey = slots[0].rkeys[qp.link];
  // A piece's completion frees its leg ticket; the no-data ticket's needs nothing.
  wr.wr_id = noData ? encodeWrId(WrId{WrKind::SendFinal, static_cast<uint8_t>(q), op.slot, 0})
                    : encodeWrId(WrId{WrKind::SendBatch, static_cast<uint8_t>(q),
                                      static_cast<uint16_t>(op.ticket % kRelayMaxDepth), 0});
  ++downPosted_;
  sizesDue_[op.slot] = 0;
  *failed = postBatch(q, count) != ncclSuccess;
  if (!noData) stats::add(&flowStats_->txBytes, op.len);
  return true;
}

// One queued op. Direct C: each piece a WRITE on the hop's QPs (pickRelayQp: the piece count
// picks the QP unless it is busier, so every link of the hop carries its share), then what a
// direct sender's final WRs are (comm.h, step 3): the immediate on every QP after its
// pieces, the sizes array with QP 0's for a grouped receive. Relayed downstream: every
// piece a ticket into its ring (postDownTicket), the group's last one marked, or one no-data
// ticket for a group without bytes.
bool RelayFwdComm::postOp(const Op& op, bool* failed) {
  const FifoSlot* slots = ctrl()->fifo[op.slot];
  bool down = relayedSlot(op.slot);
  if (down) {
    if (op.kind == Op::Kind::Chunk) return postDownTicket(op, false, failed);
    if (op.last) return true;  // its last piece carried kRelayLast
    return postDownTicket(op, true, failed);
  }
  ibv_sge sge{};
  ibv_send_wr wr{};
  if (op.kind == Op::Kind::Chunk) {
    int q = pickRelayQp(hopPieces_, 1);
    if (q < 0) return false;
    const Qp& qp = qps_[q];
    sge.addr = reinterpret_cast<uintptr_t>(ringBase_ + op.ringOff);
    sge.length = op.len;
    sge.lkey = ringMr_[qp.devSlot]->lkey;
    wr.wr_id = encodeWrId(WrId{WrKind::SendBatch, static_cast<uint8_t>(q),
                               static_cast<uint16_t>(op.ticket % kRelayMaxDepth), 0});
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.wr.rdma.remote_addr = slots[op.entry].addr + op.off;
    wr.wr.rdma.rkey = slots[op.entry].rkeys[qp.link];
    ++hopPieces_;
    *failed = postOne(q, wr, sge) != ncclSuccess;
    stats::add(&flowStats_->txBytes, op.len);
    return true;
  }
  for (int q = 0; q < nqps_; ++q) {
    if (qps_[q].credits < 1) return false;
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

// Every batch is signaled (a piece, or the sizes and a piece); a piece's completion, on
// whichever QP, frees its leg ticket (in ticket order: ticketDone).
void RelayFwdComm::onCompletion(const ibv_wc& wc) {
  WrId id = decodeWrId(wc.wr_id);
  if (id.qp >= nqps_) return;
  returnCredits(id.qp);
  if (id.kind == WrKind::SendBatch) ticketDone(id.index);  // ticket % kRelayMaxDepth is all it needs
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

namespace {

enum class EndState { Open, Closed, Failed };

// One reading of an end's control link (written by the reactor thread: error, then closed).
EndState endState(const PreparedConn& c) {
  if (c.control == nullptr || !c.control->closed.load(std::memory_order_acquire)) return EndState::Open;
  return c.control->error.load(std::memory_order_relaxed) == 0 ? EndState::Closed : EndState::Failed;
}

}  // namespace

ncclResult_t RelayLink::step(bool* active) {
  *active = false;
  if (receiverGone_) {
    // C closed: nothing more to deliver, but A's last WRs (every other QP's 0-byte
    // SendFinal, comm.h) may still be on their way into our leg; its QPs stay up so our NIC
    // acknowledges them, until A closes or receiverGoneGraceMs_ has passed.
    EndState sender = endState(*leg_);
    auto waited = std::chrono::steady_clock::now() - receiverGoneAt_;
    if (sender == EndState::Open && waited < std::chrono::milliseconds(receiverGoneGraceMs_)) return ncclSuccess;
    closedCleanly_ = true;
    error_ = "the receiver closed the connection";
    return ncclRemoteError;
  }
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
  MESH_CHECK(leg_->poll([&](uint32_t imm, uint64_t ticket) {
    *active = true;
    return onTicket(imm, ticket);
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
  // Each end's state is read once per round (endState): the reactor thread closes a control
  // link at any moment, and a round that read "open" and then "closed" took a clean close
  // for a failure and cut the link with A's bytes undelivered (issue 31).
  EndState receiver = endState(*fwd_);
  EndState sender = endState(*leg_);
  if (receiver == EndState::Closed) {
    receiverGone_ = true;
    receiverGoneAt_ = std::chrono::steady_clock::now();
    *active = true;
    return ncclSuccess;
  }
  if (sender == EndState::Closed) {
    auto now = std::chrono::steady_clock::now();
    if (!draining_) {
      draining_ = true;
      drainQuietSince_ = now;
      *active = true;  // one more round: completions the close overtook
      return ncclSuccess;
    }
    if (*active) drainQuietSince_ = now;
    if (!*active && leg_->ticketsTaken() == fwd_->released() && !haveSizes_ && fwd_->idle()) {
      closedCleanly_ = true;
      error_ = "the sender closed the connection";
      return ncclRemoteError;
    }
    // A closes its comm cleanly only once its sends completed, that is once their pieces are
    // in our ring; a group still short of pieces after the grace never gets them (A was killed
    // or aborted mid-message). Nobody else would end the link: C's receive would wait forever.
    if (haveSizes_ && now - drainQuietSince_ >= std::chrono::milliseconds(senderGoneGraceMs_)) {
      error_ = "the sender closed the connection in the middle of a message (" + std::to_string(bytesLeft_) +
               " of its bytes never arrived)";
      return ncclRemoteError;
    }
  }
  // A failed end: checkAlive names why (closed and its error are set once, never undone).
  if (sender == EndState::Failed) return leg_->checkAlive("while relaying");
  if (receiver == EndState::Failed) return fwd_->checkAlive("while relaying");
  return ncclSuccess;
}

// Tickets come here in order. The group's pieces are the entries' bytes cut into chunk-sized
// pieces in order, as the sender cut them (comm.h), so each data ticket's entry, offset and
// length follow from the sizes; a ticket that does not fit them breaks the protocol.
ncclResult_t RelayLink::onTicket(uint32_t imm, uint64_t ticket) {
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
  const uint32_t chunk = leg_->geometry().chunk;
  auto skipFinished = [&] {
    while (entry_ < n_ && off_ >= sizes_[entry_]) {
      ++entry_;
      off_ = 0;
    }
  };
  if (!haveSizes_) {
    bytesLeft_ = 0;
    for (int r = 0; r < n_; ++r) {
      sizes_[r] = leg_->groupSize(slot, r);
      if (sizes_[r] > posted[r].size) {
        error_ = "the sender's size " + std::to_string(sizes_[r]) + " exceeds the " + std::to_string(posted[r].size) +
                 " bytes the receiver posted";
        return ncclRemoteError;
      }
      bytesLeft_ += sizes_[r];
    }
    entry_ = 0;
    off_ = 0;
    haveSizes_ = true;
    MESH_CHECK(fwd_->beginGroup(slot, n_, sizes_));
  }
  bool last = (imm & kRelayLast) != 0;
  bool hadBytes = bytesLeft_ > 0 || off_ > 0 || entry_ > 0;
  if ((imm & kRelayNoData) != 0) {
    if (!last || bytesLeft_ > 0) {
      error_ = "the sender ended a group before all its bytes came";
      return ncclRemoteError;
    }
    fwd_->ticketDone(ticket);
  } else {
    skipFinished();
    if (entry_ >= n_) {
      error_ = "the sender wrote more bytes than its sizes announced";
      return ncclRemoteError;
    }
    uint32_t len = static_cast<uint32_t>(relayPieceBytes(sizes_[entry_], off_, chunk));
    bytesLeft_ -= len;
    if (last != (bytesLeft_ == 0)) {
      error_ = last ? "the sender ended a group before all its bytes came"
                    : "the sender's pieces do not match the sizes it announced";
      return ncclRemoteError;
    }
    uint64_t ringOff = (ticket % leg_->geometry().depth) * uint64_t{chunk};
    MESH_CHECK(fwd_->writeChunk(slot, entry_, off_, ringOff, len, ticket, last));
    off_ += len;
    bytes_ += len;
  }
  if (last) {
    MESH_CHECK(fwd_->finishGroup(slot, n_, sizes_, hadBytes));
    ++dataSeq_;
    haveSizes_ = false;
  }
  return ncclSuccess;
}

}  // namespace mesh
