// SPDX-License-Identifier: Apache-2.0
// A relayed connection over two relays (issue 31; docs/relay.md, "Two relays").
//
// Where a pair has no cable and two equally short ways through different relays (a 4-ring's
// opposite nodes), one NCCL connection becomes two relayed legs, one through each relay:
//  - the sender (TwinConnector) opens both legs; each OPEN and the last relay's HELLO to the
//    receiver name the leg (1 or 2). The receiver's accept holds the first leg until the
//    second arrives and hands NCCL one comm (the first leg's) that drives both. No id pairs
//    them: NCCL listens once per connection and accepts once on that listen comm before closing
//    it (2.28 src/transport/net.cc: recvProxySetup calls listen into the connection's own
//    resources->netListenComm, recvProxyConnect accepts on it), so the two legs that reach one
//    listener are one connection's. A leg that
//    cannot come up (a relay refusing, a build that predates the field) ends the pair: the
//    sender closes the other leg and connects again through one relay, and the receiver
//    drops a held leg whose sender went away.
//  - every NCCL send goes whole over one leg and a zero-byte send with the same tag over
//    the other; every receive and flush is posted on both legs (the same buffers; the
//    memory is registered on both legs' devices). Both legs thus see every message in NCCL's
//    order, so each keeps the ordinary in-order FIFO contract, and a request completes when
//    both of its parts did; a receive's sizes are the sum of its parts' (one of them is 0).
//  - the leg is chosen per send by TwinSteer. When the legs' first cables carry clearly
//    different amounts of direct traffic (this process's NCCL connections to that neighbour,
//    read from the live counters over seconds: LoadMeter), the quieter one: NCCL's tree on a
//    4-ring puts its own edges on one of each relayed pair's first cables, and a relayed byte
//    there slows the tree. Otherwise the route plan's way (leg 1), as one relay would: both
//    ways at once cost an all-to-all more (in-order completion over two ways) than they gave
//    a lone relayed stream. Relayed traffic (ours, and what this node forwards for others) is
//    not counted as load: the nodes' choices would chase each other.
// Threads: as any comm (one NCCL thread at a time); nothing here locks.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "err.h"
#include "mesh/connect/handshake.h"
#include "mesh/datapath/comm.h"
#include "mesh/relay/relay_service.h"

namespace mesh {

// Which leg carries the next send: pure, unit-tested.
class TwinSteer {
 public:
  using Clock = std::chrono::steady_clock;
  // The leg (0 or 1) for the next `bytes`. When the two legs' first cables carry clearly
  // different amounts of direct traffic (setLoad: NCCL's own connections to the neighbour),
  // the quieter one: a relayed byte on a cable a direct connection fills slows that
  // connection (NCCL's tree on a 4-ring: docs/relay.md). Otherwise leg 0, the route plan's
  // way: one connection's 8 slots complete in order, so a message on the other way waits for
  // the slower of the two (an all-to-all split by rates lost up to a fifth).
  // With useRates() (test switches, figures): otherwise the leg expected to have `bytes`
  // more through sooner: the bytes it holds plus these, at the rate it delivered lately or
  // at what its oldest send in flight shows it does now, whichever is slower. A leg with no
  // rate yet is tried first; one idle for kRetryIdle is tried again. Ties: leg 0.
  int pick(uint64_t bytes, Clock::time_point now) const;
  // The direct traffic on `leg`'s first cable, bytes/s (LoadMeter), and what this connection
  // itself sends, over the same time.
  void setLoad(int leg, double bytesPerSecond);
  void setOwnRate(double bytesPerSecond);
  // Where the loads do not decide, the rates instead of the plan's way (MESH_TEST_TWIN_RATES,
  // MESH_TEST_TWIN_RATES_ONLY: the steering of earlier builds, for figures and for tests of
  // both ways carrying data). Before the first posted(): only then are the sends in flight
  // and the rates kept.
  void useRates() { planLeg_ = false; }
  // The leg pick() takes for its quieter cable, or -1 when the loads do not decide: unknown,
  // within kLoadMargin of each other, or both small next to what this connection sends
  // (under kLoadFloor of it: a receiver's FIFO writes beside a relayed stream, say).
  int quieterLeg() const;
  // A send of `bytes` (> 0) posted on `leg`, and its completion (`id` names it).
  void posted(int leg, uint64_t id, uint64_t bytes, Clock::time_point now);
  void completed(int leg, uint64_t id, Clock::time_point now);
  uint64_t sends(int leg) const { return legs_[leg].sends; }
  uint64_t bytes(int leg) const { return legs_[leg].total; }
  double load(int leg) const { return load_[leg]; }  // as last set (0 until then)
  static constexpr double kRetryIdle = 0.5;  // seconds
  static constexpr double kLoadMargin = 0.4;
  static constexpr double kLoadFloor = 0.05;

