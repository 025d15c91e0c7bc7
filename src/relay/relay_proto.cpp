// SPDX-License-Identifier: Apache-2.0
// Relay message encode/parse (see relay_proto.h). HELLOs arrive from anyone on a link and
// OPENs from anyone who reaches the relay port, so every count is checked against the
// length before it sizes anything and every byte read is bounds-checked by construction:
// the announced length must equal what the counts imply before a body byte is read.
// Built standalone into the fuzzer: only include/ and handle_codec.cpp, ipv4.cpp.
#include "mesh/relay/relay_proto.h"

#include <cstdio>
#include <cstring>
#include <utility>

#include "mesh/platform/ipv4.h"
#include "mesh/wire/wire.h"

namespace mesh {

namespace {

// The header is the common MessageHeader (wire.h) and nothing else.
static_assert(kMessageHeaderSize == kRelayHeaderSize, "the relay header is the common header");

// HELLO body offsets (relative to the end of the header).
constexpr size_t kHelloNode = 0;
constexpr size_t kHelloAddrCount = 8;
constexpr size_t kHelloFlags = 9;
constexpr size_t kHelloRouteCount = 10;
constexpr size_t kHelloRecordCount = 12;
constexpr size_t kHelloReserved8 = 13;
constexpr size_t kHelloReserved16 = 14;
static_assert(kHelloReserved16 + 2 == kRelayHelloPrefix, "HELLO prefix fields must tile it");

// HELLO record offsets (relative to the record's start).
constexpr size_t kRecordOrigin = 0;
constexpr size_t kRecordSeq = 8;
constexpr size_t kRecordTopology = 16;
constexpr size_t kRecordTable = 24;
constexpr size_t kRecordAddrCount = 32;
constexpr size_t kRecordNeighbourCount = 33;
constexpr size_t kRecordReserved = 34;
static_assert(kRecordReserved + 2 == kRelayHelloRecordPrefix, "HELLO record fields must tile it");

// OPEN body offsets.
constexpr size_t kOpenOrigin = 0;
constexpr size_t kOpenRequest = 8;
constexpr size_t kOpenBudget = 16;
constexpr size_t kOpenVisited = 17;
constexpr size_t kOpenTwinLeg = 18;
constexpr size_t kOpenReserved8 = 19;
constexpr size_t kOpenOriginAddr = 20;
static_assert(kOpenOriginAddr + 4 == kRelayOpenPrefix, "OPEN prefix fields must tile it");

// OPEN-REPLY body offsets.
constexpr size_t kReplyRequest = 0;
constexpr size_t kReplyStatus = 8;
constexpr size_t kReplyHops = 10;
constexpr size_t kReplyReserved8 = 11;
constexpr size_t kReplyReasonLen = 12;
constexpr size_t kReplyReserved16 = 14;
static_assert(kReplyReserved16 + 2 == kRelayReplyPrefix, "OPEN-REPLY prefix fields must tile it");

constexpr uint8_t kMaxPrefixLen = 32;

bool fail(std::string* error, std::string msg) {
  if (error) *error = "relay: " + std::move(msg);
  return false;
}

std::string str(uint64_t value) { return std::to_string(value); }

const char* typeName(RelayType type) {
  switch (type) {
    case RelayType::Hello: return "HELLO";
    case RelayType::Open: return "OPEN";
    case RelayType::OpenReply: return "OPEN-REPLY";
  }
  return "unknown";
}

size_t maxLength(RelayType type) {
  switch (type) {
    case RelayType::Hello: return kRelayMaxHello;
    case RelayType::Open: return kRelayMaxOpen;
    case RelayType::OpenReply: return kRelayMaxReply;
  }
  return 0;
}

bool checkHeader(const uint8_t* in, RelayType* type, uint32_t* length, std::string* error) {
  MessageHeader h = getMessageHeader(in);
  if (h.magic != kRelayMagic) {
    char text[16];
    std::snprintf(text, sizeof(text), "0x%08x", static_cast<unsigned>(h.magic));
    return fail(error, std::string("bad magic ") + text + ", not an nccl-mesh relay message");
  }
  if (h.version != kRelayVersion) {
    return fail(error, "peer speaks relay protocol version " + str(h.version) + ", this build speaks " +
                           str(kRelayVersion) + "; run the same nccl-mesh version on every node");
  }
  if (h.type < static_cast<uint16_t>(RelayType::Hello) || h.type > static_cast<uint16_t>(RelayType::OpenReply)) {
    return fail(error, "unknown message type " + str(h.type));
  }
  *type = static_cast<RelayType>(h.type);
  *length = h.length;
  if (*length < kRelayHeaderSize) return fail(error, "length " + str(*length) + " is shorter than the header");
  if (*length > maxLength(*type)) {
    return fail(error, std::string(typeName(*type)) + " length " + str(*length) + " exceeds " +
                           str(maxLength(*type)));
  }
  if (h.reserved != 0) return fail(error, "reserved header field must be 0");
  return true;
}

void putHeader(std::vector<uint8_t>* out, RelayType type) {
  MessageHeader h;
  h.magic = kRelayMagic;
  h.version = kRelayVersion;
  h.type = static_cast<uint16_t>(type);
  h.length = static_cast<uint32_t>(out->size());
  putMessageHeader(out->data(), h);
}

bool isNetwork(const Ipv4Prefix& p) { return p.prefixLen <= kMaxPrefixLen && (p.addr & ~prefixMask(p.prefixLen)) == 0; }

// --- HELLO --------------------------------------------------------------------------------

size_t recordSize(const TopologyRecord& r) {
  return kRelayHelloRecordPrefix + r.addrs.size() * kRelayHelloAddrSize + r.neighbours.size() * sizeof(uint64_t);
}

bool checkRecords(const HelloTopology& t, std::string* error) {
  if (t.records.size() > kTopologyMaxRecords) {
    return fail(error, "HELLO carries " + str(t.records.size()) + " records (at most " + str(kTopologyMaxRecords) + ")");
  }
  if (t.overflow && !t.records.empty()) return fail(error, "HELLO says its view overflows but carries records");
  for (size_t i = 0; i < t.records.size(); ++i) {
    const TopologyRecord& r = t.records[i];
    std::string which = "HELLO record " + str(i + 1) + ": ";
    if (r.origin == 0) return fail(error, which + "origin node 0 (reserved)");
    if (r.addrs.size() > kHelloMaxAddresses) {
      return fail(error, which + str(r.addrs.size()) + " addresses (at most " + str(kHelloMaxAddresses) + ")");
    }
    if (r.neighbours.size() > kTopologyMaxNeighbours) {
      return fail(error, which + str(r.neighbours.size()) + " neighbours (at most " + str(kTopologyMaxNeighbours) + ")");
    }
    for (const Ipv4Prefix& a : r.addrs) {
      if (a.prefixLen > kMaxPrefixLen) return fail(error, which + "address with prefix length " + str(a.prefixLen));
    }
    for (NodeId n : r.neighbours) {
      if (n == 0) return fail(error, which + "neighbour node 0 (reserved)");
    }
    for (size_t j = 0; j < i; ++j) {
      if (t.records[j].origin == r.origin) return fail(error, which + "a second record of the same origin");
    }
  }
  return true;
}

bool checkHello(const NodeHello& h, std::string* error) {
  if (h.node == 0) return fail(error, "HELLO from node 0 (reserved)");
  if (h.addrs.empty() || h.addrs.size() > kHelloMaxAddresses) {
    return fail(error, "HELLO lists " + str(h.addrs.size()) + " addresses (1.." + str(kHelloMaxAddresses) + ")");
  }
  if (h.routes.size() > kHelloMaxRoutes) {
    return fail(error, "HELLO carries " + str(h.routes.size()) + " routes (at most " + str(kHelloMaxRoutes) + ")");
  }
  for (const Ipv4Prefix& a : h.addrs) {
    if (a.prefixLen > kMaxPrefixLen) return fail(error, "HELLO address with prefix length " + str(a.prefixLen));
  }
  for (const RouteAdvert& r : h.routes) {
    if (!isNetwork(r.subnet)) {
      return fail(error, "HELLO route " + formatIpv4(r.subnet.addr) + "/" + str(r.subnet.prefixLen) +
                             " is not a network address with a prefix length 0..32");
    }
    if (r.hops > kRouteHopsUnreachable) {
      return fail(error, "HELLO route with " + str(r.hops) + " hops (at most " + str(kRouteHopsUnreachable) + ")");
    }
  }
  return true;
}

uint8_t* writeAddr(uint8_t* p, const Ipv4Prefix& a) {
  putLe(p, a.addr, 4);
  p[4] = a.prefixLen;
  return p + kRelayHelloAddrSize;
}

// Reads one Addr, refusing a non-zero reserved byte.
bool readAddr(const uint8_t* p, std::vector<Ipv4Prefix>* out, std::string* error) {
  if (p[5] != 0) return fail(error, "HELLO address reserved byte must be 0");
  out->push_back({static_cast<uint32_t>(getLe(p, 4)), p[4]});
  return true;
}

void writeHello(const NodeHello& h, const HelloTopology& t, uint8_t* body) {
  putLe(body + kHelloNode, h.node, 8);
  putLe(body + kHelloAddrCount, h.addrs.size(), 1);
  body[kHelloFlags] = t.overflow ? kHelloFlagOverflow : 0;
  putLe(body + kHelloRouteCount, h.routes.size(), 2);
  putLe(body + kHelloRecordCount, t.records.size(), 1);
  uint8_t* p = body + kRelayHelloPrefix;
  for (const Ipv4Prefix& a : h.addrs) p = writeAddr(p, a);
  for (const RouteAdvert& r : h.routes) {
    putLe(p, r.subnet.addr, 4);
    p[4] = r.subnet.prefixLen;
    p[5] = r.hops;
    p += kRelayHelloRouteSize;
  }
  for (const TopologyRecord& r : t.records) {
    putLe(p + kRecordOrigin, r.origin, 8);
    putLe(p + kRecordSeq, r.seq, 8);
    putLe(p + kRecordTopology, r.topologyDigest, 8);
    putLe(p + kRecordTable, r.tableDigest, 8);
    p[kRecordAddrCount] = static_cast<uint8_t>(r.addrs.size());
    p[kRecordNeighbourCount] = static_cast<uint8_t>(r.neighbours.size());
    p += kRelayHelloRecordPrefix;
    for (const Ipv4Prefix& a : r.addrs) p = writeAddr(p, a);
    for (NodeId n : r.neighbours) {
      putLe(p, n, 8);
      p += sizeof(uint64_t);
    }
  }
}

// The records after the fixed part: each one's length is known only from its own counts, so
// every count is checked against what is left before it sizes anything.
bool readRecords(const uint8_t* p, size_t left, size_t count, HelloTopology* t, std::string* error) {
  for (size_t i = 0; i < count; ++i) {
    if (left < kRelayHelloRecordPrefix) return fail(error, "HELLO record " + str(i + 1) + " is truncated");
    TopologyRecord r;
    size_t nAddrs = p[kRecordAddrCount];
    size_t nNeighbours = p[kRecordNeighbourCount];
    if (getLe(p + kRecordReserved, 2) != 0) return fail(error, "HELLO record reserved bytes must be 0");
    size_t want = kRelayHelloRecordPrefix + nAddrs * kRelayHelloAddrSize + nNeighbours * sizeof(uint64_t);
    if (left < want) {
      return fail(error, "HELLO record " + str(i + 1) + " with " + str(nAddrs) + " addresses and " + str(nNeighbours) +
                             " neighbours needs " + str(want) + " bytes, " + str(left) + " left");
    }
    r.origin = getLe(p + kRecordOrigin, 8);
    r.seq = getLe(p + kRecordSeq, 8);
    r.topologyDigest = getLe(p + kRecordTopology, 8);
    r.tableDigest = getLe(p + kRecordTable, 8);
    const uint8_t* q = p + kRelayHelloRecordPrefix;
    for (size_t k = 0; k < nAddrs; ++k, q += kRelayHelloAddrSize) {
      if (!readAddr(q, &r.addrs, error)) return false;
    }
    for (size_t k = 0; k < nNeighbours; ++k, q += sizeof(uint64_t)) r.neighbours.push_back(getLe(q, 8));
    t->records.push_back(std::move(r));
    p += want;
    left -= want;
  }
  if (left != 0) return fail(error, "HELLO has " + str(left) + " bytes after its last record");
  return true;
}

bool readHello(const uint8_t* body, size_t len, NodeHello* h, HelloTopology* t, std::string* error) {
  if (len < kRelayHelloPrefix) return fail(error, "HELLO body of " + str(len) + " bytes is truncated");
  size_t nAddrs = body[kHelloAddrCount];
  size_t nRoutes = getLe(body + kHelloRouteCount, 2);
  size_t nRecords = body[kHelloRecordCount];
  uint8_t flags = body[kHelloFlags];
  if (body[kHelloReserved8] != 0 || getLe(body + kHelloReserved16, 2) != 0) {
    return fail(error, "HELLO reserved bytes must be 0");
  }
  if ((flags & ~kHelloFlagOverflow) != 0) return fail(error, "HELLO flags " + str(flags) + ": unknown bits set");
  size_t fixed = kRelayHelloPrefix + nAddrs * kRelayHelloAddrSize + nRoutes * kRelayHelloRouteSize;
  if (len < fixed || (nRecords == 0 && len != fixed)) {
    return fail(error, "HELLO with " + str(nAddrs) + " addresses, " + str(nRoutes) + " routes and " + str(nRecords) +
                           " records is " + (nRecords == 0 ? "" : "at least ") + str(fixed) + " body bytes, got " +
                           str(len));
  }
  h->node = getLe(body + kHelloNode, 8);
  const uint8_t* p = body + kRelayHelloPrefix;
  for (size_t i = 0; i < nAddrs; ++i, p += kRelayHelloAddrSize) {
    if (!readAddr(p, &h->addrs, error)) return false;
  }
  for (size_t i = 0; i < nRoutes; ++i, p += kRelayHelloRouteSize) {
    h->routes.push_back({{static_cast<uint32_t>(getLe(p, 4)), p[4]}, p[5]});
  }
  t->overflow = (flags & kHelloFlagOverflow) != 0;
  if (!readRecords(p, len - fixed, nRecords, t, error)) return false;
  return checkHello(*h, error) && checkRecords(*t, error);
}

// --- OPEN ---------------------------------------------------------------------------------

bool checkOpen(const RelayOpen& o, std::string* error) {
  if (o.origin == 0) return fail(error, "OPEN from node 0 (reserved)");
  if (o.twinLeg < 0 || o.twinLeg > 2) return fail(error, "OPEN names two-relay leg " + std::to_string(o.twinLeg) + " (0..2)");
  if (o.hopBudget < 1 || o.hopBudget > kRelayMaxHopBudget) {
    return fail(error, "OPEN hop budget " + std::to_string(o.hopBudget) + " (1.." + str(kRelayMaxHopBudget) + ")");
  }
  if (o.visited.size() > static_cast<size_t>(kRelayMaxHopBudget)) {
    return fail(error, "OPEN lists " + str(o.visited.size()) + " visited relays (at most " +
                           str(kRelayMaxHopBudget) + ")");
  }
  return true;
}

bool readOpen(const uint8_t* body, size_t len, RelayOpen* o, std::string* error) {
  if (len < kRelayOpenPrefix + kHandleSize) return fail(error, "OPEN body of " + str(len) + " bytes is truncated");
  size_t nVisited = body[kOpenVisited];
  if (body[kOpenReserved8] != 0) return fail(error, "OPEN reserved fields must be 0");
  if (body[kOpenTwinLeg] > 2) return fail(error, "OPEN names two-relay leg " + str(body[kOpenTwinLeg]) + " (0..2)");
  size_t want = kRelayOpenPrefix + kHandleSize + nVisited * sizeof(uint64_t);
  if (len != want) {
    return fail(error, "OPEN with " + str(nVisited) + " visited relays is " + str(want) + " body bytes, got " + str(len));
  }
  o->origin = getLe(body + kOpenOrigin, 8);
  o->request = getLe(body + kOpenRequest, 8);
  o->originAddr = static_cast<uint32_t>(getLe(body + kOpenOriginAddr, 4));
  o->twinLeg = body[kOpenTwinLeg];
  o->hopBudget = body[kOpenBudget];
  std::string handleError;
  if (!decodeHandle(body + kRelayOpenPrefix, kHandleSize, &o->target, &handleError)) {
    return fail(error, "OPEN target: " + handleError);
  }
  const uint8_t* p = body + kRelayOpenPrefix + kHandleSize;
  for (size_t i = 0; i < nVisited; ++i, p += sizeof(uint64_t)) o->visited.push_back(getLe(p, 8));
  return checkOpen(*o, error);
}

// --- OPEN-REPLY ---------------------------------------------------------------------------

bool checkReply(const RelayOpenReply& r, std::string* error) {
  if (static_cast<uint16_t>(r.status) > kRelayStatusMax) {
    return fail(error, "OPEN-REPLY status " + str(static_cast<uint16_t>(r.status)) + " is unknown");
  }
  if (r.hops < 0 || r.hops > kRelayMaxHopBudget) {
    return fail(error, "OPEN-REPLY hops " + std::to_string(r.hops) + " (0.." + str(kRelayMaxHopBudget) + ")");
  }
  if (r.status == RelayStatus::Ok && !r.reason.empty()) return fail(error, "OPEN-REPLY Ok with a reason");
  if (r.reason.size() > kRelayMaxReason) {
    return fail(error, "OPEN-REPLY reason of " + str(r.reason.size()) + " bytes (at most " + str(kRelayMaxReason) + ")");
  }
  return true;
}

bool readReply(const uint8_t* body, size_t len, RelayOpenReply* r, std::string* error) {
  if (len < kRelayReplyPrefix) return fail(error, "OPEN-REPLY body of " + str(len) + " bytes is truncated");
  uint16_t status = static_cast<uint16_t>(getLe(body + kReplyStatus, 2));
  size_t reasonLen = getLe(body + kReplyReasonLen, 2);
  if (body[kReplyReserved8] != 0 || getLe(body + kReplyReserved16, 2) != 0) {
    return fail(error, "OPEN-REPLY reserved fields must be 0");
  }
  size_t want = kRelayReplyPrefix + (status == 0 ? kHandleSize : reasonLen);
  if (len != want || (status == 0 && reasonLen != 0)) {
    return fail(error, "OPEN-REPLY with status " + str(status) + " and a " + str(reasonLen) +
                           "-byte reason is " + str(want) + " body bytes, got " + str(len));
  }
  r->request = getLe(body + kReplyRequest, 8);
  r->status = static_cast<RelayStatus>(status);
  r->hops = body[kReplyHops];
  const uint8_t* tail = body + kRelayReplyPrefix;
  if (status == 0) {
    std::string handleError;
    if (!decodeHandle(tail, kHandleSize, &r->leg, &handleError)) return fail(error, "OPEN-REPLY leg: " + handleError);
  } else {
    r->reason.assign(reinterpret_cast<const char*>(tail), reasonLen);
  }
  return checkReply(*r, error);
}

}  // namespace

const char* relayStatusName(RelayStatus s) {
  switch (s) {
    case RelayStatus::Ok: return "ok";
    case RelayStatus::NoRoute: return "no route";
    case RelayStatus::HopBudget: return "hop budget exhausted";
    case RelayStatus::Loop: return "relay loop";
    case RelayStatus::Disabled: return "relay disabled";
    case RelayStatus::NoMemory: return "relay memory cap reached";
    case RelayStatus::PeerRefused: return "peer refused";
    case RelayStatus::BadRequest: return "bad request";
    case RelayStatus::ShuttingDown: return "relay shutting down";
  }
  return "unknown";
}

size_t relayHelloSize(const NodeHello& hello, const HelloTopology& topology) {
  size_t size = kRelayHeaderSize + kRelayHelloPrefix + hello.addrs.size() * kRelayHelloAddrSize +
                hello.routes.size() * kRelayHelloRouteSize;
  for (const TopologyRecord& r : topology.records) size += recordSize(r);
  return size;
}

bool encodeRelay(const RelayMessage& msg, std::vector<uint8_t>* out, std::string* error) {
  std::vector<uint8_t> bytes;
  switch (msg.type) {
    case RelayType::Hello: {
      if (!checkHello(msg.hello, error) || !checkRecords(msg.topology, error)) return false;
      size_t size = relayHelloSize(msg.hello, msg.topology);
      if (size > kRelayMaxHello) {
        return fail(error, "HELLO of " + str(size) + " bytes exceeds " + str(kRelayMaxHello) +
                               " (one datagram): send the view as overflow");
      }
      bytes.assign(size, 0);
      writeHello(msg.hello, msg.topology, bytes.data() + kRelayHeaderSize);
      break;
    }
    case RelayType::Open: {
      const RelayOpen& o = msg.open;
      if (!checkOpen(o, error)) return false;
      bytes.assign(kRelayHeaderSize + kRelayOpenPrefix + kHandleSize + o.visited.size() * sizeof(uint64_t), 0);
      uint8_t* body = bytes.data() + kRelayHeaderSize;
      putLe(body + kOpenOrigin, o.origin, 8);
      putLe(body + kOpenRequest, o.request, 8);
      putLe(body + kOpenOriginAddr, o.originAddr, 4);
      putLe(body + kOpenTwinLeg, static_cast<uint64_t>(o.twinLeg), 1);
      putLe(body + kOpenBudget, static_cast<uint64_t>(o.hopBudget), 1);
      putLe(body + kOpenVisited, o.visited.size(), 1);
      std::string handleError;
      if (!encodeHandle(o.target, body + kRelayOpenPrefix, &handleError)) return fail(error, "OPEN target: " + handleError);
      uint8_t* p = body + kRelayOpenPrefix + kHandleSize;
      for (NodeId v : o.visited) {
        putLe(p, v, 8);
        p += sizeof(uint64_t);
      }
      break;
    }
    case RelayType::OpenReply: {
      const RelayOpenReply& r = msg.reply;
      if (!checkReply(r, error)) return false;
      bool ok = r.status == RelayStatus::Ok;
      bytes.assign(kRelayHeaderSize + kRelayReplyPrefix + (ok ? kHandleSize : r.reason.size()), 0);
      uint8_t* body = bytes.data() + kRelayHeaderSize;
      putLe(body + kReplyRequest, r.request, 8);
      putLe(body + kReplyStatus, static_cast<uint16_t>(r.status), 2);
      putLe(body + kReplyHops, static_cast<uint64_t>(r.hops), 1);
      putLe(body + kReplyReasonLen, r.reason.size(), 2);
      std::string handleError;
      if (ok && !encodeHandle(r.leg, body + kRelayReplyPrefix, &handleError)) {
        return fail(error, "OPEN-REPLY leg: " + handleError);
      }
      if (!ok && !r.reason.empty()) std::memcpy(body + kRelayReplyPrefix, r.reason.data(), r.reason.size());
      break;
    }
    default:
      return fail(error, "unknown message type " + str(static_cast<uint16_t>(msg.type)));
  }
  putHeader(&bytes, msg.type);
  *out = std::move(bytes);
  return true;
}

long relayMessageLength(const uint8_t* in, size_t len, std::string* error) {
  if (len < kRelayHeaderSize) return 0;
  RelayType type;
  uint32_t length = 0;
  if (!checkHeader(in, &type, &length, error)) return -1;
  return static_cast<long>(length);
}

bool parseRelay(const uint8_t* in, size_t len, RelayMessage* out, std::string* error) {
  if (len < kRelayHeaderSize) return fail(error, "message of " + str(len) + " bytes is shorter than the header");
  RelayType type;
  uint32_t length = 0;
  if (!checkHeader(in, &type, &length, error)) return false;
  if (length != len) return fail(error, "header says " + str(length) + " bytes, got " + str(len));
  RelayMessage msg;
  msg.type = type;
  const uint8_t* body = in + kRelayHeaderSize;
  size_t bodyLen = len - kRelayHeaderSize;
  bool ok = type == RelayType::Hello  ? readHello(body, bodyLen, &msg.hello, &msg.topology, error)
            : type == RelayType::Open ? readOpen(body, bodyLen, &msg.open, error)
                                      : readReply(body, bodyLen, &msg.reply, error);
  if (!ok) return false;
  *out = std::move(msg);
  return true;
}

}  // namespace mesh
