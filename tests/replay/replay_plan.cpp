// SPDX-License-Identifier: Apache-2.0
#include "replay_plan.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

namespace replay {
namespace {

bool readFile(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream s;
  s << in.rdbuf();
  *out = s.str();
  return true;
}

std::string baseName(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// Files named on the command line, directories expanded to their *.trace files.
bool expand(const std::vector<std::string>& paths, std::vector<std::string>* out, std::string* error) {
  for (const std::string& p : paths) {
    struct stat st;
    if (stat(p.c_str(), &st) != 0) return (*error = p + ": no such file or directory", false);
    if (!S_ISDIR(st.st_mode)) {
      out->push_back(p);
      continue;
    }
    DIR* d = opendir(p.c_str());
    if (d == nullptr) return (*error = p + ": cannot list the directory", false);
    std::vector<std::string> found;
    while (dirent* e = readdir(d)) {
      std::string n = e->d_name;
      if (n.size() > 6 && n.compare(n.size() - 6, 6, ".trace") == 0) found.push_back(p + "/" + n);
    }
    closedir(d);
    if (found.empty()) return (*error = p + ": no *.trace file in the directory", false);
    std::sort(found.begin(), found.end());
    out->insert(out->end(), found.begin(), found.end());
  }
  return true;
}

// 198.18.S.H/P -> subnet S, host H.
bool labAddress(const std::string& a, int* subnet, int* host) {
  unsigned b0, b1, b2, b3, prefix;
  char tail;
  if (sscanf(a.c_str(), "%u.%u.%u.%u/%u%c", &b0, &b1, &b2, &b3, &prefix, &tail) != 5) return false;
  if (b0 != 198 || b1 != 18 || b2 > 255 || b3 < 1 || b3 > 255) return false;
  *subnet = static_cast<int>(b2);
  *host = static_cast<int>(b3);
  return true;
}

// scripts/fabric-net's second PCIe function of a cable end (--functions 2): node n of cable L
// is 198.18.L.(n+1); its second function is 198.18.L.(kSecond+n+1) with --fn-subnets shared,
// 198.18.(kSecond+L).(n+1) with split (SPLIT_SUBNET_BASE). No plan has a node 127 or more
// (fabric-net cables 16, vmesh 6), so a host number above kSecond is never a first function.
constexpr int kSecond = 128;

// One address read with the plan: which cable, the node at this end, and which function.
struct LabPort {
  int link = 0;  // 198.18.L.0/24, as vmesh numbers the cables
  int node = 0;
  int fn = 0;  // 0, or 1 for the end's second PCIe function
};

std::string subnetName(int subnet) { return "198.18." + std::to_string(subnet) + ".0/24"; }
std::string hostName(int subnet, int host) { return "198.18." + std::to_string(subnet) + "." + std::to_string(host); }

using HostSet = std::set<std::pair<int, int>>;  // (subnet, host) of one file's addresses

bool readAddresses(const std::vector<TraceFile>& files, std::vector<HostSet>* raw, std::string* error) {
  raw->assign(files.size(), {});
  for (size_t i = 0; i < files.size(); ++i) {
    for (const std::string& a : files[i].trace.header.addrs) {
      int subnet = 0, host = 0;
      if (!labAddress(a, &subnet, &host)) {
        *error = files[i].name + ": address " + a +
                 " is not on the lab's plan (198.18.L.(node+1)); such traces cannot be "
                 "placed on the fabric yet";
        return false;
      }
      (*raw)[i].insert({subnet, host});
    }
  }
  return true;
}

// fabric-net takes one --fn-subnets for the job. Split when every address in a subnet from
// kSecond up has its node's first function kSecond below it (a job of more than kSecond
// cables with one function each has addresses there that do not).
bool splitSubnets(const std::vector<HostSet>& raw) {
  bool high = false;
  for (const HostSet& addrs : raw) {
    for (const auto& [subnet, host] : addrs) {
      if (subnet < kSecond) continue;
      if (addrs.count({subnet - kSecond, host}) == 0) return false;
      high = true;
    }
  }
  return high;
}

// One file's addresses as ports; *shared is set when a second function is in its cable's /24.
bool portsOf(const TraceFile& f, const HostSet& addrs, bool split, std::vector<LabPort>* out, bool* shared,
             std::string* error) {
  for (const auto& [subnet, host] : addrs) {
    LabPort p{subnet, host - 1, 0};
    if (split && subnet >= kSecond) {
      p = LabPort{subnet - kSecond, host - 1, 1};
    } else if (host > kSecond) {
      if (addrs.count({subnet, host - kSecond}) == 0) {
        *error = f.name + ": address " + hostName(subnet, host) +
                 " is a second PCIe function (fabric-net --functions 2 numbers node n's 198.18.L.(128+n+1)), "
                 "but the trace has no first function " +
                 hostName(subnet, host - kSecond) + " beside it in " + subnetName(subnet);
        return false;
      }
      p = LabPort{subnet, host - kSecond - 1, 1};
      *shared = true;
    }
    out->push_back(p);
  }
  return true;
}

// fabric-net --functions gives every cable end the same number of functions: each end is
// compared with the first. Sets plan->functions.
bool sameFunctions(const std::vector<TraceFile>& files, const std::vector<std::vector<LabPort>>& ports, Plan* plan,
                   std::string* error) {
  std::string first;
  int firstCount = 0;
  for (size_t i = 0; i < files.size(); ++i) {
    std::map<int, std::set<int>> fns;  // link -> this file's functions on it
    for (const LabPort& p : ports[i]) fns[p.link].insert(p.fn);
    for (const auto& [link, set] : fns) {
      int n = static_cast<int>(set.size());
      std::string end = files[i].name + ": " + std::to_string(n) + " on " + subnetName(link);
      if (first.empty()) {
        first = end;
        firstCount = n;
      } else if (n != firstCount) {
        *error = "cable ends with different numbers of PCIe functions (" + first + "; " + end +
                 "): fabric-net --functions gives every end the same";
        return false;
      }
    }
  }
  plan->functions = std::max(firstCount, 1);
  return true;
}

// Every file's addresses as ports (ports[file]), and the functions per cable end.
bool readPorts(const std::vector<TraceFile>& files, std::vector<std::vector<LabPort>>* ports, Plan* plan,
               std::string* error) {
  std::vector<HostSet> raw;
  if (!readAddresses(files, &raw, error)) return false;
  bool split = splitSubnets(raw), shared = false;
  ports->assign(files.size(), {});
  for (size_t i = 0; i < files.size(); ++i) {
    if (!portsOf(files[i], raw[i], split, &(*ports)[i], &shared, error)) return false;
  }
  if (split && shared) {
    *error =
        "the traces number second PCIe functions both in their cable's /24 (host 128+n+1) and in a /24 of "
        "their own (198.18.(128+L).0/24); fabric-net --fn-subnets takes one";
    return false;
  }
  plan->fnSubnets = split ? "split" : "shared";
  return sameFunctions(files, *ports, plan, error);
}

bool nodeOf(const TraceFile& f, const std::vector<LabPort>& ports, int* node, std::string* error) {
  *node = -1;
  for (const LabPort& p : ports) {
    if (*node >= 0 && p.node != *node) {
      *error =
          f.name + ": its addresses name two nodes (" + std::to_string(*node) + " and " + std::to_string(p.node) + ")";
      return false;
    }
    *node = p.node;
  }
  if (*node < 0) *error = f.name + ": no mesh address recorded (the plugin saw no RDMA port)";
  return *node >= 0;
}

// The pairs fabric-net cables for a topology.
std::set<std::pair<int, int>> pairsOf(const std::string& topology, int nodes) {
  std::set<std::pair<int, int>> p;
  for (int i = 0; i < nodes; ++i) {
    for (int j = i + 1; j < nodes; ++j) {
      bool cabled = topology == "full" || j == i + 1 || (topology == "ring" && i == 0 && j == nodes - 1);
      if (cabled) p.insert({i, j});
    }
  }
  return p;
}

bool cabling(const std::vector<std::vector<LabPort>>& ports, const std::map<size_t, int>& nodeOfFile, Plan* out,
             std::string* error) {
  // link index -> the nodes whose traces have an address on it
  std::map<int, std::set<int>> linkNodes;
  for (const auto& [file, node] : nodeOfFile) {
    for (const LabPort& p : ports[file]) linkNodes[p.link].insert(node);
  }
  std::map<std::pair<int, int>, int> count;
  for (const auto& [link, nodes] : linkNodes) {
    if (nodes.size() != 2) {
      *error = "link " + subnetName(link) + " has " + std::to_string(nodes.size()) +
               " traced node(s), expected 2 (was a node of the job not traced?)";
      return false;
    }
    ++count[{*nodes.begin(), *nodes.rbegin()}];
  }
  std::set<std::pair<int, int>> pairs;
  std::set<int> perPair;
  for (const auto& [pair, n] : count) {
    pairs.insert(pair);
    perPair.insert(n);
  }
  if (perPair.size() != 1) return (*error = "cabled pairs have different numbers of links", false);
  for (const char* t : {"full", "ring", "line"}) {
    if (pairsOf(t, out->nodes) == pairs) {
      out->topology = t;
      out->links = *perPair.begin();
      return true;
    }
  }
  *error = "the recorded cabling of " + std::to_string(out->nodes) + " nodes is none of full, ring and line";
  return false;
}

}  // namespace

bool loadTraces(const std::vector<std::string>& paths, std::vector<TraceFile>* out, std::string* error) {
  std::vector<std::string> files;
  if (!expand(paths, &files, error)) return false;
  if (files.empty()) return (*error = "no trace file given", false);
  for (const std::string& path : files) {
    TraceFile f;
    f.path = path;
    f.name = baseName(path);
    std::string text, why;
    if (!readFile(path, &text)) return (*error = path + ": cannot read", false);
    if (!mesh::trace::parseTrace(text, &f.trace, &why)) return (*error = path + ": " + why, false);
    out->push_back(std::move(f));
  }
  return true;
}

bool makePlan(std::vector<TraceFile> files, Plan* out, std::string* error) {
  Plan plan;
  plan.files = std::move(files);
  std::vector<std::vector<LabPort>> ports;
  if (!readPorts(plan.files, &ports, &plan, error)) return false;
  std::map<size_t, int> nodeOfFile;
  std::map<std::pair<std::string, long>, ProcessPlan> byProcess;
  for (size_t i = 0; i < plan.files.size(); ++i) {
    int node = 0;
    if (!nodeOf(plan.files[i], ports[i], &node, error)) return false;
    nodeOfFile[i] = node;
    const mesh::trace::Header& h = plan.files[i].trace.header;
    ProcessPlan& p = byProcess[{h.host, h.pid}];
    if (!p.files.empty() && p.node != node) return (*error = plan.files[i].name + ": one process, two nodes", false);
    p.node = node;
    p.pid = h.pid;
    p.files.push_back(i);
    plan.nodes = std::max(plan.nodes, node + 1);
  }
  std::set<int> seen;
  for (auto& [key, p] : byProcess) {
    std::sort(p.files.begin(), p.files.end(),
              [&](size_t a, size_t b) { return plan.files[a].trace.header.t0Ns < plan.files[b].trace.header.t0Ns; });
    p.label = "node" + std::to_string(p.node) + " pid " + std::to_string(p.pid);
    seen.insert(p.node);
    plan.processes.push_back(p);
  }
  for (int n = 0; n < plan.nodes; ++n) {
    if (!seen.count(n)) return (*error = "node " + std::to_string(n) + " has no trace", false);
  }
  if (plan.nodes < 2) return (*error = "the traces are of one node only: nothing to replay against", false);
  std::sort(plan.processes.begin(), plan.processes.end(), [](const ProcessPlan& a, const ProcessPlan& b) {
    return a.node != b.node ? a.node < b.node : a.pid < b.pid;
  });
  if (!cabling(ports, nodeOfFile, &plan, error)) return false;
  *out = std::move(plan);
  return true;
}

std::string describePlan(const Plan& plan) {
  std::string s =
      std::to_string(plan.nodes) + " nodes, " + plan.topology + ", " + std::to_string(plan.links) + " link(s) per pair";
  if (plan.functions > 1) {
    s += ", " + std::to_string(plan.functions) + " functions per cable end (" + plan.fnSubnets + " subnets)";
  }
  s += ":";
  for (const ProcessPlan& p : plan.processes) {
    s += " " + p.label + " (";
    for (size_t i = 0; i < p.files.size(); ++i) s += (i ? ", " : "") + plan.files[p.files[i]].name;
    s += ")";
  }
  return s;
}

}  // namespace replay
