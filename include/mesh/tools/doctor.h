// SPDX-License-Identifier: Apache-2.0
// nccl-mesh-info --doctor: checks a node before a job and says, per check, OK / WARN / FAIL,
// what was found and the fix. Owns: the facts the checks judge (DoctorFacts), how they are
// gathered (collectFacts: files under a root prefix, plus the live sources in DoctorSources,
// which tests replace), the checks (runChecks, pure), and the report (text, JSON).
// Never changes anything on the node: it reads files, lists interfaces, opens RDMA devices
// read-only, and loads NCCL and the plugin only in forked children that exit at once.
// Files: doctor_facts.cpp (files under the root), doctor_libs.cpp (which NCCL and plugin
// would load, forked probes), doctor_checks.cpp (settings and system checks),
// doctor_checks_net.cpp (ports and addresses), doctor_report.cpp (output, the live sources).
#pragma once

#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "mesh/config/config.h"
#include "mesh/platform/cuda_caps.h"
#include "mesh/discovery/nic_discovery.h"
#include "mesh/platform/ipv4.h"
#include "mesh/platform/sysinfo.h"
#include "mesh/plugin/nccl_compat.h"

namespace mesh {

enum class Verdict { Ok = 0, Warn = 1, Fail = 2 };
const char* verdictName(Verdict v);  // "OK", "WARN", "FAIL"

struct CheckResult {
  std::string name;   // stable id, e.g. "memlock"
  Verdict verdict = Verdict::Ok;
  std::string found;  // what was found, one line
  std::string fix;    // what to do; empty when OK
};

// --- facts -------------------------------------------------------------------------------

// An NCCL configuration file as NCCL reads it (src/misc/param.cc: KEY=VALUE lines, '#'
// comments; values do not override the environment; the first file to set a key wins).
struct ConfFile {
  std::string path;       // as NCCL names it (/etc/nccl.conf), not prefixed by the root
  bool present = false;
  std::string error;      // unreadable
  std::vector<std::pair<std::string, std::string>> entries;
  std::vector<std::string> problems;  // malformed lines, named by number
};

// A setting as NCCL will see it, and where it came from ("environment", "/etc/nccl.conf").
struct SettingSource {
  std::string value;
  std::string source;
};

// A library the doctor located and loaded in a forked child.
struct LibProbe {
  std::string label;     // "PyTorch (python3)", "system (ld.so)", "NCCL_NET_PLUGIN=mesh"
  std::string path;      // where it was found; empty: not found
  std::string note;      // how it was located, or why not
  bool loaded = false;   // dlopen + symbol lookup worked in the child
  std::string error;     // why not (dlerror, crash, timeout)
  NcclVersion version;   // ncclGetVersion(), for NCCL
  int abiMask = 0;       // bit N: exports ncclNetPlugin_vN, for the plugin
  bool fromLdLibraryPath = false;  // found in an LD_LIBRARY_PATH directory
  bool preloaded = false;          // named by LD_PRELOAD: loaded before any other, PyTorch's own too
};

// A network interface of this node's namespace.
struct NetIf {
  std::string name;
  int mtu = 0;
  bool up = false;
  std::vector<Ipv4Prefix> ipv4;
  int ipv6Global = 0;  // IPv6 addresses other than link-local
};

// An RDMA port, from sysfs or (where sysfs has none: the userspace fabric) from verbs.
struct PortFact {
  std::string device;
  int port = 1;
  std::string state;      // "ACTIVE", "DOWN", ...
  std::string linkLayer;  // "Ethernet", "InfiniBand", "" unknown
  std::string netdev;     // "" unknown
  std::vector<GidEntry> gids;
  int activeMtu = 0;      // RoCE MTU in bytes; 0: unknown (sysfs has none)
  bool active() const { return state == "ACTIVE"; }
  bool ethernet() const { return linkLayer == "Ethernet"; }
  std::string label() const { return device + ":" + std::to_string(port); }
};

struct DoctorFacts {
  std::string root;  // "" = the real /
  std::map<std::string, std::string> env;
  std::vector<ConfFile> confFiles;
  std::map<std::string, SettingSource> nccl;  // NCCL_*/GLOO_* as NCCL sees them: env, then files
  Config config;                              // NCCL_MESH_* from those
  std::vector<std::string> configWarnings;
  MemlockLimit memlock;
  bool capIpcLock = false;
  std::string memlockProblem;
  CmaFigures cma;
  std::string cmaProblem;
  std::string kernelCmdline;
  std::string verbsError;      // "" when libibverbs loaded
  std::vector<PortFact> ports;
  std::string portsSource;     // "sysfs", "verbs"
  std::string portsNote;       // why none (no device at all)
  std::vector<std::string> sysfsProblems;
  std::vector<NetIf> netifs;
  std::map<std::string, std::string> netdevPci;  // a port's netdev -> its sysfs device path (realpath)
  std::map<std::string, int> sysctl;  // "all/rp_filter" -> value; absent: unreadable
  std::vector<std::string> sysctlProblems;
  // The kernel's ARP table (/proc/net/arp): each netdev's complete entries, IPv4 in host
  // order. What tells a switch from a cable (more neighbours on a port than one peer has).
  std::map<std::string, std::set<uint32_t>> neighbours;
  LibProbe plugin;
  LibProbe ncclTorch;
  LibProbe ncclSystem;
  GpuCaps gpus;                // the CUDA driver's GPUDirect answers (unknown without a driver)
  bool peermem = false;        // an nvidia-peermem (or nv_peer_mem) module is loaded
  int nodes = 0;               // --nodes: the job's node count; 0 unknown
  const NetIf* netif(const std::string& name) const;
  const SettingSource* setting(const std::string& name) const;  // nullptr: unset or empty
};

// --- gathering ---------------------------------------------------------------------------

struct DoctorSources {
  std::string root;  // prefix for every file read: /sys, /proc, /etc, $HOME
  std::map<std::string, std::string> env;
  int nodes = 0;
  std::function<std::vector<NetIf>()> interfaces;
  // The directories of sys.path of the Python whose PyTorch jobs use (python3 on PATH);
  // *error says why none. Tests hand in a fake list.
  std::function<std::vector<std::string>(std::string* error)> pythonPath;
  // Loads an NCCL library / the plugin (a name NCCL would dlopen, or a path) in a child.
  std::function<LibProbe(const std::string& path)> probeNccl;
  std::function<LibProbe(const std::string& nameOrPath)> probePlugin;
  // "" when libibverbs (Config::ibverbsLib) loads, else why not.
  std::function<std::string(const Config&)> loadVerbs;
  // The ports verbs lists, where sysfs lists no RDMA device; *note says why none.
  std::function<std::vector<PortFact>(const Config&, std::string* note)> verbsPorts;
  // What the CUDA driver (Config::cudaLib) says of the GPUs' GPUDirect support.
  std::function<GpuCaps(const Config&)> gpus;
};

DoctorFacts collectFacts(const DoctorSources& sources);

// --- file readers (doctor_facts.cpp), each under facts.root ----------------------------------
void readConfFiles(DoctorFacts* facts);        // NCCL_CONF_FILE or ~/.nccl.conf, /etc/nccl.conf
void mergeSettings(DoctorFacts* facts);        // env over files; NCCL_MESH_* parsed into config
void readPinningFacts(DoctorFacts* facts);     // /proc/self/limits, status, meminfo, cmdline
void readSysfsPorts(DoctorFacts* facts);       // /sys/class/infiniband
void readSysctls(DoctorFacts* facts);          // /proc/sys/net/ipv4/conf/{all,<mesh netdev>}
void readNeighbours(DoctorFacts* facts);       // /proc/net/arp (unreadable: none known)
// Parses one configuration file's text as NCCL does; malformed lines go to problems.
void parseConfText(const std::string& text, ConfFile* out);
// The RoCE MTU (bytes) a netdev MTU gives, by the kernel's rule for RoCE devices
// (iboe_get_mtu: the netdev MTU less 96 bytes of headers, rounded down to 256..4096).
int roceMtuForNetdev(int netdevMtu);

// --- libraries (doctor_libs.cpp) -------------------------------------------------------------
// Fills facts->plugin, ncclTorch and ncclSystem through the sources' probes.
void locateLibraries(const DoctorSources& sources, DoctorFacts* facts);
// The libnccl.so.2 PyTorch would load: <site>/torch/lib, then <site>/nvidia/nccl/lib of the
// site directory holding torch (its libtorch_cuda.so's RUNPATH), else any sys.path entry's
// nvidia/nccl/lib (a pip NCCL without PyTorch). Paths are returned without the root prefix.
LibProbe locateTorchNccl(const std::string& root, const std::vector<std::string>& sysPath);
// The libnccl.so.2 the dynamic loader finds by name: LD_LIBRARY_PATH, /etc/ld.so.conf's
// directories (with includes), then the default directories.
LibProbe locateSystemNccl(const std::string& root, const std::map<std::string, std::string>& env);
// The names NCCL >= 2.21 dlopens for one NCCL_NET_PLUGIN entry: the value, then
// libnccl-net-<value>.so unless the value is a path or a lib*.so name.
std::vector<std::string> pluginOpenNames(const std::string& entry);
// True when an NCCL_NET_PLUGIN entry names this plugin ("mesh", ".../libnccl-net-mesh.so").
bool namesMeshPlugin(const std::string& entry);
// Live probes: dlopen in a forked child with a deadline (a crash or a hang is a result).
LibProbe probeNcclInChild(const std::string& path, int timeoutMs);
LibProbe probePluginInChild(const std::string& nameOrPath, int timeoutMs);
std::vector<std::string> pythonSysPath(int timeoutMs, std::string* error);
// queryGpuCaps in a forked child with a deadline (a driver that hangs or crashes is a result,
// and this process never initializes CUDA).
GpuCaps probeGpusInChild(const std::string& library, int timeoutMs);

// --- checks and report ------------------------------------------------------------------------
std::vector<CheckResult> runChecks(const DoctorFacts& facts);

// NCCL's IB settings and the nccl-mesh setting for each ("NCCL_IB_TC" -> "NCCL_MESH_IB_TC"):
// every NCCL_IB_* named in a setting's doc (settingsTable), which the ib-settings check
// suggests in their place.
std::map<std::string, std::string> ibSettingEquivalents();
std::vector<CheckResult> settingsChecks(const DoctorFacts& facts);  // doctor_checks.cpp
std::vector<CheckResult> networkChecks(const DoctorFacts& facts);   // doctor_checks_net.cpp
Verdict worstVerdict(const std::vector<CheckResult>& results);
int doctorExitStatus(Verdict worst);  // 0 OK, 1 WARN, 2 FAIL
std::string doctorText(const std::vector<CheckResult>& results, const std::string& header);
std::string doctorJson(const std::vector<CheckResult>& results, const std::string& version, const std::string& root);

struct DoctorOptions {
  std::string root;
  bool json = false;
  int nodes = 0;
};
// What nccl-mesh-info --doctor runs: live sources, checks, report on stdout; the exit status.
int runDoctor(const DoctorOptions& options);

}  // namespace mesh
