// SPDX-License-Identifier: Apache-2.0
// The doctor's facts from files, every path under facts->root: NCCL's configuration files,
// /proc (limits, capabilities, meminfo, the kernel command line, the ARP and reverse-path
// sysctls, the ARP table) and /sys/class/infiniband. A file that cannot be read or parsed
// becomes a problem line naming it (the checks turn those into WARNs), never an exception;
// the ARP table only adds to what the checks know (a switch), so without it none is known.
#include <arpa/inet.h>
#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "mesh/platform/text.h"
#include "mesh/tools/doctor.h"

namespace mesh {

namespace {

// Entry names of a directory, sorted; false (and *error) when it cannot be listed.
bool listDir(const std::string& path, std::vector<std::string>* names, std::string* error) {
  DIR* dir = opendir(path.c_str());
  if (dir == nullptr) {
    *error = "cannot list " + path + ": " + std::strerror(errno);
    return false;
  }
  names->clear();
  while (dirent* e = readdir(dir)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") names->push_back(n);
  }
  closedir(dir);
  std::sort(names->begin(), names->end());
  return true;
}

bool isNumber(const std::string& s) {
  return !s.empty() && s.size() < 9 && s.find_first_not_of("0123456789") == std::string::npos;
}

// The first line of a sysfs/procfs attribute, trimmed; false (with a problem) when unreadable.
bool readAttr(const std::string& path, std::string* value, std::vector<std::string>* problems) {
  std::string text, error;
  if (!readTextFile(path, &text, &error, 4096)) {
    problems->push_back(error);
    return false;
  }
  *value = trim(text.substr(0, text.find('\n')));
  return true;
}

void readConfFile(const std::string& root, const std::string& path, DoctorFacts* facts) {
  ConfFile f;
  f.path = path;
  std::string text, error;
  f.present = access((root + path).c_str(), F_OK) == 0 || errno != ENOENT;
  if (f.present && !readTextFile(root + path, &text, &error)) {
    f.error = error;
  } else if (f.present) {
    parseConfText(text, &f);
  }
  facts->confFiles.push_back(std::move(f));
}

}  // namespace

void parseConfText(const std::string& text, ConfFile* out) {
  std::istringstream in(text);
  std::string line;
  bool crlfNoted = false;
  for (int n = 1; std::getline(in, line); ++n) {
    if (!line.empty() && line.back() == '\r') {
      // NCCL 2.30.3+ drops it (misc/param.cc setEnvFile); before, it stays in the value:
      // "NCCL_NET_PLUGIN=mesh\r" names no plugin, and the job runs without this one.
      line.pop_back();
      if (!crlfNoted && !line.empty() && line[0] != '#' && line.find('=') != std::string::npos) {
        crlfNoted = true;
        out->problems.push_back(strf("line %d ends in a carriage return (Windows line endings): NCCL before "
                                     "2.30.3 keeps it in the value, so '%s' does not set %s as meant; convert "
                                     "the file (dos2unix, or sed -i 's/\\r$//')",
                                     n, line.c_str(), trim(line.substr(0, line.find('='))).c_str()));
      }
    }
    if (line.empty() || line[0] == '#') continue;
    size_t eq = line.find('=');
    if (eq == std::string::npos) {
      if (!trim(line).empty()) {
        out->problems.push_back(strf("line %d ('%s') has no '=': NCCL ignores it", n, line.c_str()));
      }
      continue;
    }
    std::string key = line.substr(0, eq);
    std::string value = line.substr(eq + 1);
    if (trim(key) != key || trim(value) != value) {
      // NCCL takes the bytes as they are: "NCCL_NET = IB" sets a variable named "NCCL_NET ".
      out->problems.push_back(strf("line %d ('%s') has spaces around the name or value: NCCL keeps "
                                   "them, so '%s' does not set %s as meant",
                                   n, line.c_str(), line.c_str(), trim(key).c_str()));
    }
    out->entries.emplace_back(key, value);
  }
}

void readConfFiles(DoctorFacts* facts) {
  auto it = facts->env.find("NCCL_CONF_FILE");
  if (it != facts->env.end() && !it->second.empty()) {
    readConfFile(facts->root, it->second, facts);
  } else if ((it = facts->env.find("HOME")) != facts->env.end() && !it->second.empty()) {
    readConfFile(facts->root, it->second + "/.nccl.conf", facts);
  }
  readConfFile(facts->root, "/etc/nccl.conf", facts);
}

void mergeSettings(DoctorFacts* facts) {
  for (const auto& [key, value] : facts->env) {
    if (key.rfind("NCCL_", 0) == 0 || key.rfind("GLOO_", 0) == 0) facts->nccl[key] = {value, "environment"};
  }
  for (const ConfFile& f : facts->confFiles) {
    for (const auto& [key, value] : f.entries) facts->nccl.emplace(key, SettingSource{value, f.path});
  }
  facts->config = loadConfig(
      [facts](const char* name) -> const char* {
        auto it = facts->nccl.find(name);
        return it == facts->nccl.end() ? nullptr : it->second.value.c_str();
      },
      &facts->configWarnings);
}

void readPinningFacts(DoctorFacts* facts) {
  std::string text, error;
  std::string limits = facts->root + "/proc/self/limits";
  if (!readTextFile(limits, &text, &error)) {
    facts->memlockProblem = error;
  } else if (!parseMemlockLimit(text, &facts->memlock)) {
    facts->memlockProblem = limits + " has no readable 'Max locked memory' line";
  }
  if (readTextFile(facts->root + "/proc/self/status", &text, &error)) parseCapIpcLock(text, &facts->capIpcLock);
  std::string meminfo = facts->root + "/proc/meminfo";
  if (!readTextFile(meminfo, &text, &error)) {
    facts->cmaProblem = error;
  } else if (!parseCma(text, &facts->cma)) {
    facts->cmaProblem = meminfo + " has no CmaTotal/CmaFree lines (a kernel without CMA)";
  }
  if (readTextFile(facts->root + "/proc/cmdline", &text, &error)) facts->kernelCmdline = trim(text);
}

void readSysfsPorts(DoctorFacts* facts) {
  std::string base = facts->root + "/sys/class/infiniband";
  std::vector<std::string> devices, ports, gids, nets;
  std::string error;
  if (!listDir(base, &devices, &error)) return;  // no RDMA class at all: not a problem here
  for (const std::string& dev : devices) {
    if (!listDir(base + "/" + dev + "/ports", &ports, &error)) {
      facts->sysfsProblems.push_back(error);
      continue;
    }
    for (const std::string& p : ports) {
      if (!isNumber(p)) continue;
      std::string pdir = base + "/" + dev + "/ports/" + p;
      PortFact pf;
      pf.device = dev;
      pf.port = std::stoi(p);
      std::string state;
      if (readAttr(pdir + "/state", &state, &facts->sysfsProblems)) {
        size_t colon = state.find(": ");  // "4: ACTIVE"
        pf.state = colon == std::string::npos ? "unknown ('" + state + "')" : state.substr(colon + 2);
      }
      readAttr(pdir + "/link_layer", &pf.linkLayer, &facts->sysfsProblems);
      // The entries the directory has (every index of a real table), each below
      // kGidTableMaxLen; not 0..largest name: one stray gids/2000000 took 45 s and 726 MB.
      std::vector<int> indices;
      if (listDir(pdir + "/gids", &gids, &error)) {
        for (const std::string& g : gids) {
          if (isNumber(g)) indices.push_back(std::stoi(g));
        }
      }
      pf.gids = readSysfsGidIndices(facts->root + "/sys", dev, pf.port, indices, &facts->sysfsProblems);
      for (int i : indices) {
        if (i >= kGidTableMaxLen) {
          facts->sysfsProblems.push_back(pdir + "/gids/" + std::to_string(i) + ": beyond any GID table (" +
                                         std::to_string(kGidTableMaxLen) + " entries at most); skipped");
          break;
        }
      }
      for (const GidEntry& g : pf.gids) {
        if (pf.netdev.empty()) pf.netdev = g.netdev;
      }
      if (pf.netdev.empty() && listDir(base + "/" + dev + "/device/net", &nets, &error) && !nets.empty()) {
        pf.netdev = nets[0];
      }
      facts->ports.push_back(std::move(pf));
    }
  }
  if (!facts->ports.empty()) facts->portsSource = "sysfs";
}

void readSysctls(DoctorFacts* facts) {
  std::vector<std::string> ifaces = {"all"};
  for (const PortFact& p : facts->ports) {
    if (!p.netdev.empty() && std::find(ifaces.begin(), ifaces.end(), p.netdev) == ifaces.end()) {
      ifaces.push_back(p.netdev);
    }
  }
  for (const std::string& i : ifaces) {
    for (const char* key : {"arp_ignore", "arp_announce", "rp_filter"}) {
      std::string path = facts->root + "/proc/sys/net/ipv4/conf/" + i + "/" + key;
      std::string value;
      if (!readAttr(path, &value, &facts->sysctlProblems)) continue;
      if (!isNumber(value)) {
        facts->sysctlProblems.push_back(path + " is not a number: '" + value + "'");
        continue;
      }
      facts->sysctl[i + "/" + key] = std::stoi(value);
    }
  }
}

void readNeighbours(DoctorFacts* facts) {
  // "IP address  HW type  Flags  HW address  Mask  Device", one entry a line after the header.
  // Only complete entries (ATF_COM, 0x2) name a neighbour that answered.
  std::ifstream in(facts->root + "/proc/net/arp");
  std::string line;
  std::getline(in, line);
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string ip, type, flags, mac, mask, dev;
    if (!(fields >> ip >> type >> flags >> mac >> mask >> dev)) continue;
    in_addr a{};
    if (inet_pton(AF_INET, ip.c_str(), &a) != 1) continue;
    if ((std::strtoul(flags.c_str(), nullptr, 16) & 0x2) == 0 || mac == "00:00:00:00:00:00") continue;
    facts->neighbours[dev].insert(ntohl(a.s_addr));
  }
}

