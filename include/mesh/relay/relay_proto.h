// SPDX-License-Identifier: Apache-2.0
// Relay wire protocol (issue 15): the link-local HELLO that route discovery sends on every
// mesh port, and the RELAY-OPEN request/reply a connecting node A exchanges with the relay
// service of its next hop B to reach a listener C it has no cable to. Pure code:
// encode/parse are unit-tested and fuzzed (HELLOs come from anyone on a link, requests
// from anyone who reaches the relay port).
//
// Message = Header + body, all fields little-endian, fixed width, reserved bytes zero:
//   Header (16 bytes): magic u32 (kRelayMagic) | version u16 | type u16 |
//                      length u32 (whole message, header included) | reserved u32
//   HELLO (type 1), one UDP datagram, at most kRelayMaxHello = 1472 bytes (a 1500-byte IPv4
//   packet less its IPv4 and UDP headers):
//     node u64 | nAddrs u8 (1..32) | flags u8 | nRoutes u16 (0..200) | nRecords u8 (0..16) |
//     reserved u8 | reserved u16 |
//     nAddrs × Addr (6 bytes):  addr u32 | prefixLen u8 (0..32) | reserved u8
//     nRoutes × Route (6 bytes): subnet u32 (host bits zero) | prefixLen u8 | hops u8
//                                (0..16; 16 = unreachable)
//     nRecords × Record (36 bytes + lists), the route plan's flooding (topology_view.h):
//       origin u64 | seq u64 | topologyDigest u64 | tableDigest u64 | nAddrs u8 (0..32) |
//       nNeighbours u8 (0..15) | reserved u16 | nAddrs × Addr | nNeighbours × node u64
//     flags: bit 0 (kHelloFlagOverflow) = the sender's view did not fit: nRecords is 0 and
//     no node uses the plan while it is said; the other bits are 0.
//   Version 2 added the records (and the 4 prefix bytes that count them); a version 1 HELLO
//   is refused, naming both versions. What fits: kHelloPlanGuaranteeBytes below (8 nodes
//   with up to 4 mesh addresses each, any cabling); a ring or line of 8 with 8 addresses
//   each fits too. A view that does not fit is sent as overflow (the fallback rule).
//   OPEN (type 2), A → B over TCP:
//     origin u64 (A's node) | request u64 (A's id for it) | hopBudget u8 (1..15: relays
//     that may still forward, B included) | nVisited u8 (0..15) | twinLeg u8 (0: a plain
//     relayed connection; 1 or 2: a leg of a two-relay one, which the last relay's HELLO to C
//     names; a relay that predates it refuses the OPEN, and A falls back to one relay) |
//     reserved u8 |
//     originAddr u32 (A's node address, nodeAddress() in relay_service.h: the lowest of its
//     mesh addresses; the last relay names it to C in its HELLO; 0: not said, a first relay
//     then takes the OPEN's source address. Before 2026-11-29 A sent its address towards its
//     first relay: the field is a name for counters, not an address anyone connects to) |
//     handle [128] (C's listen handle, as NCCL gave it to A: its address
//     list, port and token) | nVisited × node u64 (relays already on the path, for loops)
//   OPEN-REPLY (type 3), B → A over TCP:
//     request u64 | status u16 (RelayStatus) | hops u8 (relays on the path, B included) |
//     reserved u8 | reasonLen u16 (0..512) | reserved u16 |
//     status Ok: handle [128] (the listen handle of B's leg for A to connect to), and
//                reasonLen 0;
//     otherwise: reasonLen bytes of reason text (UTF-8, not NUL-terminated).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "mesh/routing/routes.h"
#include "mesh/routing/topology_view.h"
#include "mesh/wire/handle_codec.h"