 private:
  struct InFlight {
    uint64_t id;
    uint64_t bytes;
    Clock::time_point at;
  };
  struct Leg {
    std::deque<InFlight> inflight;  // oldest first
    uint64_t held = 0;              // their bytes
    double rate = 0;                // bytes/s, moving average of completed sends (0: none yet)
    Clock::time_point lastDone;
    uint64_t sends = 0, total = 0;  // data sends and bytes posted (reports, tests)
  };
  double score(const Leg& l, uint64_t bytes, Clock::time_point now) const;
  Leg legs_[2];
  double load_[2] = {0, 0};
  bool loadKnown_[2] = {false, false};
  double ownRate_ = -1;  // unknown
  bool planLeg_ = true;
};

// The rate of the direct traffic on a leg's first cable (NCCL's connections to that
// neighbour): from the live counters of the leg's cable ends, this process's bytes posted on
// them less those relay paths posted (relayed legs, forwarding for others). Relayed traffic
// is left out on purpose: it is what the steering moves, and counting it would let the
// nodes' choices chase each other (an all-to-all would lock into lopsided routes). Pure,
// unit-tested.
class LoadMeter {
 public:
  using Clock = std::chrono::steady_clock;
  // Counters read at `now`; true when a new rate came of it (at most one per kMinGap, none
  // before kWarm has passed since the first reading).
  bool sample(uint64_t total, uint64_t relay, Clock::time_point now);
  bool known() const { return known_; }
  double rate() const { return rate_; }  // bytes/s
  static constexpr double kMinGap = 0.002;  // seconds
  static constexpr double kWarm = 2.0;      // seconds of readings before a rate counts
  static constexpr double kSmooth = 2.0;    // seconds: the average's time constant

 private:
  bool started_ = false, known_ = false;
  uint64_t firstOther_ = 0, lastOther_ = 0;
  Clock::time_point firstAt_, lastAt_;
  double rate_ = 0;
};

// The data path of a two-relay connection. Owned by the first leg's comm (the one NCCL
// holds); owns the second leg.
class TwinComm {
 public:
  TwinComm(Comm* first, std::unique_ptr<Comm> second);
  ~TwinComm();
  Comm* leg(int i) const { return i == 0 ? first_ : second_.get(); }
  // The second leg, for closing it (the TwinComm is done with it).
  std::unique_ptr<Comm> releaseSecond() { return std::move(second_); }
  ncclResult_t isend(void* data, size_t size, int tag, const MrHandle* mh, Request** out);
  ncclResult_t irecv(int n, void** data, const size_t* sizes, const int* tags, MrHandle* const* mh, Request** out);
  ncclResult_t iflush(int n, void** data, const int* sizes, MrHandle* const* mh, Request** out);
  // A request this returned (req->twinned).
  ncclResult_t test(Request* req, int* done, size_t* sizes);
  // Both legs' devices / local ports, each once.
  std::vector<int> deviceIndexes() const;
  std::vector<int> localPorts() const;
  const TwinSteer& steer() const { return steer_; }

