// SPDX-License-Identifier: Apache-2.0
// What one node knows of the whole cabling, for the route plan (route_plan.h): its own
// adjacency and every other node's, flooded in the HELLOs (mesh/relay/relay_proto.h), and
// whether every node's view agrees with its own. Pure code: no sockets, no clock, no
// logging; the time and the sequence numbers are passed in.
//
// Flooding
//  - Every node originates one record: its NodeId, its mesh addresses, the NodeIds it hears
//    (the route table's live neighbours) and the digests of the plan it computed. Every
//    HELLO carries the sender's record and every record it holds, so a record reaches the
//    whole cluster, and a node learns the digests of nodes it has no cable to.
//  - A record replaces the held one of its origin only with a higher sequence number. The
//    origin numbers its records with its clock (milliseconds, and never twice the same), so
//    every period it sends a newer one and a restarted node's records win at once. A record
//    not replaced by a newer one for holdMs is dropped, and its number is remembered for
//    3 x holdMs (a tombstone): copies of it still circulating between the other nodes are
//    refused, so a node that stopped is forgotten everywhere instead of passed round for
//    ever. (A node restarted with its clock set back is heard once the tombstone is gone.)
//  - A record naming this node as origin is ignored (this node is the authority on itself;
//    another process of the same node may be announcing a moment-old view).
//  - A sender whose view does not fit one HELLO says so (overflow) and sends no records;
//    while any node says so, the plan is not used anywhere (the fallback rule is). A view
//    fits when its bytes fit one datagram (the sender measures) and it has at most
//    kTopologyMaxRecords nodes and this node hears at most kTopologyMaxNeighbours (the
//    codec's limits; countsFit()). A view of more nodes is not planned either: the plan
//    could not be used, and planning dozens of nodes takes seconds.
//
// Views agree when (agreement()): no node overflows, every record's digests equal this
// node's, and every adjacency is heard from both ends. A half-heard cable (a HELLO lost one
// way, a cable just cut and not yet expired) is a disagreement: the plan would be computed
// without it and the nodes may not have settled.
//
// The picture is closed when (closure()) every address of every node in it (a /32 aside)
// shares its subnet with a node that node hears: no cable ends in a node not yet heard. A
// picture can agree everywhere and still be open, while a node is starting (its neighbours
// have not heard it, so nobody lists it), and a path planned then may detour round it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "mesh/platform/ipv4.h"
#include "mesh/routing/route_plan.h"
#include "mesh/routing/routes.h"

namespace mesh {

constexpr size_t kTopologyMaxRecords = 16;     // records one HELLO may carry
constexpr size_t kTopologyMaxNeighbours = 15;  // neighbours one record may list
// Other nodes' records held at most: a view of more than kTopologyMaxRecords nodes is sent as
// overflow and not planned, so more only costs memory (a sender inventing origins, or a big
// cluster whose views flood in pieces). Records of origins beyond it are not kept.
constexpr size_t kTopologyMaxHeld = 4 * kTopologyMaxRecords;

// One node's adjacency, as flooded.
struct TopologyRecord {
  NodeId origin = 0;
  uint64_t seq = 0;              // the origin's numbering: higher = newer
  uint64_t topologyDigest = 0;   // the plan the origin computed when it sent this
  uint64_t tableDigest = 0;
  std::vector<Ipv4Prefix> addrs;     // at most kHelloMaxAddresses
  std::vector<NodeId> neighbours;    // at most kTopologyMaxNeighbours
  // Same content, whatever the sequence number.
  bool sameContent(const TopologyRecord& o) const {
    return origin == o.origin && topologyDigest == o.topologyDigest && tableDigest == o.tableDigest &&
           addrs == o.addrs && neighbours == o.neighbours;
  }
  bool operator==(const TopologyRecord& o) const { return seq == o.seq && sameContent(o); }
};

// A HELLO's topology section.
struct HelloTopology {
  bool overflow = false;                // the sender's view did not fit: no records
  std::vector<TopologyRecord> records;  // the sender's own first, then by origin
};

struct PlanAgreement {
  bool agree = true;
  NodeId node = 0;  // the node the disagreement names (0 when they agree)
  std::string why;  // one sentence, for the log; empty when they agree
};

class TopologyView {
 public:
  TopologyView(NodeId self, int maxHops, uint64_t holdMs);

  // This node's own adjacency: the addresses its HELLOs list and the nodes it hears.
  // Returns whether it, or the plan, changed.
  bool setOwn(std::vector<Ipv4Prefix> addrs, std::vector<NodeId> neighbours);
  // This node's view does not fit one HELLO (the sender found out encoding it).
  void setOwnOverflow(bool overflow) { ownOverflow_ = overflow; }
  bool ownOverflow() const { return ownOverflow_; }
  // The view's counts are within what one HELLO carries (above); advertise() sends it as
  // overflow otherwise, whatever setOwnOverflow said.
  bool countsFit() const;
  // The topology section of a HELLO from `sender` at nowMs. Returns whether the content
  // of what this node holds changed (a record's addresses, neighbours or digests, a node
  // new or an overflow), i.e. whether its neighbours should hear at once.
  bool onHello(NodeId sender, const HelloTopology& t, uint64_t nowMs);
  // Drops records and overflow marks not renewed since nowMs - holdMs, and makes a plan that
  // was put off (below) once its gap has passed. Returns whether anything went or the plan
  // changed.
  bool expire(uint64_t nowMs);
  // Planning a dense 16-node picture takes 0.1-0.4 s of the reactor thread. A new plan comes
  // at most once per this gap (4 x the last plan's time, 0 under a millisecond); a change
  // inside it is planned by expire() once the gap has passed, so that a sender changing its
  // records with every datagram cannot keep the reactor planning.
  uint64_t planGapMs() const { return planGapMs_; }
  bool planPending() const { return planPending_; }

  // What this node's HELLOs carry: its own record numbered ownSeq with the current digests,
  // then every record it holds, by origin.
  HelloTopology advertise(uint64_t ownSeq) const;
  // Every record held, this node's own (seq 0) among them, by origin.
  std::vector<TopologyRecord> records() const;
  const RoutePlan& plan() const { return plan_; }
  PlanAgreement agreement() const;
  // agree = the picture is closed (above); otherwise `node` has an address whose cable
  // leads to no node heard, and `why` names it.
  PlanAgreement closure() const;
  NodeId self() const { return self_; }

 private:
  struct Held {
    TopologyRecord record;
    uint64_t renewedMs = 0;
  };
  TopologyRecord own() const;
  bool replan();

  NodeId self_;
  int maxHops_;
  uint64_t holdMs_;
  std::vector<Ipv4Prefix> ownAddrs_;
  std::vector<NodeId> ownNeighbours_;
  bool ownOverflow_ = false;
  std::map<NodeId, Held> held_;               // other nodes' records, by origin
  std::map<NodeId, Held> tombstones_;         // expired records: refused until renewedMs + 3 x holdMs
  std::map<NodeId, uint64_t> overflowSeenMs_;  // senders that said overflow, when last
  RoutePlan plan_;
  uint64_t nowMs_ = 0;        // the latest time onHello/expire were given
  uint64_t plannedAtMs_ = 0;  // when plan_ was made
  uint64_t planGapMs_ = 0;
  bool planPending_ = false;
};

}  // namespace mesh
