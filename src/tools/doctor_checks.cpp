// SPDX-License-Identifier: Apache-2.0
// The doctor's checks of what loads and what is configured: the plugin library, the NCCLs a
// job may load, NCCL's configuration files and variables, nccl-mesh's settings, the
// locked-memory limit, CMA and rdma-core. Pure: each judges DoctorFacts only.
#include <strings.h>

#include <algorithm>
#include <cctype>

#include "mesh/platform/text.h"
#include "mesh/tools/doctor.h"

namespace mesh {

namespace {

CheckResult ok(const char* name, std::string found) { return {name, Verdict::Ok, std::move(found), ""}; }
CheckResult warn(const char* name, std::string found, std::string fix) {
  return {name, Verdict::Warn, std::move(found), std::move(fix)};
}
CheckResult fail(const char* name, std::string found, std::string fix) {
  return {name, Verdict::Fail, std::move(found), std::move(fix)};
}

std::string joined(const std::vector<std::string>& items, const char* sep = "; ") {
  std::string out;
  for (const std::string& s : items) out += (out.empty() ? "" : sep) + s;
  return out;
}

// "NCCL_NET=IB (environment)"
std::string shown(const std::string& name, const SettingSource& s) {
  return name + "=" + s.value + " (" + s.source + ")";
}

std::vector<std::string> entriesOf(const std::string& list) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= list.size()) {
    size_t comma = std::min(list.find(',', start), list.size());
    if (comma > start) out.push_back(list.substr(start, comma - start));
    start = comma + 1;
  }
  return out;
}

CheckResult checkPluginLoad(const DoctorFacts& f) {
  const LibProbe& p = f.plugin;
  if (!p.loaded) {
    return fail("plugin-load", p.label + ": NCCL could not load it: " + p.error,
                "install nccl-mesh (the .deb puts libnccl-net-mesh.so in /usr/lib), or put its directory in "
                "LD_LIBRARY_PATH, or set NCCL_NET_PLUGIN to its absolute path (NCCL >= 2.21)");
  }
  std::vector<int> abis;
  for (int v = kMeshAbiOldest; v <= kMeshAbiNewest; ++v) {
    if (p.abiMask & (1 << v)) abis.push_back(v);
  }
  if (abis.empty()) {
    return fail("plugin-load", p.label + ": " + p.path + " loads but exports no ncclNetPlugin_v8..v12 symbol",
                "that file is not nccl-mesh (or a broken build): reinstall nccl-mesh");
  }
  return ok("plugin-load", p.label + ": NCCL would load " + p.path + ", which exports ncclNet " + abiListText(abis));
}

// One libnccl.so.2: its version, the ABI it takes, what it lacks that this node's settings need.
CheckResult checkNccl(const char* name, const LibProbe& p, const DoctorFacts& f) {
  if (p.path.empty()) return ok(name, p.label + ": none (" + p.note + ")");
  if (!p.loaded) {
    return warn(name, p.label + ": " + p.path + " (" + p.note + ") could not be loaded to read its version: " + p.error,
                "reinstall it, or check it with `NCCL_DEBUG=VERSION` in a job");
  }
  const NcclVersion& v = p.version;
  std::string found = p.label + ": NCCL " + v.text() + " at " + p.path + " (" + p.note + ")";
  int abi = ncclAbiTaken(v);
  std::string order = abiListText(ncclAbiSearchOrder(v));
  if (abi == 0) {
    return fail(name, found + " looks for ncclNet " + order + " only: it never loads nccl-mesh (v8..v12)",
                "use NCCL >= 2.20: pip install -U nvidia-nccl-cu12 (or -cu13), or a newer container");
  }
  found += strf("; takes ncclNet v%d (tries %s)", abi, order.c_str());
  std::string unread = ncclUnreadNote(v);
  if (!unread.empty()) found += "; " + unread;
  std::vector<NcclLack> lacks = ncclFeaturesLacking(v);
  if (lacks.empty()) return ok(name, found);
  std::vector<std::string> what, fixes;
  Verdict verdict = Verdict::Ok;
  const SettingSource* plugin = f.setting("NCCL_NET_PLUGIN");
  for (const NcclLack& l : lacks) {
    what.push_back(l.feature);
    bool matters = (l.feature.find("absolute") != std::string::npos && plugin && plugin->value.find('/') != std::string::npos) ||
                   (l.feature.find("lists") != std::string::npos && plugin && plugin->value.find(',') != std::string::npos);
    bool ringRisk = l.feature.find("run-time") != std::string::npos && f.config.relay == RelayMode::Off;
    if (matters) verdict = Verdict::Fail;
    if (matters || ringRisk) {
      verdict = std::max(verdict, Verdict::Warn);
      fixes.push_back(l.impact);
    }
  }
  found += "; lacks " + joined(what, ", ");
  if (verdict == Verdict::Ok) return ok(name, found);
  return {name, verdict, found, joined(fixes) + "; or use a newer NCCL"};
}

