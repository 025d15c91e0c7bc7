// SPDX-License-Identifier: Apache-2.0
// Handshake message encode/parse. The listener parses bytes from anyone who can reach its
// TCP port, so every field is packed byte by byte in a fixed order, every count is checked
// before it sizes anything, and the whole message length is validated against the counts
// before a single body byte is read. Built standalone into the fuzzer: only include/.
#include "mesh/wire/handshake_proto.h"
#include "mesh/wire/wire.h"

#include <utility>

namespace mesh {

namespace {

// Header: the common MessageHeader (wire.h), then the token.
constexpr size_t kOffToken = kMessageHeaderSize;
static_assert(kOffToken + 8 == kHsHeaderSize, "header fields must tile the header");

// HELLO/ACCEPT body prefix offsets (relative to the end of the header).
constexpr size_t kOffLinkCount = 0;
constexpr size_t kOffQpsPerLink = 1;
constexpr size_t kOffTrafficClass = 2;
constexpr size_t kOffClasses = 3;
static_assert(kOffClasses + 1 == kHsBodyPrefixSize, "prefix fields must tile the prefix");
constexpr uint8_t kClassesCarried = 0x80;  // bit 7 of `classes`
constexpr uint8_t kClassesReserved = 0x40;
constexpr uint8_t kClassesTwinShift = 4;   // bits 4..5: HELLO of a two-relay connection's leg (1 or 2)
constexpr uint8_t kClassesTwinMask = 0x30;
constexpr uint8_t kMaxServiceLevel = 15;

// LinkInfo offsets (the header's layout: flags bit 0 says whether the ECE fields are set).
constexpr size_t kLinkSenderAddr = 0;
constexpr size_t kLinkReceiverAddr = 4;
constexpr size_t kLinkSenderNic = 8;
constexpr size_t kLinkReceiverNic = 9;
constexpr size_t kLinkPrefixLen = 10;
constexpr size_t kLinkFlags = 11;
constexpr size_t kLinkCtrlAddr = 12;
constexpr size_t kLinkCtrlRkey = 20;
constexpr size_t kLinkEceVendor = 24;
constexpr size_t kLinkEceOptions = 28;
static_assert(kLinkEceOptions + 4 == kHsLinkSize, "link fields must tile LinkInfo");
constexpr uint8_t kLinkFlagEce = 1;

// QpInfo offsets.
constexpr size_t kQpQpn = 0;
constexpr size_t kQpPsn = 4;
constexpr size_t kQpGid = 8;
constexpr size_t kQpGidIndex = 24;
constexpr size_t kQpMtu = 25;
constexpr size_t kQpReserved16 = 26;
constexpr size_t kQpReserved32 = 28;
static_assert(kQpGid + 16 == kQpGidIndex, "gid is 16 bytes");
static_assert(kQpReserved32 + 4 == kHsQpSize, "qp fields must tile QpInfo");

constexpr uint32_t kMax24Bits = 0xffffffu;  // QPNs and PSNs are 24-bit on the wire of IB
constexpr uint8_t kMinMtu = 1;              // IBV_MTU_256
constexpr uint8_t kMaxMtu = 5;              // IBV_MTU_4096
constexpr uint8_t kMaxPrefixLen = 32;       // IPv4
constexpr size_t kMaxRejectMessage = kHsHeaderSize + kHsMaxReason;

bool fail(std::string* error, std::string msg) {
  if (error) *error = "handshake: " + std::move(msg);
  return false;
}

std::string hex(uint64_t value, int minDigits) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  while (value != 0 || static_cast<int>(out.size()) < minDigits) {
    out.insert(out.begin(), kDigits[value & 0xf]);
    value >>= 4;
  }
  return "0x" + out;
}

std::string str(uint64_t value) { return std::to_string(value); }

const char* typeName(HsType type) {
  switch (type) {
    case HsType::Hello: return "HELLO";
    case HsType::Accept: return "ACCEPT";
    case HsType::Ready: return "READY";
    case HsType::Reject: return "REJECT";
  }
  return "unknown";
}

bool knownType(uint16_t type) {
  return type >= static_cast<uint16_t>(HsType::Hello) && type <= static_cast<uint16_t>(HsType::Reject);
}

bool carriesQps(HsType type) { return type == HsType::Hello || type == HsType::Accept; }

size_t qpMessageSize(size_t links, size_t qpsPerLink) {
  return kHsHeaderSize + kHsBodyPrefixSize + links * kHsLinkSize + links * qpsPerLink * kHsQpSize;
}

// Header fields every message must satisfy; `in` holds at least kHsHeaderSize bytes. On
// success *out is the decoded header (its type known, its length within the limits).
// Per-type length limits are checked here too, so the reader never buffers more than the
// announced type can legitimately need.
bool checkHeader(const uint8_t* in, MessageHeader* out, std::string* error) {
  MessageHeader h = getMessageHeader(in);
  if (h.magic != kHsMagic) {
    return fail(error, "bad magic " + hex(h.magic, 8) + ", not an nccl-mesh peer (expected " +
                           hex(kHsMagic, 8) + ")");
  }
  if (h.version != kHsVersion) {
    return fail(error, "peer speaks protocol version " + str(h.version) + ", this build speaks " +
                           str(kHsVersion) + "; run the same nccl-mesh version on every node");
  }
  if (!knownType(h.type)) return fail(error, "unknown message type " + str(h.type));
  HsType type = static_cast<HsType>(h.type);
  uint32_t length = h.length;
  if (length < kHsHeaderSize) {
    return fail(error, "length " + str(length) + " is shorter than the " + str(kHsHeaderSize) +
                           "-byte header");
  }
  if (length > kHsMaxMessage) {
    return fail(error, "length " + str(length) + " exceeds " + str(kHsMaxMessage));
  }
  if (h.reserved != 0 && type != HsType::Hello) {
    return fail(error, "origin header field is " + hex(h.reserved, 1) + "; in " + typeName(type) +
                           " it must be 0 (only a relay's HELLO names an origin)");
  }
  if (type == HsType::Ready && length != kHsHeaderSize) {
    return fail(error, "READY carries " + str(length - kHsHeaderSize) +
                           " body bytes, must be empty");
  }
  if (type == HsType::Reject && length > kMaxRejectMessage) {
    return fail(error, "REJECT reason of " + str(length - kHsHeaderSize) + " bytes exceeds " +
                           str(kHsMaxReason));
  }
  *out = h;
  return true;
}

bool checkCounts(HsType type, size_t links, size_t qpsPerLink, std::string* error) {
  if (links == 0 || links > static_cast<size_t>(kHsMaxLinks)) {
    return fail(error, std::string(typeName(type)) + " has " + str(links) + " links (" +
                           (links == 0 ? "min 1" : "max " + str(kHsMaxLinks)) + ")");
  }
  if (qpsPerLink == 0 || qpsPerLink > static_cast<size_t>(kHsMaxQpsPerLink)) {
    return fail(error, std::string(typeName(type)) + " has " + str(qpsPerLink) +
                           " QPs per link (" +
                           (qpsPerLink == 0 ? "min 1" : "max " + str(kHsMaxQpsPerLink)) + ")");
  }
  return true;
}

bool checkLink(const HsLink& link, size_t index, std::string* error) {
  if (link.prefixLen > kMaxPrefixLen) {
    return fail(error, "link " + str(index) + " has IPv4 prefix length " + str(link.prefixLen) +
                           " (max 32)");
  }
  return true;
}

bool checkQp(const HsQp& qp, size_t index, std::string* error) {
  if (qp.qpn > kMax24Bits) {
    return fail(error, "QP " + str(index) + " has qpn " + hex(qp.qpn, 1) + ", above 24 bits");
  }
  if (qp.psn > kMax24Bits) {
    return fail(error, "QP " + str(index) + " has psn " + hex(qp.psn, 1) + ", above 24 bits");
  }
  if (qp.mtu < kMinMtu || qp.mtu > kMaxMtu) {
    return fail(error, "QP " + str(index) + " has mtu " + str(qp.mtu) +
                           ", outside 1..5 (enum ibv_mtu)");
  }
  return true;
}

bool checkEncodable(const HsMessage& msg, std::string* error) {
  if (!knownType(static_cast<uint16_t>(msg.type))) {
    return fail(error, "cannot encode unknown message type " + str(static_cast<uint16_t>(msg.type)));
  }
  if (msg.type == HsType::Reject && msg.reason.size() > kHsMaxReason) {
    return fail(error, "REJECT reason of " + str(msg.reason.size()) + " bytes exceeds " +
                           str(kHsMaxReason));
  }
  if (msg.originAddr != 0 && msg.type != HsType::Hello) {
    return fail(error, std::string(typeName(msg.type)) + " cannot name an origin (only a relay's HELLO does)");
  }
  if (msg.twinLeg < 0 || msg.twinLeg > 2 || (msg.twinLeg != 0 && msg.type != HsType::Hello)) {
    return fail(error, std::string(typeName(msg.type)) + " cannot be leg " + std::to_string(msg.twinLeg) +
                           " of a two-relay connection (only a HELLO names leg 1 or 2)");
  }
  if (!carriesQps(msg.type)) return true;
  size_t qpsPerLink = msg.qpsPerLink < 0 ? 0 : static_cast<size_t>(msg.qpsPerLink);
  if (!checkCounts(msg.type, msg.links.size(), qpsPerLink, error)) return false;
  if (msg.qps.size() != msg.links.size() * qpsPerLink) {
    return fail(error, std::string(typeName(msg.type)) + " lists " + str(msg.qps.size()) +
                           " QPs for " + str(msg.links.size()) + " links x " + str(qpsPerLink) +
                           " QPs");
  }
  for (size_t i = 0; i < msg.links.size(); ++i) {
    if (!checkLink(msg.links[i], i, error)) return false;
  }
  for (size_t i = 0; i < msg.qps.size(); ++i) {
    if (!checkQp(msg.qps[i], i, error)) return false;
  }
  if (msg.trafficClass >= 0 &&
      (msg.trafficClass > 255 || msg.serviceLevel < 0 || msg.serviceLevel > kMaxServiceLevel)) {
    return fail(error, "traffic class " + str(static_cast<uint64_t>(msg.trafficClass)) + " / service level " +
                           std::to_string(msg.serviceLevel) + " out of range (0..255 / 0..15)");
  }
  return true;
}

// Bytes 2..3 of a HELLO/ACCEPT body: the connection's traffic class and service level.
bool getClasses(const uint8_t* prefix, HsMessage* msg, std::string* error) {
  uint8_t tc = prefix[kOffTrafficClass];
  uint8_t classes = prefix[kOffClasses];
  int twin = (classes & kClassesTwinMask) >> kClassesTwinShift;
  classes = static_cast<uint8_t>(classes & ~kClassesTwinMask);
  if ((classes & kClassesReserved) != 0 || (!(classes & kClassesCarried) && (classes != 0 || tc != 0))) {
    return fail(error, std::string(typeName(msg->type)) + " has non-zero reserved bytes after the counts");
  }
  if (twin == 3 || (twin != 0 && msg->type != HsType::Hello)) {
    return fail(error, std::string(typeName(msg->type)) + " names two-relay leg " + std::to_string(twin) +
                           " (only a HELLO may, as leg 1 or 2)");
  }
  msg->twinLeg = twin;
  if (classes & kClassesCarried) {
    msg->trafficClass = tc;
    msg->serviceLevel = classes & 0x0f;
  }
  return true;
}

void putLink(uint8_t* p, const HsLink& link) {
  putLe(p + kLinkSenderAddr, link.senderAddr, 4);
  putLe(p + kLinkReceiverAddr, link.receiverAddr, 4);
  p[kLinkSenderNic] = link.senderNic;
  p[kLinkReceiverNic] = link.receiverNic;
  p[kLinkPrefixLen] = link.prefixLen;
  putLe(p + kLinkCtrlAddr, link.ctrlAddr, 8);
  putLe(p + kLinkCtrlRkey, link.ctrlRkey, 4);
  if (link.hasEce) {
    p[kLinkFlags] = kLinkFlagEce;
    putLe(p + kLinkEceVendor, link.eceVendor, 4);
    putLe(p + kLinkEceOptions, link.eceOptions, 4);
  }
}

void putQp(uint8_t* p, const HsQp& qp) {
  putLe(p + kQpQpn, qp.qpn, 4);
  putLe(p + kQpPsn, qp.psn, 4);
  for (size_t i = 0; i < sizeof(qp.gid); ++i) p[kQpGid + i] = qp.gid[i];
  p[kQpGidIndex] = qp.gidIndex;
  p[kQpMtu] = qp.mtu;
}

bool allZero(const uint8_t* p, size_t bytes) {
  for (size_t i = 0; i < bytes; ++i) {
    if (p[i] != 0) return false;
  }
  return true;
}

bool getLink(const uint8_t* p, size_t index, HsLink* link, std::string* error) {
  if ((p[kLinkFlags] & ~kLinkFlagEce) != 0 ||
      ((p[kLinkFlags] & kLinkFlagEce) == 0 && !allZero(p + kLinkEceVendor, kHsLinkSize - kLinkEceVendor))) {
    return fail(error, "link " + str(index) + " has non-zero reserved bytes");
  }
  link->hasEce = (p[kLinkFlags] & kLinkFlagEce) != 0;
  if (link->hasEce) {
    link->eceVendor = static_cast<uint32_t>(getLe(p + kLinkEceVendor, 4));
    link->eceOptions = static_cast<uint32_t>(getLe(p + kLinkEceOptions, 4));
  }
  link->senderAddr = static_cast<uint32_t>(getLe(p + kLinkSenderAddr, 4));
  link->receiverAddr = static_cast<uint32_t>(getLe(p + kLinkReceiverAddr, 4));
  link->senderNic = p[kLinkSenderNic];
  link->receiverNic = p[kLinkReceiverNic];
  link->prefixLen = p[kLinkPrefixLen];
  link->ctrlAddr = getLe(p + kLinkCtrlAddr, 8);
  link->ctrlRkey = static_cast<uint32_t>(getLe(p + kLinkCtrlRkey, 4));
  return checkLink(*link, index, error);
}

bool getQp(const uint8_t* p, size_t index, HsQp* qp, std::string* error) {
  if (!allZero(p + kQpReserved16, kHsQpSize - kQpReserved16)) {
    return fail(error, "QP " + str(index) + " has non-zero reserved bytes");
  }
  qp->qpn = static_cast<uint32_t>(getLe(p + kQpQpn, 4));
  qp->psn = static_cast<uint32_t>(getLe(p + kQpPsn, 4));
  for (size_t i = 0; i < sizeof(qp->gid); ++i) qp->gid[i] = p[kQpGid + i];
  qp->gidIndex = p[kQpGidIndex];
  qp->mtu = p[kQpMtu];
  return checkQp(*qp, index, error);
}

// HELLO/ACCEPT body. `len` equals the header's length, so the check that it matches the
// counts exactly is what keeps every later read inside in[0, len).
bool parseQpBody(const uint8_t* in, size_t len, HsMessage* msg, std::string* error) {
  const char* name = typeName(msg->type);
  size_t body = len - kHsHeaderSize;
  if (body < kHsBodyPrefixSize) {
    return fail(error, std::string(name) + " body truncated: " + str(body) +
                           " bytes, needs at least " + str(kHsBodyPrefixSize));
  }
  const uint8_t* prefix = in + kHsHeaderSize;
  size_t links = prefix[kOffLinkCount];
  size_t qpsPerLink = prefix[kOffQpsPerLink];
  if (!checkCounts(msg->type, links, qpsPerLink, error)) return false;
  if (!getClasses(prefix, msg, error)) return false;
  size_t need = qpMessageSize(links, qpsPerLink);
  if (len != need) {
    return fail(error, std::string(name) + " with " + str(links) + " links x " + str(qpsPerLink) +
                           " QPs must be " + str(need) + " bytes, got " + str(len));
  }
  msg->qpsPerLink = static_cast<int>(qpsPerLink);
  msg->links.resize(links);
  msg->qps.resize(links * qpsPerLink);
  const uint8_t* p = prefix + kHsBodyPrefixSize;
  for (size_t i = 0; i < links; ++i, p += kHsLinkSize) {
    if (!getLink(p, i, &msg->links[i], error)) return false;
  }
  for (size_t i = 0; i < msg->qps.size(); ++i, p += kHsQpSize) {
    if (!getQp(p, i, &msg->qps[i], error)) return false;
  }
  return true;
}

}  // namespace

