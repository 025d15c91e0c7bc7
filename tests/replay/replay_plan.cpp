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

// 198.18.L.(n+1)/P -> link L, node n.
bool labAddress(const std::string& a, int* link, int* node) {
  unsigned b0, b1, b2, b3, prefix;
  char tail;
  if (sscanf(a.c_str(), "%u.%u.%u.%u/%u%c", &b0, &b1, &b2, &b3, &prefix, &tail) != 5) return false;
  if (b0 != 198 || b1 != 18 || b2 > 255 || b3 < 1 || b3 > 255) return false;
  *link = static_cast<int>(b2);
  *node = static_cast<int>(b3) - 1;
  return true;
}

bool nodeOf(const TraceFile& f, int* node, std::string* error) {
  *node = -1;
  for (const std::string& a : f.trace.header.addrs) {
    int link = 0, n = 0;
    if (!labAddress(a, &link, &n)) {
      *error = f.name + ": address " + a +
               " is not on the lab's plan (198.18.L.(node+1)); such traces cannot be "
               "placed on the fabric yet";
      return false;
    }
    if (*node >= 0 && n != *node) {
      *error = f.name + ": its addresses name two nodes (" + std::to_string(*node) + " and " + std::to_string(n) + ")";
      return false;
    }
    *node = n;
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

bool cabling(const Plan& plan, const std::map<size_t, int>& nodeOfFile, Plan* out, std::string* error) {
  // link index -> the nodes whose traces have an address on it
  std::map<int, std::set<int>> linkNodes;
  for (const auto& [file, node] : nodeOfFile) {
    for (const std::string& a : plan.files[file].trace.header.addrs) {
      int link = 0, n = 0;
      labAddress(a, &link, &n);
      linkNodes[link].insert(node);
    }
  }
  std::map<std::pair<int, int>, int> count;
  for (const auto& [link, nodes] : linkNodes) {
    if (nodes.size() != 2) {
      *error = "link 198.18." + std::to_string(link) + ".0/24 has " + std::to_string(nodes.size()) +
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
  std::map<size_t, int> nodeOfFile;
  std::map<std::pair<std::string, long>, ProcessPlan> byProcess;
  for (size_t i = 0; i < plan.files.size(); ++i) {
    int node = 0;
    if (!nodeOf(plan.files[i], &node, error)) return false;
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
  if (!cabling(plan, nodeOfFile, &plan, error)) return false;
  *out = std::move(plan);
  return true;
}

std::string describePlan(const Plan& plan) {
  std::string s = std::to_string(plan.nodes) + " nodes, " + plan.topology + ", " + std::to_string(plan.links) +
                  " link(s) per pair:";
  for (const ProcessPlan& p : plan.processes) {
    s += " " + p.label + " (";
    for (size_t i = 0; i < p.files.size(); ++i) s += (i ? ", " : "") + plan.files[p.files[i]].name;
    s += ")";
  }
  return s;
}

}  // namespace replay
