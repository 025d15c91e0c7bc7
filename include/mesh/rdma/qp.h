// SPDX-License-Identifier: Apache-2.0
// QP lifecycle: RC queue pairs and completion queues, owned by RAII wrappers, moved
// RESET→INIT→RTR→RTS by one function per state change, each driven by an attribute struct
// with an explicit mask. Teardown is ERR → (caller drains the CQ) → destroy, best-effort:
// a failing step is logged and the rest still runs.
#pragma once

#include <cstdint>
#include <string>

#include "err.h"
#include "mesh/platform/verbs_loader.h"

namespace mesh {

class VerbsDevice;

// Completion queue. Not copyable; destroyed (with a logged failure if any) by the owner.
class CompletionQueue {
 public:
  CompletionQueue() = default;
  ~CompletionQueue();
  CompletionQueue(const CompletionQueue&) = delete;
  CompletionQueue& operator=(const CompletionQueue&) = delete;

  // `context`: the CQ's cq_context (the comm that owns it, for IBV_EVENT_CQ_ERR). Fails when
  // the device cannot hold `entries`: a CQ sized never to overflow must not be cut.
  ncclResult_t create(const VerbsDevice* dev, int entries, void* context = nullptr);
  ibv_cq* get() const { return cq_; }
  int entries() const { return entries_; }
  void reset();

 private:
  const VerbsDevice* dev_ = nullptr;
  ibv_cq* cq_ = nullptr;
  int entries_ = 0;
};

struct QpCaps {
  int maxSendWr = 64;
  int maxRecvWr = 64;
};

// What RTR needs to know about the remote end (and which local GID to send from).
struct QpRemote {
  uint32_t qpn = 0;
  uint32_t psn = 0;
  uint8_t gid[16] = {};
  int localGidIndex = 0;
  int mtu = 0;  // enum ibv_mtu: min of both ends' active MTU
};

// The path MTU both ends agree on: the smaller of the two (enum ibv_mtu values).
int negotiatedMtu(int localMtu, int peerMtu);
// For the connection's INFO line: "" when both ends offer the same MTU, else
// " peer_mtu=1024 (differs from ours, 4096: the smaller is used; ...)". Pure.
std::string peerMtuNote(int localMtu, int peerMtu);

// Enhanced Connection Establishment (rdma-core 31+, IBVERBS_1.10; mlx5 negotiates features
// such as selective repeat with it): a provider's options for one QP. NCCL's IB transport
// (NCCL_IB_ECE_ENABLE, default 1) has the connector query its QPs and send the result, the
// acceptor set it before RTR and query the reduced options after, and the connector set
// those before its own RTR. comp_mask is always 0 in every provider so far.
struct Ece {
  uint32_t vendorId = 0;
  uint32_t options = 0;
};
enum class EceResult { Ok, Unsupported, Failed };
// "0x15b3:0x30000001": the one form the conn line and nccl-mesh-info show.
std::string eceText(const Ece& ece);

// Transport settings for RTR/RTS (from NCCL_MESH_IB_*).
struct QpTuning {
  int timeout = 20;
  int retryCnt = 7;
  int rnrRetry = 7;
  int trafficClass = 0;
  int serviceLevel = 0;
};

class QueuePair {
 public:
  QueuePair() = default;
  ~QueuePair();
  QueuePair(const QueuePair&) = delete;
  QueuePair& operator=(const QueuePair&) = delete;

  // RESET: creates the RC QP on `port` of dev with send and receive completions on cq.
  // `owner` is stored as the QP's context so async events can find the comm.
  ncclResult_t create(const VerbsDevice* dev, int port, ibv_cq* cq, const QpCaps& caps,
                      void* owner = nullptr);
  ncclResult_t toInit();
  ncclResult_t toRtr(const QpRemote& remote, const QpTuning& tuning);
  ncclResult_t toRts(const QpTuning& tuning);
  // ECE: Unsupported when rdma-core lacks the call or the provider answers EOPNOTSUPP /
  // ENOTSUP (rxe, siw: no ECE); Failed (logged) on any other error, as NCCL fails the
  // connection there. A comp_mask the wire cannot carry counts as Unsupported (logged).
  EceResult queryEce(Ece* out) const;
  EceResult setEce(const Ece& ece);  // before RTR
  // Moves to ERR so outstanding work requests flush; logged, never fails the caller.
  void toError();
  void reset();  // destroys the QP (call after draining its CQ)

  ibv_qp* get() const { return qp_; }
  uint32_t qpn() const { return qp_ != nullptr ? qp_->qp_num : 0; }
  uint32_t psn() const { return psn_; }
  int port() const { return port_; }
  const std::string& deviceName() const;

 private:
  ncclResult_t modify(ibv_qp_attr* attr, int mask, const char* step);

  const VerbsDevice* dev_ = nullptr;
  ibv_qp* qp_ = nullptr;
  int port_ = 1;
  uint32_t psn_ = 0;  // our send PSN, random 24-bit
  QpRemote remote_;   // kept for error logs
};

// What a new RC QP on `dev`:`port` offers for ECE, without connecting anything (nccl-mesh-info
// shows it): a CQ and a QP are created, moved to INIT, queried and destroyed. Unsupported where
// the provider has no ECE (rxe); Failed (logged) when the QP cannot be made.
EceResult probeEce(const VerbsDevice* dev, int port, Ece* out);

// A uniformly random 24-bit packet sequence number.
uint32_t randomPsn();
// "fe80::…"-style text of a GID for logs.
std::string gidText(const uint8_t gid[16]);

}  // namespace mesh