int roceMtuForNetdev(int netdevMtu) {
  int room = netdevMtu - 96;
  for (int bytes = 4096; bytes >= 256; bytes /= 2) {
    if (room >= bytes) return bytes;
  }
  return 0;
}

const NetIf* DoctorFacts::netif(const std::string& name) const {
  for (const NetIf& n : netifs) {
    if (n.name == name) return &n;
  }
  return nullptr;
}

const SettingSource* DoctorFacts::setting(const std::string& name) const {
  auto it = nccl.find(name);
  return it == nccl.end() || it->second.value.empty() ? nullptr : &it->second;
}

DoctorFacts collectFacts(const DoctorSources& sources) {
  DoctorFacts facts;
  facts.root = sources.root == "/" ? "" : sources.root;
  facts.env = sources.env;
  facts.nodes = sources.nodes;
  readConfFiles(&facts);
  mergeSettings(&facts);
  readPinningFacts(&facts);
  // The forked probes first: after verbs opens a device (the fabric's starts a thread), a
  // fork would copy a process with more than one thread.
  locateLibraries(sources, &facts);
  if (sources.gpus) facts.gpus = sources.gpus(facts.config);
  for (const char* f : {"/sys/kernel/mm/memory_peers/nv_mem/version", "/sys/module/nvidia_peermem/version",
                        "/sys/module/nv_peer_mem/version"}) {
    if (access((facts.root + f).c_str(), F_OK) == 0) facts.peermem = true;
  }
  if (sources.loadVerbs) facts.verbsError = sources.loadVerbs(facts.config);
  readSysfsPorts(&facts);
  if (facts.ports.empty() && facts.verbsError.empty() && sources.verbsPorts) {
    facts.ports = sources.verbsPorts(facts.config, &facts.portsNote);
    if (!facts.ports.empty()) facts.portsSource = "verbs";
  }
  if (sources.interfaces) facts.netifs = sources.interfaces();
  // Each port's PCI device, for the cable grouping the plugin uses (mesh/discovery/cables.h).
  for (const PortFact& p : facts.ports) {
    if (p.netdev.empty()) continue;
    char* real = realpath((facts.root + "/sys/class/net/" + p.netdev + "/device").c_str(), nullptr);
    if (real == nullptr) continue;
    std::string path = real;
    free(real);
    if (!facts.root.empty() && path.rfind(facts.root, 0) == 0) path = path.substr(facts.root.size());
    facts.netdevPci[p.netdev] = path;
  }
  readSysctls(&facts);
  readNeighbours(&facts);
  return facts;
}

}  // namespace mesh
