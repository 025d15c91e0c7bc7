// SPDX-License-Identifier: Apache-2.0
// Listen-handle encode/decode. The handle crosses NCCL's bootstrap between ranks that may
// run different builds, so every field is written byte by byte in a fixed order and every
// read is bounds-checked (this file is fuzzed; it must build with only include/).
#include "mesh/wire/handle_codec.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "mesh/platform/ipv4.h"
#include "mesh/wire/wire.h"

namespace mesh {

namespace {

constexpr size_t kOffMagic = 0;
constexpr size_t kOffVersion = 4;
constexpr size_t kOffPort = 6;
constexpr size_t kOffToken = 8;
constexpr size_t kOffCount = 16;
constexpr size_t kOffFlags = 17;
constexpr size_t kOffReserved = 18;
static_assert(kOffReserved + 2 == kHandleHeaderSize, "header fields must tile the header");
static_assert(kHandleAddressSize == 4 + 1 + 1, "address: ipv4, prefixLen, nic");

void setError(std::string* error, std::string msg) {
  if (error) *error = std::move(msg);
}

std::string hex(uint64_t value) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  do {
    out.insert(out.begin(), kDigits[value & 0xf]);
    value >>= 4;
  } while (value != 0);
  return "0x" + out;
}

bool checkEncodable(const Handle& handle, std::string* error) {
  if (handle.addrs.empty()) {
    setError(error,
             "this node has no mesh addresses to put in the listen handle (no ACTIVE "
             "RoCEv2 port with an IPv4 address passed NCCL_MESH_HCA); check the ports "
             "with ibv_devinfo, their addresses with 'ip addr', and NCCL_MESH_HCA");
    return false;
  }
  if (handle.addrs.size() > kHandleMaxAddresses) {
    setError(error, "this node has " + std::to_string(handle.addrs.size()) +
                        " mesh addresses but a handle holds at most " +
                        std::to_string(kHandleMaxAddresses) +
                        "; restrict the ports with NCCL_MESH_HCA, or remove the IPv4 addresses no "
                        "mesh cable uses from their netdevs (every address of a port counts)");
    return false;
  }
  for (const HandleAddress& a : handle.addrs) {
    if (a.prefixLen > 32) {
      setError(error, "mesh address " + formatIpv4(a.addr) + " has prefix length " +
                          std::to_string(a.prefixLen) + " (at most 32)");
      return false;
    }
  }
  return true;
}

// Checks the fixed header; on success *count is the number of addresses announced.
bool decodeHeader(const uint8_t* in, size_t len, Handle* h, size_t* count, std::string* error) {
  if (len < kHandleHeaderSize) {
    setError(error, "listen handle truncated: " + std::to_string(len) +
                        " bytes, the header alone is " + std::to_string(kHandleHeaderSize));
    return false;
  }
  uint32_t magic = static_cast<uint32_t>(getLe(in + kOffMagic, 4));
  if (magic != kHandleMagic) {
    setError(error, "listen handle has magic " + hex(magic) + ", not nccl-mesh's " +
                        hex(kHandleMagic) +
                        "; every rank must load the same network plugin "
                        "(NCCL_NET_PLUGIN=mesh)");
    return false;
  }
  uint16_t version = static_cast<uint16_t>(getLe(in + kOffVersion, 2));
  if (version != kHandleVersion) {
    setError(error, "listen handle version " + std::to_string(version) +
                        " is not supported (this build speaks " + std::to_string(kHandleVersion) +
                        "); run the same nccl-mesh version on every node");
    return false;
  }
  *count = in[kOffCount];
  if (*count == 0 || *count > kHandleMaxAddresses) {
    setError(error, "listen handle announces " + std::to_string(*count) +
                        " addresses; a valid one has 1.." + std::to_string(kHandleMaxAddresses));
    return false;
  }
  if (in[kOffFlags] != 0 || getLe(in + kOffReserved, 2) != 0) {
    setError(error,
             "listen handle has non-zero reserved fields; the peer runs an "
             "incompatible nccl-mesh version");
    return false;
  }
  h->port = static_cast<uint16_t>(getLe(in + kOffPort, 2));
  h->token = getLe(in + kOffToken, 8);
  return true;
}

}  // namespace

bool encodeHandle(const Handle& handle, uint8_t* out, std::string* error) {
  if (out == nullptr) {
    setError(error, "encodeHandle: no output buffer");
    return false;
  }
  if (!checkEncodable(handle, error)) return false;
  std::memset(out, 0, kHandleSize);
  putLe(out + kOffMagic, kHandleMagic, 4);
  putLe(out + kOffVersion, kHandleVersion, 2);
  putLe(out + kOffPort, handle.port, 2);
  putLe(out + kOffToken, handle.token, 8);
  out[kOffCount] = static_cast<uint8_t>(handle.addrs.size());
  uint8_t* p = out + kHandleHeaderSize;
  for (const HandleAddress& a : handle.addrs) {
    // Network order, as the address appears on the wire and in packet dumps.
    p[0] = static_cast<uint8_t>(a.addr >> 24);
    p[1] = static_cast<uint8_t>(a.addr >> 16);
    p[2] = static_cast<uint8_t>(a.addr >> 8);
    p[3] = static_cast<uint8_t>(a.addr);
    p[4] = a.prefixLen;
    p[5] = a.nic;
    p += kHandleAddressSize;
  }
  return true;
}

bool decodeHandle(const uint8_t* in, size_t len, Handle* out, std::string* error) {
  if (in == nullptr) len = 0;  // treated as an empty (truncated) handle
  Handle h;
  size_t count = 0;
  if (!decodeHeader(in, len, &h, &count, error)) return false;
  size_t need = kHandleHeaderSize + count * kHandleAddressSize;
  if (len < need) {
    setError(error, "listen handle truncated: " + std::to_string(len) + " bytes, but its " +
                        std::to_string(count) + " addresses need " + std::to_string(need));
    return false;
  }
  h.addrs.reserve(count);
  const uint8_t* p = in + kHandleHeaderSize;
  for (size_t i = 0; i < count; ++i, p += kHandleAddressSize) {
    HandleAddress a;
    a.addr = (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
    a.prefixLen = p[4];
    a.nic = p[5];
    if (a.prefixLen > 32) {
      setError(error, "listen handle address " + std::to_string(i) + " (" + formatIpv4(a.addr) +
                          ") has prefix length " + std::to_string(a.prefixLen) +
                          "; at most 32 is valid");
      return false;
    }
    h.addrs.push_back(a);
  }
  // encodeHandle zeroes the tail: a non-zero byte there is corruption in transit (NCCL
  // copies the handle verbatim), caught here instead of connecting on a damaged handle.
  for (size_t i = need; i < std::min(len, kHandleSize); ++i) {
    if (in[i] != 0) {
      setError(error, "listen handle has a non-zero byte at offset " + std::to_string(i) +
                          ", after its last address: the handle was damaged on the way from "
                          "the listening rank");
      return false;
    }
  }
  if (out) *out = std::move(h);
  return true;
}

}  // namespace mesh
