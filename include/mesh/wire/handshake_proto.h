// SPDX-License-Identifier: Apache-2.0
// Handshake wire protocol: the binary messages exchanged over the per-connection TCP
// control socket while two ranks bring their QPs up. Pure code: encode/parse are
// unit-tested and fuzzed (the listener parses bytes from anyone who can reach its port).
//
// Exchange (connector = NCCL's connect side = data sender; listener = accept side):
//   connector → listener  HELLO   token, links (addresses, NIC indexes), QPs, control region
//   listener  → connector ACCEPT  its QPs (already RTS) and control region, or REJECT+reason
//   connector → listener  READY   connector's QPs are RTS too; both sides hand comms to NCCL
// The TCP socket then stays open as a liveness signal for the comm's lifetime.
//
// Message = Header + body, all little-endian, fixed width:
//   Header (24 bytes): magic u32 | version u16 | type u16 | length u32 (whole message,
//                      header included) | origin u32 | token u64
//   origin: in a HELLO from a relay, the IPv4 address of the relayed connection's sender
//           (so the receiver counts the connection as relayed from it); 0 in a direct
//           HELLO and in every other message. A build that predates it requires 0 there:
//           a relayed connect to it is refused naming the field (run one version).
//   HELLO/ACCEPT body: nLinks u8 | qpsPerLink u8 | trafficClass u8 | classes u8 | then
//                      nLinks × LinkInfo (32 bytes) | then nLinks*qpsPerLink × QpInfo
//                      (32 bytes), link-major
//   classes: bit 7 set = trafficClass and the service level (bits 0..3) are the ones the
//            connector chose for BOTH ends' QPs (as NCCL IB's connect metadata carries
//            tc and sl to its accept side); bits 4..5: in a HELLO, the connection is leg 1
//            or 2 of a two-relay connection (0: it is not; the receiver's accept pairs the
//            two legs, docs/relay.md); bit 6 is reserved (0). Bit 7 clear (a peer that
//            predates it, whose bytes 2..3 were reserved zeros): the receiver uses its own
//            settings (bits 4..5 count either way). A build that predates bits 4..5 refuses
//            such a HELLO, and the sender falls back to one relay.
//   LinkInfo: senderAddr u32 | receiverAddr u32 | senderNic u8 | receiverNic u8 |
//             prefixLen u8 | flags u8 | ctrlAddr u64 | ctrlRkey u32 | eceVendor u32 |
//             eceOptions u32
//             ("sender"/"receiver" name the message's author and its recipient)
//   flags: bit 0 = eceVendor/eceOptions carry the author's ECE for this link's QPs (in a
//          HELLO what the connector's QPs offer, ibv_query_ece; in an ACCEPT the options the
//          acceptor's QPs settled on after ibv_set_ece and RTR, which the connector sets
//          before its own RTR: NCCL IB's exchange, per link rather than per QP since every QP
//          of a link is on the same device pair); clear = no ECE and both fields zero. Other
//          bits 0. A build that predates it refuses a HELLO that carries ECE.
//   QpInfo:   qpn u32 | psn u32 | gid[16] | gidIndex u8 | mtu u8 (enum ibv_mtu) |
//             reserved u16 | reserved u32
//   READY body: empty.   REJECT body: reason text (UTF-8, not NUL-terminated).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace mesh {

constexpr uint32_t kHsMagic = 0x3153484du;  // "MHS1" as little-endian bytes
constexpr uint16_t kHsVersion = 1;
constexpr size_t kHsHeaderSize = 24;
constexpr size_t kHsBodyPrefixSize = 4;
constexpr size_t kHsLinkSize = 32;
constexpr size_t kHsQpSize = 32;
constexpr int kHsMaxLinks = 4;
constexpr int kHsMaxQpsPerLink = 16;
constexpr size_t kHsMaxReason = 512;
constexpr size_t kHsMaxMessage = kHsHeaderSize + kHsBodyPrefixSize + kHsMaxLinks * kHsLinkSize +
                                 kHsMaxLinks * kHsMaxQpsPerLink * kHsQpSize;
static_assert(kHsMaxMessage == 2204, "handshake wire format changed");

enum class HsType : uint16_t { Hello = 1, Accept = 2, Ready = 3, Reject = 4 };

struct HsLink {
  uint32_t senderAddr = 0;
  uint32_t receiverAddr = 0;
  uint8_t senderNic = 0;
  uint8_t receiverNic = 0;
  uint8_t prefixLen = 0;
  uint64_t ctrlAddr = 0;
  uint32_t ctrlRkey = 0;
  bool hasEce = false;      // ECE of this link's QPs is carried (flags bit 0)
  uint32_t eceVendor = 0;   // ibv_ece.vendor_id
  uint32_t eceOptions = 0;  // ibv_ece.options
};

struct HsQp {
  uint32_t qpn = 0;  // 24 bits used
  uint32_t psn = 0;  // 24 bits used
  uint8_t gid[16] = {};
  uint8_t gidIndex = 0;
  uint8_t mtu = 0;   // enum ibv_mtu, 1..5
};

struct HsMessage {
  HsType type = HsType::Hello;
  uint64_t token = 0;
  int qpsPerLink = 0;
  std::vector<HsLink> links;   // HELLO/ACCEPT
  std::vector<HsQp> qps;       // HELLO/ACCEPT: links.size() * qpsPerLink, link-major
  int trafficClass = -1;       // HELLO/ACCEPT: 0..255, both ends' QPs; -1 not carried
  int serviceLevel = -1;       // 0..15 when trafficClass is carried
  uint32_t originAddr = 0;     // HELLO of a relayed connection: its sender's address; else 0
  int twinLeg = 0;             // HELLO: 1 or 2, a leg of a two-relay connection; else 0
  std::string reason;          // REJECT
};

// Serializes msg. Fails (with *error) on counts outside the limits or an over-long reason.
bool encodeHandshake(const HsMessage& msg, std::vector<uint8_t>* out, std::string* error);

// How many bytes the whole message starting at `in` occupies, from its header alone:
// 0 while fewer than kHsHeaderSize bytes are available; -1 (with *error) when the header is
// invalid (bad magic/version/type, length below the header or above kHsMaxMessage).
long handshakeLength(const uint8_t* in, size_t len, std::string* error);

// Parses one complete message of exactly `len` bytes. Rejects, with *error: bad header,
// length mismatch, counts of 0 or above the limits, qpn/psn above 24 bits, mtu outside
// 1..5, non-zero reserved fields, READY with a body, REJECT with an over-long reason.
// Never reads beyond in[len).
bool parseHandshake(const uint8_t* in, size_t len, HsMessage* out, std::string* error);

}  // namespace mesh
