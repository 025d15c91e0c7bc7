// SPDX-License-Identifier: Apache-2.0
// Subnet routing: which local port(s) reach a peer. In a switchless mesh every cable is
// its own subnet, so the local address that shares a subnet with one of the peer's
// addresses identifies the port cabled to that peer. Pure functions, unit-tested.
//
// This module is the one owner of the routing decision for both ends of a connection:
// the connect side (connectRoutes: which cables to a listener's handle) and the accept
// side (acceptRoutes: which local ports the links a HELLO names land on). Callers (net.cpp,
// the handshake, later the relay) only apply the result.
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
//  - Several local and several peer ports in one subnet (the functions of one cable end, as
//    on a DGX Spark) are paired, the i-th with the i-th: max(n, m) routes, not n x m, so
//    every function at both ends carries an equal share.
#pragma once

#include <string>
#include <vector>

#include "mesh/platform/ipv4.h"
#include "mesh/wire/handle_codec.h"
#include "mesh/wire/handshake_proto.h"

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

// True when each side's subnet contains the other side's address: both ends then agree
// the link is on-link (a /16 facing a /24 would otherwise be on-link for one end only).
bool onSameLink(const Ipv4Prefix& a, const Ipv4Prefix& b);

RouteResult routeToPeer(const std::vector<LocalNic>& nics, const std::vector<HandleAddress>& peer);

// Connect side: the routes a connect to the listener whose handle lists `peer` uses,
// routeToPeer's order, at most maxLinks of them (a HELLO carries at most kHsMaxLinks): the
// longest-prefix, lowest-NIC links are kept. maxLinks 0 counts as 1.
RouteResult connectRoutes(const std::vector<LocalNic>& nics, const std::vector<HandleAddress>& peer,
                          size_t maxLinks);

// What a HELLO or ACCEPT says about one of its author's routes: the author's ("sender")
// and the recipient's ("receiver") address and NIC on the link, and the prefix length.
// acceptRoutes reads these back on the other end. Control-region fields stay zero.
HsLink linkForRoute(const Route& route);

// Accept side: maps each link of a connector's HELLO onto our NIC and address, in the
// HELLO's order (the data path pairs routes by index on both ends). A HELLO names our NIC
// index and address; we do not take its word for it: the NIC must hold that address and
// the address's subnet must contain the connector's. Fails, with *error naming the link,
// on the first link that does not match, or when the HELLO names no link.
RouteResult acceptRoutes(const std::vector<LocalNic>& nics, const std::vector<HsLink>& links);

}  // namespace mesh
