// Subnet routing: which local port(s) reach a peer. In a switchless mesh every cable is
// its own subnet, so the local address that shares a subnet with one of the peer's
// addresses identifies the port cabled to that peer. Pure function, unit-tested.
//
// Rules:
//  - A (local address, peer address) pair matches when each side's subnet contains the
//    other side's address (both ends agree the link is on-link, so both pick the same
//    cable).
//  - For each peer address only its longest-prefix local matches count (like a kernel
//    routing table).
//  - One route per physical link = per (local nic, peer nic) pair; when several address
//    pairs land on the same link the longest prefix wins, then the lowest addresses.
//  - Routes are ordered longest prefix first, then by local nic, then peer nic.
//  - Several routes = parallel links to the peer (the data path stripes over them).
#pragma once

#include <string>
#include <vector>

#include "mesh/handle_codec.h"
#include "mesh/ipv4.h"

namespace mesh {

struct LocalAddress {
  Ipv4Prefix ip;
  int gidIndex = -1;  // RoCEv2 GID index of this address on the port
};

struct LocalNic {
  int index = 0;          // index into the node's port list
  std::string label;      // for messages, e.g. "rxe_p1:1/p1"
  std::vector<LocalAddress> addrs;
};

struct Route {
  int localNic = 0;
  int gidIndex = -1;
  Ipv4Prefix local;       // our address on the link
  uint32_t peerAddr = 0;  // the peer's address on the link
  uint8_t peerNic = 0;
  uint8_t prefixLen = 0;  // the matching prefix length (min of both sides)
};

struct RouteResult {
  std::vector<Route> routes;
  std::string error;  // set when routes is empty
  bool ok() const { return !routes.empty(); }
};

RouteResult routeToPeer(const std::vector<LocalNic>& nics, const std::vector<HandleAddress>& peer);

}  // namespace mesh
