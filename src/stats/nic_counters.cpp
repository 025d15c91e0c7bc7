// SPDX-License-Identifier: Apache-2.0
// The RDMA NIC's sysfs counters (nic_counters.h). Read with open/read rather than streams:
// sysfs reports a driver's refusal (mlx5 hw_counters: EIO, EINVAL) only as read()'s errno,
// and the reason belongs in the warning. Nothing here throws on a bad tree.
#include "mesh/stats/nic_counters.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace mesh {
namespace stats {

namespace {

// hw_counters/lifespan is a setting (how long the driver caches the values, in ms), not a
// counter; every other entry there is one.
constexpr const char* kHwSettings[] = {"lifespan"};

// Every entry of `dir` but . and ..; false with errno set when `dir` cannot be listed.
bool listDir(const std::string& dir, std::vector<std::string>* names) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return false;
  errno = 0;
  while (dirent* e = readdir(d)) {
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) names->push_back(e->d_name);
  }
  int err = errno;
  closedir(d);
  errno = err;
  return err == 0;
}

bool isDir(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);  // sysfs devices are symlinks
}

// A port directory's name as a port number, or -1.
int portNumber(const std::string& name) {
  if (name.empty() || name.size() > 5) return -1;
  int n = 0;
  for (char c : name) {
    if (c < '0' || c > '9') return -1;
    n = n * 10 + (c - '0');
  }
  return n;
}

// Decimal text, then optional whitespace (sysfs ends it with a newline); false on anything
// else or on a value past 64 bits.
bool parseCount(const std::string& text, uint64_t* out) {
  size_t i = 0;
  uint64_t v = 0;
  while (i < text.size() && text[i] >= '0' && text[i] <= '9') {
    uint64_t d = static_cast<uint64_t>(text[i] - '0');
    if (v > (UINT64_MAX - d) / 10) return false;
    v = v * 10 + d;
    ++i;
  }
  if (i == 0) return false;
  for (; i < text.size(); ++i) {
    if (text[i] != '\n' && text[i] != ' ' && text[i] != '\t' && text[i] != '\r') return false;
  }
  *out = v;
  return true;
}

enum class Read { Ok, Absent, Failed };

// One counter file. Absent: no such file (no warning, the kernel or driver has no such
// counter). Failed: *warnings names the path and the reason.
Read readCount(const std::string& path, uint64_t* value, std::vector<std::string>* warnings) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return Read::Absent;
    warnings->push_back("cannot open " + path + ": " + std::strerror(errno));
    return Read::Failed;
  }
  char buf[64];  // a 64-bit count is 20 digits; more than this is not a count
  size_t got = 0;
  int err = 0;
  while (got < sizeof(buf)) {
    ssize_t n = ::read(fd, buf + got, sizeof(buf) - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) err = errno;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  if (err != 0) {
    warnings->push_back("cannot read " + path + ": " + std::strerror(err));
    return Read::Failed;
  }
  std::string text(buf, got);
  if (got == sizeof(buf) || !parseCount(text, value)) {
    std::string shown = text.substr(0, text.find('\n'));
    if (shown.size() > 24) shown = shown.substr(0, 24) + "...";
    warnings->push_back("cannot parse " + path + ": \"" + shown + "\" is not a decimal count");
    return Read::Failed;
  }
  return Read::Ok;
}

void readPortData(const std::string& dir, NicPortCounters* p, std::vector<std::string>* warnings) {
  if (!isDir(dir)) return;
  uint64_t txData = 0, rxData = 0;
  bool ok = readCount(dir + "/port_xmit_data", &txData, warnings) == Read::Ok;
  ok = readCount(dir + "/port_rcv_data", &rxData, warnings) == Read::Ok && ok;
  ok = readCount(dir + "/port_xmit_packets", &p->txPackets, warnings) == Read::Ok && ok;
  ok = readCount(dir + "/port_rcv_packets", &p->rxPackets, warnings) == Read::Ok && ok;
  if (!ok) {
    p->txPackets = p->rxPackets = 0;
    return;
  }
  p->haveData = true;
  p->txBytes = txData * 4;  // the PMA counts data in 4-byte words
  p->rxBytes = rxData * 4;
}

void readPortHw(const std::string& dir, NicPortCounters* p, std::vector<std::string>* warnings) {
  std::vector<std::string> names;
  if (!listDir(dir, &names)) {
    if (errno != ENOENT) warnings->push_back("cannot list " + dir + ": " + std::strerror(errno));
    return;
  }
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    if (std::find(std::begin(kHwSettings), std::end(kHwSettings), name) != std::end(kHwSettings)) continue;
    uint64_t v = 0;
    if (readCount(dir + "/" + name, &v, warnings) == Read::Ok) p->hw.emplace_back(name, v);
  }
}

}  // namespace

const std::vector<std::string>& watchedHwCounters() {
  // Retransmissions and what caused them, then sequence errors, then congestion (ECN marks
  // seen, CNPs sent as the notification point, CNPs handled as the reaction point).
  static const std::vector<std::string> kWatched = {
      "roce_adp_retrans", "local_ack_timeout_err", "rnr_nak_retry_err", "out_of_sequence",
      "packet_seq_err",   "np_ecn_marked_roce_packets", "np_cnp_sent",   "rp_cnp_handled",
  };
  return kWatched;
}

std::vector<NicPortCounters> readNicCounters(const std::string& root, std::vector<std::string>* warnings) {
  std::vector<NicPortCounters> out;
  std::string base = root;
  while (!base.empty() && base.back() == '/') base.pop_back();  // "/" and "": the real tree
  base += "/sys/class/infiniband";
  std::vector<std::string> devices;
  if (!listDir(base, &devices)) {
    if (errno != ENOENT) warnings->push_back("cannot list " + base + ": " + std::strerror(errno));
    return out;
  }
  std::sort(devices.begin(), devices.end());
  for (const std::string& dev : devices) {
    std::string portsDir = base + "/" + dev + "/ports";
    std::vector<std::string> entries;
    if (!listDir(portsDir, &entries)) {
      if (errno != ENOENT && errno != ENOTDIR) {
        warnings->push_back("cannot list " + portsDir + ": " + std::strerror(errno));
      }
      continue;
    }
    std::vector<std::pair<int, std::string>> ports;  // numeric order: 2 before 10
    for (const std::string& e : entries) {
      int n = portNumber(e);
      if (n >= 0 && isDir(portsDir + "/" + e)) ports.emplace_back(n, e);
    }
    std::sort(ports.begin(), ports.end());
    for (const auto& port : ports) {
      NicPortCounters p;
      p.device = dev;
      p.port = port.first;
      std::string dir = portsDir + "/" + port.second;
      readPortData(dir + "/counters", &p, warnings);
      readPortHw(dir + "/hw_counters", &p, warnings);
      out.push_back(std::move(p));
    }
  }
  return out;
}

uint64_t hwValue(const NicPortCounters& p, const std::string& name) {
  auto byName = [](const std::pair<std::string, uint64_t>& e, const std::string& n) { return e.first < n; };
  auto it = std::lower_bound(p.hw.begin(), p.hw.end(), name, byName);  // hw is sorted by name
  return it != p.hw.end() && it->first == name ? it->second : 0;
}

}  // namespace stats
}  // namespace mesh