bool encodeHandshake(const HsMessage& msg, std::vector<uint8_t>* out, std::string* error) {
  if (out == nullptr) return fail(error, "encodeHandshake: no output buffer");
  if (!checkEncodable(msg, error)) return false;
  size_t length = kHsHeaderSize;
  if (carriesQps(msg.type)) {
    length = qpMessageSize(msg.links.size(), static_cast<size_t>(msg.qpsPerLink));
  } else if (msg.type == HsType::Reject) {
    length += msg.reason.size();
  }
  out->assign(length, 0);
  uint8_t* p = out->data();
  MessageHeader h;
  h.magic = kHsMagic;
  h.version = kHsVersion;
  h.type = static_cast<uint16_t>(msg.type);
  h.length = static_cast<uint32_t>(length);
  h.reserved = msg.originAddr;  // the origin field (0 but in a relay's HELLO)
  putMessageHeader(p, h);
  putLe(p + kOffToken, msg.token, 8);
  p += kHsHeaderSize;
  if (msg.type == HsType::Reject) {
    for (size_t i = 0; i < msg.reason.size(); ++i) p[i] = static_cast<uint8_t>(msg.reason[i]);
  } else if (carriesQps(msg.type)) {
    p[kOffLinkCount] = static_cast<uint8_t>(msg.links.size());
    p[kOffQpsPerLink] = static_cast<uint8_t>(msg.qpsPerLink);
    if (msg.trafficClass >= 0) {
      p[kOffTrafficClass] = static_cast<uint8_t>(msg.trafficClass);
      p[kOffClasses] = static_cast<uint8_t>(kClassesCarried | msg.serviceLevel);
    }
    p[kOffClasses] = static_cast<uint8_t>(p[kOffClasses] | (msg.twinLeg << kClassesTwinShift));
    p += kHsBodyPrefixSize;
    for (const HsLink& link : msg.links) {
      putLink(p, link);
      p += kHsLinkSize;
    }
    for (const HsQp& qp : msg.qps) {
      putQp(p, qp);
      p += kHsQpSize;
    }
  }
  return true;
}

