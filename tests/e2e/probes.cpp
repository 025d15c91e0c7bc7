// SPDX-License-Identifier: Apache-2.0
#include "probes.h"

#include <dirent.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "e2e_util.h"
#include "meshfab/stats.h"
#include "plugin_net.h"

extern char** environ;

namespace e2e {

// Two backends: the kernel's RDMA stack (the QEMU lab: `rdma res show`, rxe's sysfs
// counters, devices rxe_<netdev>) and the userspace fabric of tests/fabric (its stats
// files in $MESHFAB_DIR, devices fab_<netdev>), chosen by whether MESHFAB_DIR is set.
namespace {

const char* fabricDir() {
  const char* d = getenv("MESHFAB_DIR");
  return d != nullptr && *d != '\0' ? d : nullptr;
}

const char* devicePrefix() { return fabricDir() != nullptr ? "fab_" : "rxe_"; }

// The fabric's transport fds in this process (they follow peer processes, not the plugin).
int fabricTransportFds() {
  if (fabricDir() == nullptr) return 0;
  int64_t n = 0;
  meshfab::forEachStats(fabricDir(), 0, [&n](const meshfab::StatsFile& f) {
    if (f.pid == getpid()) n += f.transportFds.load();
  });
  return static_cast<int>(n);
}

}  // namespace

int countOpenFds() {
  DIR* d = opendir("/proc/self/fd");
  if (d == nullptr) return -1;
  int n = 0;
  while (struct dirent* e = readdir(d)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(d);
  return n - 1 - fabricTransportFds();  // the DIR's own descriptor
}

int countThreads() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/task")) {
    while (struct dirent* e = readdir(d)) n += e->d_name[0] != '.' ? 1 : 0;
    closedir(d);
  }
  return n;
}

bool libraryMapped(const std::string& name) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find(name) != std::string::npos) return true;
  }
  return false;
}

