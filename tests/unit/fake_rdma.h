// SPDX-License-Identifier: Apache-2.0
// A userspace stand-in for RDMA devices and the wire between them, for unit tests that run
// the FIFO engine (SendComm/RecvComm) of two ends in one process, with no RDMA.
//
// Control calls (device, PD, CQ, QP, MR) come through a VerbsApi table; data-path calls
// (post_send, post_recv, poll_cq) through a DataOps table (mesh/datapath/data_ops.h). A QP connects
// to the QP whose number it was given at RTR, as with RC. Posted work requests are queued
// per QP and executed only when the test says so (step/run), in order on one QP and in any
// order across QPs, as a real fabric may:
//  - RDMA WRITE copies the local SGE into the remote range after checking both keys and
//    bounds (a range outside the rkey's MR is a remote access error: the sender's WR
//    completes with IBV_WC_REM_ACCESS_ERR and its QP goes to ERR, as on hardware);
//  - WRITE_WITH_IMM additionally consumes the peer QP's oldest receive WR and completes it
//    with the immediate (no receive posted: the WR waits, as with RNR retry 7);
//  - RDMA READ copies the remote range into the local SGE;
//  - a signaled WR completes on its QP's CQ once executed; a QP moved to ERR completes
//    everything still queued as flushed (IBV_WC_WR_FLUSH_ERR), signaled or not.
// splitNextWrite() tears one queued WRITE in two (a slot that lands half now, half later).
//
// Every create/modify-to-ERR/destroy/dereg/dealloc/close is appended to events(), so a test
// can check the teardown order. One FakeRdma exists at a time (the tables are plain
// function pointers); the constructor installs it, the destructor removes it.
#pragma once

#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "mesh/datapath/data_ops.h"
#include "mesh/platform/verbs_loader.h"

namespace mesh {
namespace fake {

class FakeRdma {
 public:
  FakeRdma();
  ~FakeRdma();
  FakeRdma(const FakeRdma&) = delete;
  FakeRdma& operator=(const FakeRdma&) = delete;

  const VerbsApi* api() const { return &api_; }
  const DataOps* ops() const { return &ops_; }

  // A device as ibv_open_device would return it (closed through api()->closeDevice).
  ibv_context* openDevice(const std::string& name);
  const std::string& deviceOf(const ibv_context* ctx) const;

  // --- the wire ---
  size_t queued() const;  // WRs posted and not yet executed, over all QPs
  // Executes the oldest queued WR of QP `qpn`; false when it has none or it must wait for
  // a receive WR on the far side.
  bool step(uint32_t qpn);
  // Executes WRs until none can run (or `maxSteps`); with `rng`, each step picks a random
  // QP among those that can run, else QPs are served in creation order. Returns the steps.
  size_t run(std::mt19937* rng = nullptr, size_t maxSteps = SIZE_MAX);
  // The next queued WR of `qpn` (which must be an RDMA WRITE of more than `firstBytes`) is
  // replaced by two writes: its first `firstBytes` bytes, then the rest with the original
  // WR's immediate, signaling and wr_id.
  void splitNextWrite(uint32_t qpn, size_t firstBytes);

  // --- the GID table (port 1 of each device; empty: every index reads as zeros) ---
  void setGid(const std::string& device, int index, const uint8_t gid[16], bool rocev2);
  void clearGid(const std::string& device, int index);

  // --- ECE (ibv_query_ece / ibv_set_ece; a device without it answers EOPNOTSUPP, as rxe) ---
  // QPs on `device` offer `vendor`/`caps`; after a set and RTR they use the set options AND
  // caps (what they settled on). A set naming another vendor is EINVAL; `setErrno` != 0 makes
  // every set fail with it.
  void enableEce(const std::string& device, uint32_t vendor, uint32_t caps, int setErrno = 0);
  // The options QP `qpn` was set to when it moved to RTR (AND the device's caps), -1 if none.
  int64_t eceAtRtr(uint32_t qpn) const;
  int eceSets(uint32_t qpn) const;  // ibv_set_ece calls on the QP

