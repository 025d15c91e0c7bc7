// SPDX-License-Identifier: Apache-2.0
// nccl-mesh-info --doctor's report (text, JSON, exit status) and its live sources: this
// process's environment, the interfaces of its network namespace, rdma-core's devices
// (opened read-only, closed again) and the forked library probes.
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "mesh/platform/text.h"
#include "mesh/platform/verbs_loader.h"
#include "mesh/platform/version.h"
#include "mesh/tools/doctor.h"

extern char** environ;

namespace mesh {

const char* verdictName(Verdict v) {
  switch (v) {
    case Verdict::Ok: return "OK";
    case Verdict::Warn: return "WARN";
    default: return "FAIL";
  }
}

Verdict worstVerdict(const std::vector<CheckResult>& results) {
  Verdict worst = Verdict::Ok;
  for (const CheckResult& r : results) worst = std::max(worst, r.verdict);
  return worst;
}

int doctorExitStatus(Verdict worst) { return static_cast<int>(worst); }

std::string doctorText(const std::vector<CheckResult>& results, const std::string& header) {
  std::string out = header + "\n";
  int counts[3] = {0, 0, 0};
  for (const CheckResult& r : results) {
    ++counts[static_cast<int>(r.verdict)];
    out += strf("%-4s  %-13s %s", verdictName(r.verdict), r.name.c_str(), r.found.c_str());
    if (!r.fix.empty()) out += " -> fix: " + r.fix;
    out += "\n";
  }
  Verdict worst = worstVerdict(results);
  out += strf("verdict: %s (%zu checks: %d OK, %d WARN, %d FAIL); exit status %d\n", verdictName(worst),
              results.size(), counts[0], counts[1], counts[2], doctorExitStatus(worst));
  return out;
}

std::string doctorJson(const std::vector<CheckResult>& results, const std::string& version, const std::string& root) {
  std::string checks;
  for (const CheckResult& r : results) {
    checks += (checks.empty() ? "\n    " : ",\n    ") + std::string("{\"name\": ") + jsonString(r.name) +
              ", \"verdict\": " + jsonString(verdictName(r.verdict)) + ", \"found\": " + jsonString(r.found) +
              ", \"fix\": " + jsonString(r.fix) + "}";
  }
  Verdict worst = worstVerdict(results);
  return "{\n  \"version\": " + jsonString(version) + ",\n  \"root\": " + jsonString(root.empty() ? "/" : root) +
         ",\n  \"verdict\": " + jsonString(verdictName(worst)) +
         ",\n  \"exit_status\": " + std::to_string(doctorExitStatus(worst)) + ",\n  \"checks\": [" + checks +
         "\n  ]\n}\n";
}

namespace {

std::map<std::string, std::string> processEnvironment() {
  std::map<std::string, std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const char* eq = strchr(*e, '=');
    if (eq != nullptr) env[std::string(*e, static_cast<size_t>(eq - *e))] = eq + 1;
  }
  return env;
}

std::vector<NetIf> liveInterfaces() {
  std::vector<NetIf> out;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  int sock = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  for (const ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    auto it = std::find_if(out.begin(), out.end(), [&](const NetIf& n) { return n.name == a->ifa_name; });
    if (it == out.end()) {
      NetIf n;
      n.name = a->ifa_name;
      n.up = (a->ifa_flags & IFF_UP) != 0;
      ifreq req{};
      snprintf(req.ifr_name, sizeof(req.ifr_name), "%s", a->ifa_name);
      if (sock >= 0 && ioctl(sock, SIOCGIFMTU, &req) == 0) n.mtu = req.ifr_mtu;
      it = out.insert(out.end(), n);
    }
    if (a->ifa_addr == nullptr) continue;
    if (a->ifa_addr->sa_family == AF_INET && a->ifa_netmask != nullptr) {
      auto* sin = reinterpret_cast<const sockaddr_in*>(a->ifa_addr);
      auto* mask = reinterpret_cast<const sockaddr_in*>(a->ifa_netmask);
      it->ipv4.push_back({ntohl(sin->sin_addr.s_addr), static_cast<uint8_t>(__builtin_popcount(mask->sin_addr.s_addr))});
    } else if (a->ifa_addr->sa_family == AF_INET6) {
      auto* sin6 = reinterpret_cast<const sockaddr_in6*>(a->ifa_addr);
      if (!IN6_IS_ADDR_LINKLOCAL(&sin6->sin6_addr)) ++it->ipv6Global;
    }
  }
  if (sock >= 0) close(sock);
  freeifaddrs(list);
  return out;
}

const char* portStateName(int state) {
  switch (state) {
    case IBV_PORT_DOWN: return "DOWN";
    case IBV_PORT_INIT: return "INIT";
    case IBV_PORT_ARMED: return "ARMED";
    case IBV_PORT_ACTIVE: return "ACTIVE";
    default: return "unknown";
  }
}

// Every port of every device rdma-core lists (the userspace fabric has no sysfs): opened,
// queried, closed. Nothing is allocated on the devices.
std::vector<PortFact> verbsPortFacts(const Config& config, std::string* note) {
  std::vector<PortFact> out;
  VerbsApi api;
  std::string why;
  if (loadVerbs(config.ibverbsLib, &api, &why) != ncclSuccess) {
    *note = why;
    return out;
  }
  int n = 0;
  ibv_device** list = api.getDeviceList(&n);
  if (list == nullptr || n == 0) {
    *note = list == nullptr ? std::string("ibv_get_device_list failed: ") + strerror(errno) +
                                  " (the kernel has no RDMA support loaded?)"
                            : "rdma-core lists no RDMA device";
  }
  for (int d = 0; d < n; ++d) {
    std::string name = api.getDeviceName(list[d]);
    ibv_context* ctx = api.openDevice(list[d]);
    ibv_device_attr attr{};
    if (ctx == nullptr || api.queryDevice(ctx, &attr) != 0) {
      *note += (note->empty() ? "" : "; ") + name + ": cannot open or query: " + strerror(errno);
      if (ctx != nullptr) api.closeDevice(ctx);
      continue;
    }
    for (int p = 1; p <= attr.phys_port_cnt; ++p) {
      ibv_port_attr pa{};
      if (queryPort(api, ctx, static_cast<uint8_t>(p), &pa) != 0) continue;
      PortFact pf;
      pf.device = name;
      pf.port = p;
      pf.state = portStateName(pa.state);
      pf.linkLayer = pa.link_layer == IBV_LINK_LAYER_ETHERNET ? "Ethernet" : "InfiniBand";
      pf.activeMtu = mtuToBytes(pa.active_mtu);
      pf.gids = queryPortGids(api, ctx, name, p, pa.gid_tbl_len);
      for (const GidEntry& g : pf.gids) {
        if (pf.netdev.empty()) pf.netdev = g.netdev;
      }
      out.push_back(std::move(pf));
    }
    api.closeDevice(ctx);
  }
  if (list != nullptr) api.freeDeviceList(list);
  unloadVerbs(&api);
  return out;
}

std::string verbsLoadError(const Config& config) {
  VerbsApi api;
  std::string why;
  if (loadVerbs(config.ibverbsLib, &api, &why) != ncclSuccess) return why;
  unloadVerbs(&api);
  return "";
}

}  // namespace