long handshakeLength(const uint8_t* in, size_t len, std::string* error) {
  if (in == nullptr || len < kHsHeaderSize) return 0;
  MessageHeader h;
  if (!checkHeader(in, &h, error)) return -1;
  return static_cast<long>(h.length);
}

bool parseHandshake(const uint8_t* in, size_t len, HsMessage* out, std::string* error) {
  if (in == nullptr) len = 0;  // treated as an empty (truncated) message
  if (len < kHsHeaderSize) {
    return fail(error, "truncated header: " + str(len) + " bytes of " + str(kHsHeaderSize));
  }
  MessageHeader h;
  if (!checkHeader(in, &h, error)) return false;
  if (h.length != len) {
    return fail(error, "header says " + str(h.length) + " bytes, the message has " + str(len));
  }
  HsMessage msg;
  msg.type = static_cast<HsType>(h.type);
  msg.token = getLe(in + kOffToken, 8);
  msg.originAddr = h.reserved;  // the origin field (0 but in a relay's HELLO)
  if (carriesQps(msg.type)) {
    if (!parseQpBody(in, len, &msg, error)) return false;
  } else if (msg.type == HsType::Reject) {
    msg.reason.assign(reinterpret_cast<const char*>(in + kHsHeaderSize), len - kHsHeaderSize);
  }
  if (out) *out = std::move(msg);
  return true;
}

}  // namespace mesh
