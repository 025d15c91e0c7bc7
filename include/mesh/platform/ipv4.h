// SPDX-License-Identifier: Apache-2.0
// IPv4 addresses and prefixes as the routing and handle code sees them.
// Pure code: no sockets, no logging. Addresses are held in host byte order.
#pragma once

#include <netinet/in.h>

#include <cstdint>
#include <string>

namespace mesh {

struct Ipv4Prefix {
  uint32_t addr = 0;      // host byte order
  uint8_t prefixLen = 0;  // 0..32
  bool operator==(const Ipv4Prefix& o) const { return addr == o.addr && prefixLen == o.prefixLen; }
};

// Netmask for a prefix length (0 → 0, 32 → 0xffffffff); lengths above 32 clamp to 32.
uint32_t prefixMask(uint8_t prefixLen);
// True when a and b agree on their first prefixLen bits.
bool sameSubnet(uint32_t a, uint32_t b, uint8_t prefixLen);
// "198.18.0.1"
std::string formatIpv4(uint32_t addr);
// The socket address of `addr` (host byte order) and `port`.
sockaddr_in ipv4SockAddr(uint32_t addr, uint16_t port);
// "198.18.0.1/24"
std::string formatPrefix(const Ipv4Prefix& p);
// Strict dotted-quad parser; false on anything else.
bool parseIpv4(const std::string& text, uint32_t* out);
// "a.b.c.d/len" or "a.b.c.d" (→ /32); false on bad input or len > 32.
bool parsePrefix(const std::string& text, Ipv4Prefix* out);

}  // namespace mesh
