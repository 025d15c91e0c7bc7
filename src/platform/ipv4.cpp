// SPDX-License-Identifier: Apache-2.0
// IPv4 helpers for routing and the handle codec. Pure: no sockets (inet_pton accepts
// forms we do not want, and this file must build standalone for the fuzzer).
#include "mesh/platform/ipv4.h"

#include <arpa/inet.h>

#include <cstdio>

namespace mesh {

namespace {

// Parses a decimal number of 1..maxDigits digits with no sign and no leading zero
// (so "010" is rejected rather than read as octal or decimal, which tools disagree on).
// Advances *pos past the digits.
bool parseDecimal(const std::string& text, size_t* pos, size_t maxDigits, uint32_t* out) {
  size_t start = *pos;
  uint32_t value = 0;
  size_t i = start;
  while (i < text.size() && text[i] >= '0' && text[i] <= '9' && i - start < maxDigits) {
    value = value * 10 + static_cast<uint32_t>(text[i] - '0');
    ++i;
  }
  size_t digits = i - start;
  if (digits == 0) return false;
  if (digits > 1 && text[start] == '0') return false;
  if (i < text.size() && text[i] >= '0' && text[i] <= '9') return false;  // too many digits
  *pos = i;
  *out = value;
  return true;
}

// Parses a dotted quad starting at *pos, stopping at the first character after it.
bool parseQuadAt(const std::string& text, size_t* pos, uint32_t* out) {
  uint32_t addr = 0;
  for (int octet = 0; octet < 4; ++octet) {
    if (octet > 0) {
      if (*pos >= text.size() || text[*pos] != '.') return false;
      ++*pos;
    }
    uint32_t value = 0;
    if (!parseDecimal(text, pos, 3, &value) || value > 255) return false;
    addr = (addr << 8) | value;
  }
  *out = addr;
  return true;
}

}  // namespace

uint32_t prefixMask(uint8_t prefixLen) {
  if (prefixLen == 0) return 0;  // a shift by 32 would be undefined
  if (prefixLen >= 32) return 0xffffffffu;
  return 0xffffffffu << (32 - prefixLen);
}

bool sameSubnet(uint32_t a, uint32_t b, uint8_t prefixLen) {
  return ((a ^ b) & prefixMask(prefixLen)) == 0;
}

std::string formatIpv4(uint32_t addr) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%u.%u.%u.%u", (addr >> 24) & 0xffu, (addr >> 16) & 0xffu,
                (addr >> 8) & 0xffu, addr & 0xffu);
  return buf;
}

std::string formatPrefix(const Ipv4Prefix& p) {
  return formatIpv4(p.addr) + "/" + std::to_string(static_cast<unsigned>(p.prefixLen));
}

bool parseIpv4(const std::string& text, uint32_t* out) {
  size_t pos = 0;
  uint32_t addr = 0;
  if (!parseQuadAt(text, &pos, &addr) || pos != text.size()) return false;
  if (out) *out = addr;
  return true;
}

bool parsePrefix(const std::string& text, Ipv4Prefix* out) {
  size_t pos = 0;
  uint32_t addr = 0;
  if (!parseQuadAt(text, &pos, &addr)) return false;
  uint32_t len = 32;
  if (pos < text.size()) {
    if (text[pos] != '/') return false;
    ++pos;
    if (!parseDecimal(text, &pos, 2, &len) || len > 32 || pos != text.size()) return false;
  }
  if (out) {
    out->addr = addr;
    out->prefixLen = static_cast<uint8_t>(len);
  }
  return true;
}

sockaddr_in ipv4SockAddr(uint32_t addr, uint16_t port) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(addr);
  sa.sin_port = htons(port);
  return sa;
}

}  // namespace mesh