CheckResult checkSystemNccl(const DoctorFacts& f) {
  CheckResult r = checkNccl("nccl-system", f.ncclSystem, f);
  const LibProbe& t = f.ncclTorch;
  const LibProbe& s = f.ncclSystem;
  if (s.preloaded) {
    // The dynamic loader maps LD_PRELOAD before anything else: the fix the warning below
    // gives, once followed, ends here.
    r.found += "; LD_PRELOAD loads it before any other NCCL" +
               (t.path.empty() ? std::string() : ", PyTorch's own " + t.path + " included") +
               ": jobs with this environment use it";
  } else if (!t.path.empty() && s.fromLdLibraryPath) {
    // The dynamic loader searches LD_LIBRARY_PATH before the RUNPATH of PyTorch's libraries.
    r.found += "; it comes before PyTorch's own " + t.path + ": PyTorch jobs with this LD_LIBRARY_PATH load this one";
  } else if (r.verdict == Verdict::Ok && t.loaded && s.loaded && t.version.text() != s.version.text()) {
    r.verdict = Verdict::Warn;
    r.found += "; PyTorch jobs load their own NCCL " + t.version.text() + " (" + t.path + "), not this one";
    r.fix = "to run PyTorch on the system NCCL, LD_PRELOAD=" + s.path + " in the job (or install the nvidia-nccl "
            "wheel of the version you want)";
  }
  return r;
}

CheckResult checkConfFiles(const DoctorFacts& f) {
  std::vector<std::string> read, problems;
  for (const ConfFile& c : f.confFiles) {
    if (!c.present) continue;
    if (!c.error.empty()) {
      problems.push_back(c.error);
      continue;
    }
    read.push_back(strf("%s (%zu settings)", c.path.c_str(), c.entries.size()));
    for (const std::string& p : c.problems) problems.push_back(c.path + ": " + p);
  }
  auto conf = f.env.find("NCCL_CONF_FILE");
  if (conf != f.env.end() && !conf->second.empty() && !f.confFiles.empty() && !f.confFiles[0].present) {
    problems.push_back("NCCL_CONF_FILE=" + conf->second + " does not exist (NCCL then reads no ~/.nccl.conf either)");
  }
  std::string found = read.empty() ? "no NCCL configuration file (NCCL_CONF_FILE or ~/.nccl.conf, /etc/nccl.conf)"
                                   : "read " + joined(read, ", ");
  if (problems.empty()) return ok("nccl-conf", found + "; the environment overrides them");
  return warn("nccl-conf", found + "; " + joined(problems),
              "fix or remove the lines named (KEY=VALUE, no spaces; '#' comments); NCCL skips them");
}

CheckResult checkNetPlugin(const DoctorFacts& f) {
  const SettingSource* s = f.setting("NCCL_NET_PLUGIN");
  if (s == nullptr) {
    return warn("net-plugin", "NCCL_NET_PLUGIN is set nowhere (environment, ~/.nccl.conf, /etc/nccl.conf): NCCL "
                "opens libnccl-net.so, not nccl-mesh",
                "export NCCL_NET_PLUGIN=mesh (or the absolute path of libnccl-net-mesh.so) in the job's environment");
  }
  if (strcasecmp(s->value.c_str(), "none") == 0) {
    return fail("net-plugin", shown("NCCL_NET_PLUGIN", *s) + " keeps every plugin out: NCCL uses its own IB or "
                "socket transport (NVIDIA's DGX Spark playbooks set it)",
                "remove it and set NCCL_NET_PLUGIN=mesh");
  }
  std::vector<std::string> entries = entriesOf(s->value);
  auto mesh = std::find_if(entries.begin(), entries.end(), namesMeshPlugin);
  if (mesh == entries.end()) {
    return fail("net-plugin", shown("NCCL_NET_PLUGIN", *s) + " names another plugin, not nccl-mesh",
                "set NCCL_NET_PLUGIN=mesh");
  }
  if (mesh != entries.begin()) {
    return warn("net-plugin", shown("NCCL_NET_PLUGIN", *s) + ": NCCL (2.27+) tries " + entries[0] +
                " first and uses nccl-mesh only if that one fails", "put mesh first, or alone");
  }
  return ok("net-plugin", shown("NCCL_NET_PLUGIN", *s));
}

