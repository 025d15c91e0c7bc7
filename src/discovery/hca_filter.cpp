// SPDX-License-Identifier: Apache-2.0
// NCCL_MESH_HCA parsing and matching, with NCCL_IB_HCA's semantics so that users can
// copy a value they already use with NCCL's own IB transport.
#include "mesh/discovery/hca_filter.h"
#include "mesh/platform/text.h"

#include <cctype>
#include <vector>

namespace mesh {

namespace {

// IB port numbers are 8-bit and start at 1.
constexpr int kMaxPort = 255;

// "1".."255" only: a typo such as "mlx5_0:l" must not silently widen to every port.
bool parsePort(const std::string& text, int* port) {
  if (text.empty() || text.size() > 3) return false;
  int value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    value = value * 10 + (c - '0');
  }
  if (value < 1 || value > kMaxPort) return false;
  *port = value;
  return true;
}

void appendError(std::string* error, const std::string& msg) {
  if (!error) return;
  if (!error->empty()) *error += "; ";
  *error += msg;
}

// Parses one comma-separated entry, "name[:port[:rail[:plane]]]" as NCCL 2.30 reads it
// (misc/utils.cc parseStringList): an empty or absent port is every port; the rail and plane
// (NCCL's own rail planning) are accepted and ignored, the mesh has no rails. False (with a
// reason in *why) when it is malformed.
bool parseEntry(const std::string& raw, HcaFilter::Entry* entry, std::string* why) {
  std::string text = trim(raw);
  if (text.empty()) {
    *why = "empty entry";
    return false;
  }
  std::vector<std::string> fields;
  for (size_t start = 0;;) {
    size_t colon = text.find(':', start);
    fields.push_back(trim(text.substr(start, colon == std::string::npos ? std::string::npos : colon - start)));
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  entry->name = fields[0];
  entry->port = -1;
  if (entry->name.empty()) {
    *why = "entry '" + text + "' has no device name";
    return false;
  }
  if (fields.size() > 4) {
    *why = "entry '" + text + "' has more fields than name:port:rail:plane";
    return false;
  }
  if (fields.size() > 1 && !fields[1].empty() && !parsePort(fields[1], &entry->port)) {
    *why = "entry '" + text + "' has port '" + fields[1] + "'; a port is a number 1.." + std::to_string(kMaxPort);
    return false;
  }
  for (size_t i = 2; i < fields.size(); ++i) {
    for (char c : fields[i]) {
      if (c < '0' || c > '9') {
        *why = "entry '" + text + "' has " + (i == 2 ? "rail" : "plane") + " '" + fields[i] + "'; a number";
        return false;
      }
    }
  }
  return true;
}

bool nameMatches(const HcaFilter& filter, const HcaFilter::Entry& entry, const std::string& device) {
  return filter.exact ? device == entry.name : device.compare(0, entry.name.size(), entry.name) == 0;
}

}  // namespace

HcaFilter parseHcaFilter(const std::string& spec, std::string* error) {
  HcaFilter filter;
  std::string rest = trim(spec);
  if (!rest.empty() && rest[0] == '^') {
    filter.exclude = true;
    rest = trim(rest.substr(1));
  }
  if (!rest.empty() && rest[0] == '=') {
    filter.exact = true;
    rest = rest.substr(1);
  }
  if (trim(rest).empty()) {
    // "^" or "=" alone names nothing; treating it as "no filter" is the only reading
    // that does not disable every device, but the user meant something, so say so.
    if (filter.exclude || filter.exact) {
      appendError(error, "'" + trim(spec) + "' names no device; ignoring it");
    }
    return HcaFilter{};
  }
  filter.named = true;
  size_t start = 0;
  while (start <= rest.size()) {
    size_t comma = rest.find(',', start);
    if (comma == std::string::npos) comma = rest.size();
    HcaFilter::Entry entry;
    std::string why;
    if (parseEntry(rest.substr(start, comma - start), &entry, &why)) {
      filter.entries.push_back(entry);
    } else {
      appendError(error, why + ", skipped");
    }
    start = comma + 1;
  }
  return filter;
}

bool hcaMatches(const HcaFilter& filter, const std::string& device, int port) {
  // Every entry malformed: an include list still selects only what it names, which is
  // nothing (as NCCL_IB_HCA's "mlx5_0:0"); an exclude list excludes nothing.
  if (filter.entries.empty()) return filter.exclude || !filter.named;
  bool listed = false;
  for (const HcaFilter::Entry& e : filter.entries) {
    if (nameMatches(filter, e, device) && (e.port == -1 || e.port == port)) {
      listed = true;
      break;
    }
  }
  return filter.exclude ? !listed : listed;
}

std::string hcaEntryText(const HcaFilter::Entry& entry) {
  return entry.port == -1 ? entry.name : entry.name + ":" + std::to_string(entry.port);
}

std::vector<HcaFilter::Entry> unmatchedHcaEntries(const HcaFilter& filter,
                                                  const std::vector<HcaDevice>& devices) {
  std::vector<HcaFilter::Entry> unmatched;
  if (filter.exclude) return unmatched;  // excluding something absent is harmless
  for (const HcaFilter::Entry& e : filter.entries) {
    bool found = false;
    for (const HcaDevice& d : devices) {
      bool portOk = e.port == -1 || d.portCount < 0 || e.port <= d.portCount;
      if (nameMatches(filter, e, d.name) && portOk) {
        found = true;
        break;
      }
    }
    if (!found) unmatched.push_back(e);
  }
  return unmatched;
}

}  // namespace mesh