int runDoctor(const DoctorOptions& options) {
  constexpr int kProbeTimeoutMs = 10000;
  DoctorSources src;
  src.root = options.root;
  src.env = processEnvironment();
  src.nodes = options.nodes;
  src.interfaces = liveInterfaces;
  src.pythonPath = [](std::string* error) { return pythonSysPath(kProbeTimeoutMs, error); };
  src.probeNccl = [](const std::string& path) { return probeNcclInChild(path, kProbeTimeoutMs); };
  src.probePlugin = [](const std::string& spec) { return probePluginInChild(spec, kProbeTimeoutMs); };
  src.loadVerbs = verbsLoadError;
  src.verbsPorts = verbsPortFacts;
  src.gpus = [](const Config& c) { return probeGpusInChild(c.cudaLib, kProbeTimeoutMs); };
  DoctorFacts facts = collectFacts(src);
  std::vector<CheckResult> results = runChecks(facts);
  if (options.json) {
    fputs(doctorJson(results, versionText(), facts.root).c_str(), stdout);
  } else {
    char host[256] = {};
    if (gethostname(host, sizeof(host) - 1) != 0) snprintf(host, sizeof(host), "unknown-host");
    std::string header = "nccl-mesh doctor (" + versionText() + ") on " + host +
                         (facts.root.empty() ? "" : ", files under " + facts.root) +
                         ": one line per check, then the verdict";
    fputs(doctorText(results, header).c_str(), stdout);
  }
  return doctorExitStatus(worstVerdict(results));
}

}  // namespace mesh