CheckResult checkNetSelect(const DoctorFacts& f) {
  const SettingSource* s = f.setting("NCCL_NET");
  if (s == nullptr) {
    return ok("net-select", "NCCL_NET unset: NCCL takes the first network that initializes (nccl-mesh when it "
              "loads and finds a port, else silently its IB or socket transport; NCCL_NET=Mesh makes that an error)");
  }
  if (strcasecmp(s->value.c_str(), "Mesh") == 0) return ok("net-select", shown("NCCL_NET", *s));
  return fail("net-select", shown("NCCL_NET", *s) + ": NCCL uses only its network named " + s->value +
              ", never nccl-mesh (whose network is Mesh)", "set NCCL_NET=Mesh, or unset it");
}

// NCCL_IB_* set for a job meant to run on nccl-mesh: they tune NCCL's IB transport only.
CheckResult checkIbSettings(const DoctorFacts& f) {
  static const std::map<std::string, std::string> kMeshEquivalent = ibSettingEquivalents();
  std::vector<std::string> set, fixes;
  for (const auto& [name, s] : f.nccl) {
    if (name.rfind("NCCL_IB_", 0) != 0 || name == "NCCL_IB_DISABLE" || s.value.empty()) continue;
    set.push_back(shown(name, s));
    auto eq = kMeshEquivalent.find(name);
    if (eq != kMeshEquivalent.end()) fixes.push_back(name + " -> " + eq->second);
  }
  if (set.empty()) return ok("ib-settings", "no NCCL_IB_* setting");
  const SettingSource* net = f.setting("NCCL_NET");
  if (net == nullptr || strcasecmp(net->value.c_str(), "Mesh") != 0) {
    return ok("ib-settings", joined(set, ", ") + ": they tune NCCL's IB transport, which NCCL_NET does not exclude");
  }
  return warn("ib-settings", joined(set, ", ") + " with NCCL_NET=Mesh: nccl-mesh ignores NCCL_IB_* (NCCL's IB "
              "transport is not used)",
              "remove them" + (fixes.empty() ? std::string() : "; where one is needed, its nccl-mesh setting: " +
                                                                    joined(fixes, ", ")) +
                  " (nccl-mesh finds ports and GIDs itself)");
}

CheckResult checkMeshSettings(const DoctorFacts& f) {
  std::vector<std::string> set;
  for (const auto& [name, s] : f.nccl) {
    if (name.rfind("NCCL_MESH_", 0) == 0 && !s.value.empty()) set.push_back(shown(name, s));
  }
  if (!f.configWarnings.empty()) {
    return warn("mesh-settings", joined(f.configWarnings), "correct the values named (`nccl-mesh-info --settings` lists them)");
  }
  return ok("mesh-settings", set.empty() ? "no NCCL_MESH_* setting: every default" : joined(set, ", ") + ": valid");
}

CheckResult checkMemlock(const DoctorFacts& f) {
  const char* fix = "raise it: `ulimit -l unlimited` (/etc/security/limits.conf: `* - memlock unlimited`; docker "
                    "run --ulimit memlock=-1; systemd LimitMEMLOCK=infinity)";
  if (!f.memlockProblem.empty()) return warn("memlock", f.memlockProblem, fix);
  const MemlockLimit& m = f.memlock;
  std::string text = "RLIMIT_MEMLOCK " + bytesText(m.softBytes, m.softUnlimited) + " (soft) / " +
                     bytesText(m.hardBytes, m.hardUnlimited) + " (hard) in this shell";
  if (m.softUnlimited) return ok("memlock", text);
  if (f.capIpcLock) return ok("memlock", text + ", but CAP_IPC_LOCK: no limit applies");
  text += ": NCCL and nccl-mesh pin their buffers (several MiB per peer and channel, 4 MiB per relayed "
          "connection), and a job started elsewhere (a container, a service) has its own limit";
  constexpr uint64_t kSurelyTooLow = 64ull << 20;
  return m.softBytes < kSurelyTooLow ? fail("memlock", text, fix) : warn("memlock", text, fix);
}