 private:
  struct Part {
    Request* other = nullptr;  // the other leg's part; NULL while owed
    bool otherDone = false;
    bool dataSend = false;     // a send whose bytes went on this leg (steer_ is told when done)
    uint64_t id = 0;
    size_t otherSizes[kGroupMax] = {};
  };
  // A part not posted yet (its leg said "not now"): posted before anything else.
  struct Owed {
    bool active = false;
    int leg = 0;               // where it goes
    Request* whole = nullptr;  // the request NCCL holds
    Request::Kind kind = Request::Kind::Send;
    void* data[kGroupMax] = {};
    size_t sizes[kGroupMax] = {};
    int tags[kGroupMax] = {};
    MrHandle* mh[kGroupMax] = {};
    int n = 1;
  };
  int legOf(const Request* r) const { return r->comm == first_ ? 0 : 1; }
  Part& part(const Request* r) { return parts_[legOf(r)][r->index]; }
  // Posts the owed part: *paid false while its leg still says "not now"; the leg's error when
  // it failed (the whole request can never complete then).
  ncclResult_t payOwed(bool* paid);
  Request* link(Request* whole, Request* other, bool dataSend);

  Comm* first_;
  std::unique_ptr<Comm> second_;
  Part parts_[2][kRequestPool];
  Owed owed_;
  TwinSteer steer_;
  // Each leg's cable ends and their relay-path counters, read to feed steer_.setLoad.
  struct LegCables {
    std::vector<const stats::LinkSlot*> slots;
    std::vector<const uint64_t*> relay;  // per slot: what relay paths posted there (NULL: unpublished)
  };
  LegCables cables_[2];
  LoadMeter meters_[2];
  LoadMeter own_;  // this connection's data sends
  void sampleLoads(TwinSteer::Clock::time_point now);
  uint64_t nextId_ = 1;
};

// The sender's side of a relayed connect: two legs when the pair has two equally short
// ways through different relays (and NCCL_MESH_RELAY_TWIN=1), otherwise one (RelayConnector).
class TwinConnector {
 public:
  TwinConnector(Handshaker* hs, std::vector<LocalNic> nics, Handle target, RelayConnector::Lookup lookup,
                ConnOptions opts, RelayConnectSettings s, bool twinAllowed);
  ~TwinConnector();
  // *out: the SendComm NCCL gets (its twin() set when two legs came up), with its flows
  // counted; NULL: not yet.
  ncclResult_t poll(std::unique_ptr<PreparedConn>* out);

 private:
  enum class State { Deciding, Twin, Single };
  // One relay from here on. `failed`: the relay of a leg that did not come up (0: none),
  // which the fallback asks last.
  void single(const std::string& why, NodeId failed = 0);
  // A one-relay connector: through `fixed` (a twin leg), or through the lookup's candidates
  // waiting at most `settleMs` for the route picture (twinLeg 0).
  // `last` (no `fixed`): a relay asked only after every other candidate.
  std::unique_ptr<RelayConnector> connector(std::vector<NextHop> fixed, int twinLeg, int settleMs,
                                            NodeId last = 0) const;

  Handshaker* hs_;
  std::vector<LocalNic> nics_;
  Handle target_;
  RelayConnector::Lookup lookup_;
  ConnOptions opts_;
  RelayConnectSettings settings_;
  bool twinAllowed_;
  State state_ = State::Deciding;
  std::chrono::steady_clock::time_point settleUntil_;
  std::unique_ptr<RelayConnector> legs_[2];
  NodeId legRelay_[2] = {0, 0};  // each leg's (first) relay
  std::unique_ptr<PreparedConn> done_[2];
};

// Closes and frees a comm: its verbs objects, then its control link (NCCL's close, a comm
// that never reached NCCL, a twin's second leg).
void discardComm(Handshaker* hs, std::unique_ptr<PreparedConn> conn);

// The accept side: pairs the legs of two-relay connections arriving at one listener.
struct TwinAccept {
  std::unique_ptr<PreparedConn> held[2];  // legs 1 and 2, until both are here
  // Takes an accepted connection: a plain one is returned at once; a leg is held until its
  // partner came, then the first leg (driving both) is returned. Legs whose sender went away
  // are dropped. *out NULL: nothing for NCCL yet.
  void take(Handshaker* hs, std::unique_ptr<PreparedConn> conn, std::unique_ptr<PreparedConn>* out);
  void dropDead(Handshaker* hs);
  void clear(Handshaker* hs);
};

}  // namespace mesh