bool runCapture(const std::vector<std::string>& args, std::string* out, std::string* error) {
  int pipefd[2];
  if (pipe2(pipefd, O_CLOEXEC) != 0) {
    *error = format("pipe: %s", strerror(errno));
    return false;
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, pipefd[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&fa, pipefd[1], STDERR_FILENO);
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = -1;
  int rc = posix_spawnp(&pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  close(pipefd[1]);
  if (rc != 0) {
    close(pipefd[0]);
    *error = format("cannot run %s: %s", args[0].c_str(), strerror(rc));
    return false;
  }
  char buf[4096];
  for (;;) {
    ssize_t n = read(pipefd[0], buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out->append(buf, static_cast<size_t>(n));
  }
  close(pipefd[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    *error = format("%s exited with status %d: %s", args[0].c_str(),
                    WIFEXITED(status) ? WEXITSTATUS(status) : -1, out->c_str());
    return false;
  }
  return true;
}

namespace {

const char* const kLeakKeys[] = {"qp", "cq", "mr", "pd"};

// The fabric's `rdma res show`: object counts of every live process on this node (netns).
RdmaResources fabricResources() {
  RdmaResources r;
  std::map<std::string, std::map<std::string, long>> byDevice;
  int files = meshfab::forEachStats(fabricDir(), meshfab::currentNetns(), [&](const meshfab::StatsFile& f) {
    for (uint32_t i = 0; i < f.ndev && i < static_cast<uint32_t>(meshfab::kStatsMaxDevices); ++i) {
      const meshfab::DevStats& d = f.dev[i];
      for (int k = 0; k < meshfab::kResCount; ++k) {
        r.total[meshfab::resName(k)] += d.res[k].load();
        byDevice[d.name][meshfab::resName(k)] += d.res[k].load();
      }
    }
  });
  // Per device, as `rdma res show` lists them (this node's processes summed).
  for (const auto& dev : byDevice) {
    for (const auto& kv : dev.second) r.perDevice[dev.first] += format("%s %ld ", kv.first.c_str(), kv.second);
  }
  if (files == 0) {
    r.error = format("no meshfab stats file of a live process under %s/stats", fabricDir());
    return r;
  }
  r.ok = true;
  return r;
}

}  // namespace

RdmaResources rdmaResources() {
  if (fabricDir() != nullptr) return fabricResources();
  RdmaResources r;
  std::string out;
  // iproute2's rdma is in /usr/sbin or /sbin, which a test's PATH may lack.
  const char* candidates[] = {"rdma", "/usr/sbin/rdma", "/sbin/rdma", "/usr/bin/rdma"};
  std::string error;
  bool ran = false;
  for (const char* tool : candidates) {
    out.clear();
    error.clear();
    if (runCapture({tool, "res", "show"}, &out, &error)) {
      ran = true;
      break;
    }
  }
  if (!ran) {
    for (char& ch : error) {
      if (ch == '\n') ch = ' ';
    }
    r.error = "`rdma res show` failed: " + error;
    return r;
  }
  // Lines like "0: rxe_p1: pd 1 cq 2 qp 1 cm_id 0 mr 2 ctx 1 srq 0".
  std::istringstream lines(out);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream in(line);
    std::string index, dev;
    if (!(in >> index >> dev) || index.empty() || index.back() != ':') continue;
    if (!dev.empty() && dev.back() == ':') dev.pop_back();
    std::string key, value, desc;
    while (in >> key >> value) {
      char* end = nullptr;
      long v = strtol(value.c_str(), &end, 10);
      if (*end != '\0') continue;
      r.total[key] += v;
      desc += format("%s%s %ld", desc.empty() ? "" : " ", key.c_str(), v);
    }
    r.perDevice[dev] = desc;
  }
  if (r.perDevice.empty()) {
    r.error = "`rdma res show` listed no devices: " + out;
    return r;
  }
  r.ok = true;
  return r;
}

std::string describeResources(const RdmaResources& r) {
  if (!r.ok) return "n/a";
  std::string out;
  for (const char* k : kLeakKeys) {
    auto it = r.total.find(k);
    out += format("%s%s %ld", out.empty() ? "" : " ", k, it == r.total.end() ? 0L : it->second);
  }
  return out;
}

namespace {
std::string resourceChanges(const RdmaResources& before, const RdmaResources& after, bool grownOnly) {
  if (!before.ok || !after.ok) return std::string();
  std::string out;
  for (const char* k : kLeakKeys) {
    auto b = before.total.find(k), a = after.total.find(k);
    long vb = b == before.total.end() ? 0 : b->second;
    long va = a == after.total.end() ? 0 : a->second;
    if (grownOnly ? va > vb : va != vb) out += format("%s%s %ld -> %ld", out.empty() ? "" : ", ", k, vb, va);
  }
  return out;
}
}  // namespace

std::string diffResources(const RdmaResources& before, const RdmaResources& after) {
  return resourceChanges(before, after, false);
}

std::string grownResources(const RdmaResources& before, const RdmaResources& after) {
  return resourceChanges(before, after, true);
}

namespace {

// Calls fn(device name, value) for counter `name` of every fabric device of every process of
// this node (one call per process and device). Nothing off the fabric.
template <typename Fn>
void eachFabricValue(const std::string& name, Fn&& fn) {
  if (fabricDir() == nullptr) return;
  meshfab::forEachStats(fabricDir(), meshfab::currentNetns(), [&](const meshfab::StatsFile& f) {
    for (uint32_t i = 0; i < f.ndev && i < static_cast<uint32_t>(meshfab::kStatsMaxDevices); ++i) {
      for (int c = 0; c < meshfab::kCounterCount; ++c) {
        if (name == meshfab::counterName(c)) fn(std::string(f.dev[i].name), static_cast<long>(f.dev[i].counters[c].load()));
      }
    }
  });
}

// Counter `name` of every fabric device of this node, summed over the node's processes (as a
// port counter is): device name -> value. Empty off the fabric.
std::map<std::string, long> fabricCounter(const std::string& name) {
  std::map<std::string, long> out;
  eachFabricValue(name, [&](const std::string& dev, long v) { out[dev] += v; });
  return out;
}

}  // namespace

long fabricNodeMax(const std::string& name) {
  if (fabricDir() == nullptr) return -1;
  long most = 0;  // over every device of every process of the node (a maximum is not summed)
  eachFabricValue(name, [&](const std::string&, long v) { most = std::max(most, v); });
  return most;
}

long fabricNodeCounter(const std::string& name) {
  if (fabricDir() == nullptr) return -1;
  long sum = 0;
  for (const auto& [dev, v] : fabricCounter(name)) sum += v;
  return sum;
}

std::string fabricSentBytes() {
  std::string out;
  for (const auto& [dev, v] : fabricCounter("sent_bytes")) {
    out += format("%s%s=%.1fM", out.empty() ? "" : " ", dev.c_str(), v / 1e6);
  }
  return out;
}

long readPortCounter(const std::string& dev, int port, const std::string& name) {
  if (fabricDir() != nullptr) {  // the fabric's devices have one port
    std::map<std::string, long> v = fabricCounter(name);
    auto it = v.find(dev);
    return port == 1 && it != v.end() ? it->second : -1;
  }
  std::string path = format("/sys/class/infiniband/%s/ports/%d/hw_counters/%s", dev.c_str(),
                            port, name.c_str());
  FILE* f = fopen(path.c_str(), "re");
  if (f == nullptr) return -1;
  long v = -1;
  if (fscanf(f, "%ld", &v) != 1) v = -1;
  fclose(f);
  return v;
}

namespace {

std::vector<std::string> rdmaDeviceNames() {
  std::vector<std::string> names;
  if (fabricDir() != nullptr) {
    meshfab::forEachStats(fabricDir(), meshfab::currentNetns(), [&names](const meshfab::StatsFile& f) {
      for (uint32_t i = 0; i < f.ndev && i < static_cast<uint32_t>(meshfab::kStatsMaxDevices); ++i) {
        if (std::find(names.begin(), names.end(), f.dev[i].name) == names.end()) names.emplace_back(f.dev[i].name);
      }
    });
  } else if (DIR* d = opendir("/sys/class/infiniband")) {
    while (struct dirent* e = readdir(d)) {
      if (e->d_name[0] != '.') names.emplace_back(e->d_name);
    }
    closedir(d);
  }
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

std::vector<std::string> retransmitCounters() {
  std::vector<std::string> names = rdmaDeviceNames();
  std::vector<std::string> out;
  for (const std::string& dev : names) {
    std::string line = dev + ":";
    for (const char* c : {"duplicate_request", "completer_retry_err", "out_of_seq_request", "rcvd_seq_err",
                          "retry_exceeded_err", "rcvd_rnr_err", "sent_pkts", "rcvd_pkts", "unreachable_drops"}) {
      long v = readPortCounter(dev, 1, c);
      if (v >= 0) line += format(" %s=%ld", c, v);
    }
    out.push_back(line);
  }
  return out;
}

std::vector<std::string> labDevicesTowards(int peer) {
  std::vector<std::string> out;
  std::string prefix = devicePrefix();
  for (const std::string& name : rdmaDeviceNames()) {
    if (name.rfind(prefix, 0) == 0 && isNetdevTowards(name.substr(prefix.size()), peer)) out.push_back(name);
  }
  return out;
}

std::vector<TcpSocket> ownTcpSockets() {
  std::set<unsigned long> inodes;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (dirent* e = readdir(d)) {
      char link[64] = {};
      std::string path = std::string("/proc/self/fd/") + e->d_name;
      ssize_t n = readlink(path.c_str(), link, sizeof(link) - 1);
      unsigned long inode = 0;
      if (n > 0 && sscanf(link, "socket:[%lu]", &inode) == 1) inodes.insert(inode);
    }
    closedir(d);
  }
  std::vector<TcpSocket> out;
  for (const char* table : {"/proc/self/net/tcp", "/proc/self/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      // "  0: 0100007F:A1B2 00000000:0000 0A 00000000:00000000 00:00000000 00000000 0 0 12345 ..."
      char local[64] = {}, remote[64] = {};
      unsigned state = 0;
      unsigned long inode = 0;
      if (sscanf(line.c_str(), "%*d: %63s %63s %x %*s %*s %*s %*d %*d %lu", local, remote, &state, &inode) != 4) continue;
      if (inodes.count(inode) == 0) continue;
      const char* lp = strrchr(local, ':');
      const char* rp = strrchr(remote, ':');
      if (lp == nullptr || rp == nullptr) continue;
      TcpSocket t;
      t.localPort = static_cast<int>(strtol(lp + 1, nullptr, 16));
      t.remotePort = static_cast<int>(strtol(rp + 1, nullptr, 16));
      t.listening = state == 0x0A;
      t.established = state == 0x01;
      out.push_back(t);
    }
  }
  return out;
}

}  // namespace e2e