CheckResult checkCma(const DoctorFacts& f) {
  const CmaFigures& c = f.cma;
  if (!c.known) {
    if (f.cmaProblem.find("no CmaTotal") != std::string::npos) return ok("cma", "no CMA in this kernel");
    return warn("cma", f.cmaProblem, "check that /proc is mounted");
  }
  std::string figures = "CmaTotal " + bytesText(c.totalKb << 10) + ", CmaFree " + bytesText(c.freeKb << 10);
  if (!c.anomalous()) return ok("cma", figures);
  return fail("cma", figures + ": pages typed CMA beyond the CMA area (Kexec HandOver's scratch area, Ubuntu 7.0 "
              "kernels); RDMA registration pins pages for the long term and cannot keep them there, so "
              "ibv_reg_mr fails with ENOMEM once memory is tight (kernel command line: " +
              (f.kernelCmdline.empty() ? std::string("unknown") : f.kernelCmdline) + ")",
              "add kho=off to the kernel command line (GRUB_CMDLINE_LINUX in /etc/default/grub, update-grub, "
              "reboot), or boot a kernel without KHO on by default");
}

// What the GPUs say of GPUDirect (issue 32): never a FAIL, since NCCL runs either way (host
// staging on a GB10 is its normal path); a WARN only where the GPUs would allow GPUDirect
// and the NIC side is missing for it.
CheckResult checkGpuDirect(const DoctorFacts& f) {
  const GpuCaps& g = f.gpus;
  if (!g.known()) {
    return ok("gpudirect", "the GPUs' answer is unknown (" + g.why +
                               "); the plugin goes by the NIC's (nvidia-peermem, the DMA-BUF probe)");
  }
  if (!g.anyGdr() && !g.anyDmabuf()) {
    return ok("gpudirect", g.describe() + ": no GPUDirect here, so NCCL stages through host memory (cudaHostAlloc "
                                          "buffers) and the plugin offers host memory only; this is how a DGX "
                                          "Spark's GB10 runs at full speed, and nvidia-peermem is neither needed "
                                          "nor able to load");
  }
  if (g.anyGdr() && !f.peermem && !g.anyDmabuf()) {
    return warn("gpudirect", g.describe() + ": the GPUs allow GPUDirect RDMA but no nvidia-peermem module is loaded "
                                            "and they export no DMA-BUF, so NCCL stages through host memory",
                "modprobe nvidia-peermem (and load it at boot), or use a driver with DMA-BUF export");
  }
  return ok("gpudirect", g.describe() + (f.peermem ? "; nvidia-peermem loaded" : "; DMA-BUF"));
}

CheckResult checkRdmaCore(const DoctorFacts& f) {
  if (f.verbsError.empty()) return ok("rdma-core", "libibverbs loads (" + f.config.ibverbsLib + ")");
  return fail("rdma-core", f.verbsError,
              "install rdma-core: apt-get install libibverbs1 ibverbs-providers (or point NCCL_MESH_IBVERBS_LIB at it)");
}

}  // namespace

std::map<std::string, std::string> ibSettingEquivalents() {
  std::map<std::string, std::string> out;
  for (const SettingInfo& s : settingsTable()) {
    std::string doc = s.doc;
    for (size_t at = doc.find("NCCL_IB_"); at != std::string::npos; at = doc.find("NCCL_IB_", at + 1)) {
      size_t end = at + 8;
      while (end < doc.size() && (isupper(static_cast<unsigned char>(doc[end])) || doc[end] == '_')) ++end;
      out.emplace(doc.substr(at, end - at), s.name);
    }
  }
  return out;
}

std::vector<CheckResult> settingsChecks(const DoctorFacts& f) {
  return {checkPluginLoad(f),
          checkNccl("nccl-pytorch", f.ncclTorch, f),
          checkSystemNccl(f),
          checkConfFiles(f),
          checkNetPlugin(f),
          checkNetSelect(f),
          checkIbSettings(f),
          checkMeshSettings(f),
          checkMemlock(f),
          checkGpuDirect(f),
          checkCma(f),
          checkRdmaCore(f)};
}

}  // namespace mesh