namespace mesh {

constexpr uint32_t kRelayMagic = 0x314c524du;  // "MRL1" as little-endian bytes
// 2: relayed data as tickets striped over every QP of a leg (comm.h); a version-1 relay
// would read a ticket's immediate as a byte count. 3: HELLOs carry the route plan's records
// (mesh/routing/topology_view.h).
constexpr uint16_t kRelayVersion = 3;
constexpr size_t kRelayHeaderSize = 16;
constexpr size_t kRelayHelloPrefix = 16;
constexpr size_t kRelayHelloAddrSize = 6;
constexpr size_t kRelayHelloRouteSize = 6;
constexpr size_t kRelayHelloRecordPrefix = 36;
constexpr uint8_t kHelloFlagOverflow = 1;
constexpr size_t kRelayOpenPrefix = 24;
constexpr size_t kRelayReplyPrefix = 16;
constexpr size_t kRelayMaxReason = 512;
constexpr int kRelayMaxHopBudget = kRouteMaxHopsLimit;
constexpr size_t kRelayMaxHello = 1500 - 20 - 8;
// The largest HELLO of 8 nodes with up to 4 mesh addresses each, whatever the cabling: its
// own addresses, every subnet once in its vector, and 8 records naming 7 neighbours each.
constexpr size_t kHelloPlanGuaranteeBytes =
    kRelayHeaderSize + kRelayHelloPrefix + 4 * kRelayHelloAddrSize + 8 * 4 * kRelayHelloRouteSize +
    8 * (kRelayHelloRecordPrefix + 4 * kRelayHelloAddrSize + 7 * sizeof(uint64_t));
static_assert(kHelloPlanGuaranteeBytes <= kRelayMaxHello, "8 nodes' views must fit one HELLO");
static_assert(kRelayHeaderSize + kRelayHelloPrefix + kHelloMaxAddresses * kRelayHelloAddrSize +
                      kHelloMaxRoutes * kRelayHelloRouteSize <= kRelayMaxHello,
              "a HELLO without records must always fit");
constexpr size_t kRelayMaxOpen = kRelayHeaderSize + kRelayOpenPrefix + kHandleSize +
                                 kRelayMaxHopBudget * sizeof(uint64_t);
constexpr size_t kRelayMaxReply = kRelayHeaderSize + kRelayReplyPrefix +
                                  (kHandleSize > kRelayMaxReason ? kHandleSize : kRelayMaxReason);
constexpr size_t kRelayMaxMessage = kRelayMaxHello;
static_assert(kRelayMaxHello == 1472, "HELLO wire format changed (and must fit 1472 bytes)");
static_assert(kRelayMaxOpen == 288 && kRelayMaxReply == 544, "relay-open wire format changed");
static_assert(kRelayMaxOpen <= kRelayMaxMessage && kRelayMaxReply <= kRelayMaxMessage,
              "kRelayMaxMessage bounds every message");

enum class RelayType : uint16_t { Hello = 1, Open = 2, OpenReply = 3 };

// Why a relay refused an OPEN, for A's error message (and for trying the other way round).
enum class RelayStatus : uint16_t {
  Ok = 0,
  NoRoute = 1,        // B has no route to any of C's addresses
  HopBudget = 2,      // forwarding would exceed the hop budget
  Loop = 3,           // B is already on the path (nVisited lists it)
  Disabled = 4,       // NCCL_MESH_RELAY=off on B, or no relay service there
  NoMemory = 5,       // NCCL_MESH_RELAY_MEM would be exceeded
  PeerRefused = 6,    // C (or the next relay) refused or did not answer
  BadRequest = 7,     // a malformed or unsupported request
  ShuttingDown = 8,   // B's relay service is stopping
};
constexpr uint16_t kRelayStatusMax = 8;
const char* relayStatusName(RelayStatus s);

struct RelayOpen {
  NodeId origin = 0;
  uint32_t originAddr = 0;       // A's node address (0: not said)
  int twinLeg = 0;               // 1 or 2: a leg of a two-relay connection (C pairs them); else 0
  uint64_t request = 0;
  int hopBudget = 1;             // 1..kRelayMaxHopBudget
  std::vector<NodeId> visited;   // at most kRelayMaxHopBudget
  Handle target;                 // C's listen handle
};

struct RelayOpenReply {
  uint64_t request = 0;
  RelayStatus status = RelayStatus::Ok;
  int hops = 0;                  // 0..kRelayMaxHopBudget
  Handle leg;                    // status Ok: where A connects
  std::string reason;            // otherwise: why (at most kRelayMaxReason bytes)
};

struct RelayMessage {
  RelayType type = RelayType::Hello;
  NodeHello hello;          // Hello
  HelloTopology topology;   // Hello: the route plan's records
  RelayOpen open;        // Open
  RelayOpenReply reply;  // OpenReply
};

// The bytes a HELLO with this body and topology takes on the wire (before any check): a
// sender compares it with kRelayMaxHello and sends its view as overflow when it is over.
size_t relayHelloSize(const NodeHello& hello, const HelloTopology& topology);

// Serializes the part of msg its type names. Fails, with *error, on anything parse would
// reject (counts, limits, host bits, node 0, an unencodable handle, an over-long reason).
bool encodeRelay(const RelayMessage& msg, std::vector<uint8_t>* out, std::string* error);

// How many bytes the message starting at `in` occupies, from its header alone: 0 while
// fewer than kRelayHeaderSize bytes are available; -1 (with *error) for a bad header (magic,
// version, type, or a length below the header or above that type's maximum).
long relayMessageLength(const uint8_t* in, size_t len, std::string* error);

// Parses one complete message of exactly `len` bytes, with every check above; *out is
// written only on success. Never reads beyond in[len).
bool parseRelay(const uint8_t* in, size_t len, RelayMessage* out, std::string* error);

}  // namespace mesh