  // --- inspection ---
  const std::vector<std::string>& events() const { return events_; }
  void clearEvents() { events_.clear(); }
  // Index of the first event starting with `prefix`, or -1.
  int eventIndex(const std::string& prefix) const;
  std::vector<uint32_t> qpns() const;              // live QPs, creation order
  std::vector<uint32_t> qpnsOn(const std::string& device) const;
  uint32_t destQpn(uint32_t qpn) const;            // the QP it was connected to at RTR
  int trafficClass(uint32_t qpn) const;            // GRH traffic class set at RTR, -1 if none
  int serviceLevel(uint32_t qpn) const;
  int readsExecuted(const std::string& device) const;  // RDMA READs run by QPs on `device`
  // Bytes QP `qpn` has written (RDMA WRITE and WRITE_WITH_IMM) so far.
  uint64_t bytesWritten(uint32_t qpn) const {
    auto it = written_.find(qpn);
    return it == written_.end() ? 0 : it->second;
  }
  // Send WRs posted on QP `qpn` so far, and how many of them were signaled.
  uint64_t sendsPosted(uint32_t qpn) const {
    auto it = posted_.find(qpn);
    return it == posted_.end() ? 0 : it->second;
  }
  uint64_t polls() const { return polls_; }  // ibv_poll_cq calls, every CQ
  uint64_t signaledPosted(uint32_t qpn) const {
    auto it = signaledPosted_.find(qpn);
    return it == signaledPosted_.end() ? 0 : it->second;
  }
  // Completions of QP `qpn` still unpolled in any CQ when it was destroyed (its flushed work
  // never drained), or -1 while it lives or never existed.
  int unpolledAtDestroy(uint32_t qpn) const {
    auto it = unpolledAtDestroy_.find(qpn);
    return it == unpolledAtDestroy_.end() ? -1 : it->second;
  }
  const std::map<uint32_t, int>& unpolledAtDestroyAll() const { return unpolledAtDestroy_; }
  size_t liveQps() const;
  size_t liveCqs() const;
  size_t liveMrs() const;
  size_t livePds() const;
  // The QP moved to ERR by the wire after a bad WR, with the WR's status; -1 when none.
  int lastErrorStatus() const { return lastErrorStatus_; }

  // --- implementation (the C-style verbs entry points reach these) ---
  struct Wr {
    uint64_t wrId = 0;
    ibv_wr_opcode opcode = IBV_WR_RDMA_WRITE;
    bool signaled = false;
    uint32_t immData = 0;
    uint64_t remoteAddr = 0;
    uint32_t rkey = 0;
    std::vector<ibv_sge> sges;
  };
  struct Qp {
    ibv_qp qp{};
    std::string device;
    int port = 1;
    int state = IBV_QPS_RESET;
    uint32_t dest = 0;
    int trafficClass = -1;
    int serviceLevel = -1;
    bool eceSet = false;
    uint32_t eceOptions = 0;
    int eceSets = 0;
    int64_t eceAtRtr = -1;
    std::deque<Wr> sq;
    std::deque<uint64_t> rq;
    int maxSend = 0, maxRecv = 0;
  };
  struct Cq {
    ibv_cq cq{};
    std::deque<ibv_wc> wcs;
  };
  struct Mr {
    ibv_mr mr{};
    std::string device;
  };
  struct Device {
    ibv_context ctx{};
    std::string name;
    std::vector<std::unique_ptr<ibv_pd>> pds;
    std::map<int, ibv_gid_entry> gids;  // by index
  };
  Device* deviceByContext(ibv_context* ctx);
  static constexpr int kGidTableLen = 16;
  int gidTableLen = kGidTableLen;  // what query_port reports (rxe: 1024, mlx5 RoCE: 255)
  // >= 0: the next ibv_post_send takes this many WRs of its chain, then refuses the rest
  // (bad_wr at the first refused one, EINVAL), as a provider does with a WR it cannot take.
  int postAcceptsThenRefuses = -1;

  Qp* qpOf(const ibv_qp* qp);
  Qp* qpByNumber(uint32_t qpn);
  Cq* cqOf(const ibv_cq* cq);
  const Mr* mrByKey(uint32_t key, bool remote) const;
  void event(const std::string& text) { events_.push_back(text); }
  void toError(Qp* q);
  void complete(Qp* q, const Wr& wr, ibv_wc_status status);

  std::map<ibv_context*, std::unique_ptr<Device>> devices_;
  std::map<uint32_t, std::unique_ptr<Qp>> qps_;   // by QPN
  std::map<ibv_cq*, std::unique_ptr<Cq>> cqs_;
  std::map<uint32_t, std::unique_ptr<Mr>> mrs_;   // by lkey
  struct EceDevice {
    uint32_t vendor = 0;
    uint32_t caps = 0;
    int setErrno = 0;
  };
  std::map<std::string, EceDevice> ece_;  // by device name
  std::map<std::string, int> reads_;
  std::map<uint32_t, uint64_t> written_;
  std::map<uint32_t, uint64_t> posted_, signaledPosted_;
  std::map<uint32_t, int> unpolledAtDestroy_;
  std::vector<std::string> events_;
  uint32_t nextQpn_ = 0x100;
  uint32_t nextKey_ = 0x10;
  int lastErrorStatus_ = -1;
  uint64_t polls_ = 0;

 private:
  bool canRun(const Qp& q) const;
  bool execute(Qp* q);
  bool copyIn(const Wr& wr, uint8_t** remote, const Mr** rmr, size_t len) const;

  VerbsApi api_;
  DataOps ops_{};
};

// Registers [addr, addr+len) on a device of the fake (as ibv_reg_mr would); the MR is
// deregistered with api()->deregMr.
ibv_mr* registerMemory(FakeRdma& fake, ibv_pd* pd, void* addr, size_t len);

}  // namespace fake
}  // namespace mesh
