// SPDX-License-Identifier: Apache-2.0
// NCCL_MESH_HCA: which RDMA devices/ports the plugin may use, in NCCL_IB_HCA's syntax.
//   "mlx5"          devices whose name starts with mlx5 (prefix match), every port
//   "=mlx5_0,mlx5_1" exact names only
//   "^rxe_p3"       everything except devices starting with rxe_p3
//   "^=rxe_p3:1"    everything except port 1 of exactly rxe_p3
//   "dev:port"      restricts an entry to one port ("dev:" is every port; NCCL 2.30's
//                   "dev:port:rail:plane" is accepted, the rail and plane ignored)
// Pure code, unit-tested.
#pragma once

#include <string>
#include <vector>

namespace mesh {

struct HcaFilter {
  struct Entry {
    std::string name;
    int port = -1;  // -1: every port
  };
  bool exclude = false;  // leading '^'
  bool exact = false;    // '=' after the optional '^'
  bool named = false;    // the spec listed something (even if no entry of it was usable)
  // Empty with !named: no filter, everything matches. Empty with named (every entry was
  // malformed): an include list matches nothing, an exclude list everything.
  std::vector<Entry> entries;
};

// Parses a filter; malformed entries (empty names, bad port numbers) are reported in
// *error (if given) and skipped: they select nothing, as in NCCL (whose atoi makes a bad
// port 0, which no port is), so an include list of only such entries selects no device.
// The messages do not name the variable: the caller does.
HcaFilter parseHcaFilter(const std::string& spec, std::string* error = nullptr);
bool hcaMatches(const HcaFilter& filter, const std::string& device, int port);

// An RDMA device as the filter sees it: its name and how many ports it has (-1: unknown,
// e.g. a device that could not be opened; any port number then counts as present).
struct HcaDevice {
  std::string name;
  int portCount = -1;
};
// The entries of an include filter that select nothing among `devices` (a typo, or a NIC
// that is missing): each deserves a warning, since the user asked for that device by name.
// Always empty for an exclude filter ('^').
std::vector<HcaFilter::Entry> unmatchedHcaEntries(const HcaFilter& filter,
                                                  const std::vector<HcaDevice>& devices);
// "name" or "name:port", as the user wrote the entry.
std::string hcaEntryText(const HcaFilter::Entry& entry);

}  // namespace mesh
