// SPDX-License-Identifier: Apache-2.0
#include "mesh/tools/probe_plan.h"

#include <sstream>

#include "mesh/platform/ipv4.h"

namespace mesh {

namespace {

int hexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

std::string addressesText(const std::vector<HandleAddress>& addrs) {
  std::string out;
  for (const HandleAddress& a : addrs) {
    out += (out.empty() ? "" : " ") + formatPrefix(Ipv4Prefix{a.addr, a.prefixLen});
  }
  return out;
}

}  // namespace

std::string encodeProbePorts(const std::string& host, const std::string& version,
                             const std::vector<std::string>& labels,
                             const std::vector<std::vector<uint8_t>>& handles) {
  static const char kHex[] = "0123456789abcdef";
  std::string out = "probe-ports 1\nhost " + (host.empty() ? std::string("?") : host) + "\nversion " + version;
  for (size_t i = 0; i < labels.size() && i < handles.size(); ++i) {
    out += "\nport " + labels[i] + " ";
    for (uint8_t b : handles[i]) {
      out += kHex[b >> 4];
      out += kHex[b & 0xf];
    }
  }
  return out;
}

bool decodeProbePorts(const std::string& text, ProbePorts* out, std::string* error) {
  std::istringstream in(text);
  std::string line;
  if (!std::getline(in, line) || line != "probe-ports 1") {
    *error = "the responder does not speak this probe protocol (a different nccl-mesh version?)";
    return false;
  }
  ProbePorts result;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string kind, label, hex;
    words >> kind;
    if (kind == "host" && (words >> result.host)) continue;
    if (kind == "version") {
      result.version = line.size() > 8 ? line.substr(8) : "";
      continue;
    }
    if (kind != "port" || !(words >> label >> hex) || hex.size() != 2 * kHandleSize) {
      *error = "malformed line from the responder: '" + line.substr(0, 80) + "'";
      return false;
    }
    ProbePeerPort port;
    port.label = label;
    for (size_t i = 0; i < kHandleSize; ++i) {
      int hi = hexValue(hex[2 * i]), lo = hexValue(hex[2 * i + 1]);
      if (hi < 0 || lo < 0) {
        *error = "the responder's handle for " + label + " is not hex";
        return false;
      }
      port.handle[i] = static_cast<uint8_t>(hi << 4 | lo);
    }
    Handle h;
    std::string why;
    if (!decodeHandle(port.handle, kHandleSize, &h, &why)) {
      *error = "the responder's handle for " + label + ": " + why;
      return false;
    }
    port.addrs = h.addrs;
    result.ports.push_back(port);
  }
  *out = result;
  return true;
}

ProbePlan planProbe(const std::vector<LocalNic>& local, const std::vector<ProbePeerPort>& peer) {
  ProbePlan plan;
  std::vector<bool> localUsed(local.size(), false), peerUsed(peer.size(), false);
  for (size_t l = 0; l < local.size(); ++l) {
    for (size_t p = 0; p < peer.size(); ++p) {
      RouteResult r = routeToPeer({local[l]}, peer[p].addrs);
      if (!r.ok()) continue;
      plan.cables.push_back({static_cast<int>(l), static_cast<int>(p), r.routes.front()});
      localUsed[l] = peerUsed[p] = true;
    }
  }
  for (size_t l = 0; l < local.size(); ++l) {
    if (!localUsed[l]) plan.localAlone.push_back(static_cast<int>(l));
  }
  for (size_t p = 0; p < peer.size(); ++p) {
    if (!peerUsed[p]) plan.peerAlone.push_back(static_cast<int>(p));
  }
  return plan;
}

std::string describeLocalPorts(const std::vector<LocalNic>& local) {
  std::string out;
  for (const LocalNic& nic : local) {
    for (const LocalAddress& a : nic.addrs) out += (out.empty() ? "" : ", ") + formatPrefix(a.ip) + " on " + nic.label;
  }
  return out.empty() ? "no usable port" : out;
}

std::string describePeerPorts(const std::vector<ProbePeerPort>& peer) {
  std::string out;
  for (const ProbePeerPort& p : peer) {
    for (const HandleAddress& a : p.addrs) {
      out += (out.empty() ? "" : ", ") + formatPrefix(Ipv4Prefix{a.addr, a.prefixLen}) + " on " + p.label;
    }
  }
  return out.empty() ? "no usable port" : out;
}

std::string describeCable(const ProbeCable& c, const std::vector<LocalNic>& local,
                          const std::vector<ProbePeerPort>& peer, const std::string& peerName) {
  const Route& r = c.route;
  Ipv4Prefix subnet{r.local.addr & prefixMask(r.prefixLen), r.prefixLen};
  return local[c.local].label + " " + formatPrefix(r.local) + " <-> " + peerName + " " + peer[c.peer].label + " " +
         addressesText(peer[c.peer].addrs) + " (subnet " + formatPrefix(subnet) + ")";
}

std::string noCableVerdict(const std::vector<LocalNic>& local, const std::vector<ProbePeerPort>& peer,
                           const std::string& peerName) {
  return "no cable between this node and " + peerName + ": no port here shares a subnet with a port there (this node: " +
         describeLocalPorts(local) + "; " + peerName + ": " + describePeerPorts(peer) +
         "). Check the cabling, and that both ends of each cable have addresses in one subnet of their own";
}

}  // namespace mesh
