// SPDX-License-Identifier: Apache-2.0
#include "plugin_net.h"

#include <dlfcn.h>

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <sstream>

#include "e2e_util.h"
#include "nccl_ib.h"

namespace e2e {
namespace {

// The logger is a plain C function, so its state is global. Never destroyed: the plugin's
// threads may log while the process exits.
struct Capture {
  std::mutex mutex;
  std::vector<LogLine> lines;
  Clock::time_point start = Clock::now();
  std::atomic<bool> echoInfo{false};
};
Capture& capture() {
  static Capture* c = new Capture;
  return *c;
}

const char* levelName(ncclDebugLogLevel level) {
  switch (level) {
    case NCCL_LOG_WARN: return "WARN";
    case NCCL_LOG_INFO: return "INFO";
    case NCCL_LOG_TRACE: return "TRACE";
    case NCCL_LOG_VERSION: return "VERSION";
    case NCCL_LOG_ABORT: return "ABORT";
    default: return "LOG";
  }
}

extern "C" void captureLogger(ncclDebugLogLevel level, unsigned long /*flags*/,
                              const char* file, int line, const char* fmt, ...) {
  char buf[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  Capture& c = capture();
  double at = secondsSince(c.start);
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    c.lines.push_back(LogLine{level, at, buf});
  }
  if (level == NCCL_LOG_WARN || level == NCCL_LOG_ABORT) {
    warn("plugin %s %.3fs %s:%d %s", levelName(level), at, file ? file : "?", line, buf);
  } else if (c.echoInfo.load(std::memory_order_relaxed)) {
    say("plugin %s %.3fs %s", levelName(level), at, buf);
  }
}

bool parseInt(const std::string& s, int* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  long v = strtol(s.c_str(), &end, 10);
  if (*end != '\0') return false;
  *out = static_cast<int>(v);
  return true;
}

bool parseIpv4(const std::string& s, int octets[4]) {
  unsigned a, b, c, d;
  char tail;
  if (sscanf(s.c_str(), "%u.%u.%u.%u%c", &a, &b, &c, &d, &tail) != 4) return false;
  if (a > 255 || b > 255 || c > 255 || d > 255) return false;
  octets[0] = a, octets[1] = b, octets[2] = c, octets[3] = d;
  return true;
}

}  // namespace

bool parseConnLine(const std::string& text, ConnLine* out) {
  static const char kTag[] = "NET/Mesh : conn ";
  size_t at = text.find(kTag);
  if (at == std::string::npos) return false;
  std::istringstream in(text.substr(at + sizeof(kTag) - 1));
  ConnLine c;
  c.raw = text;
  if (!(in >> c.dir) || (c.dir != "send" && c.dir != "recv")) return false;
  std::string tok;
  bool havePeer = false, haveLocal = false;
  while (in >> tok) {
    size_t eq = tok.find('=');
    if (eq == std::string::npos) continue;
    std::string key = tok.substr(0, eq), value = tok.substr(eq + 1);
    if (key == "peer") {
      c.peer = value;
      havePeer = true;
    } else if (key == "link") {
      parseInt(value, &c.link);
    } else if (key == "local") {
      // <dev>:<port>/<netdev>
      size_t colon = value.rfind(':');
      size_t slash = value.find('/', colon == std::string::npos ? 0 : colon);
      if (colon == std::string::npos || slash == std::string::npos) return false;
      c.dev = value.substr(0, colon);
      parseInt(value.substr(colon + 1, slash - colon - 1), &c.port);
      c.netdev = value.substr(slash + 1);
      haveLocal = true;
    } else if (key == "addr") {
      c.addr = value;
    } else if (key == "gid_index") {
      parseInt(value, &c.gidIndex);
    } else if (key == "qpn") {
      parseInt(value, &c.qpn);
    } else if (key == "mtu") {
      parseInt(value, &c.mtu);
    } else if (key == "ece") {
      c.ece = value;
    }
  }
  if (!havePeer || !haveLocal) return false;
  *out = c;
  return true;
}

int labNodeOf(const std::string& ipv4) {
  int o[4];
  if (!parseIpv4(ipv4, o) || o[0] != 198 || o[1] != 18 || o[3] < 1) return -1;
  // A cable end's second function in the cable's subnet (fabric-net --functions 2): .(node+129).
  return o[3] > 128 ? o[3] - 129 : o[3] - 1;
}

int labLinkOf(const std::string& ipv4) {
  int o[4];
  if (!parseIpv4(ipv4, o) || o[0] != 198 || o[1] != 18) return -1;
  return o[2];
}

bool isNetdevTowards(const std::string& netdev, int peer) {
  std::string base = format("p%d", peer);
  // A cable end's second PCIe function (fabric-net --functions 2): p<peer>f1, p<peer>bf1.
  std::string name = netdev;
  if (name.size() > 2 && name[name.size() - 2] == 'f' && name.back() >= '1' && name.back() <= '9') {
    name.resize(name.size() - 2);
  }
  if (name == base) return true;
  if (name == "sw") return true;  // a node's port on the switch (fabric-net --topology switch) reaches every peer
  // Parallel links: p<peer>b, p<peer>c, ... (a letter, not another digit: p1 vs p12).
  return name.size() == base.size() + 1 && name.compare(0, base.size(), base) == 0 && name.back() >= 'b' &&
         name.back() <= 'z';
}

const char* resultName(int result) {
  switch (result) {
    case ncclSuccess: return "ncclSuccess";
    case ncclUnhandledCudaError: return "ncclUnhandledCudaError";
    case ncclSystemError: return "ncclSystemError";
    case ncclInternalError: return "ncclInternalError";
    case ncclInvalidArgument: return "ncclInvalidArgument";
    case ncclInvalidUsage: return "ncclInvalidUsage";
    case ncclRemoteError: return "ncclRemoteError";
    case ncclInProgress: return "ncclInProgress";
    default: return "ncclResult(unknown)";
  }
}

void PluginNet::load(const std::string& path, int version, int trafficClass, bool echoInfo) {
  capture().echoInfo.store(echoInfo);
  dlerror();
  libs_[0] = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (libs_[0] == nullptr) {
    const char* ld = getenv("LD_LIBRARY_PATH");
    fail("dlopen(\"%s\") failed: %s (LD_LIBRARY_PATH=%s)", path.c_str(), dlerror(),
         ld ? ld : "<unset>");
  }
  std::string why;
  if (!apis_[0].bind(libs_[0], version, &why)) fail("%s: %s", path.c_str(), why.c_str());
  check(apis_[0].init(captureLogger, trafficClass), "init",
        format("plugin %s, %s, traffic class %d", path.c_str(), apis_[0].symbol(), trafficClass));
}

void PluginNet::openNcclIbInto(int slot, const std::string& lib, int trafficClass) {
  fakeIbSysfs(verbsDeviceNames());
  NcclIb ib = openNcclIb(lib);
  libs_[slot] = ib.lib;
  ncclIb_[slot] = true;
  std::string why;
  if (!apis_[slot].bindTable(ib.table, 11, "ncclNetIb in " + ib.path, &why)) fail("nccl-ib: %s", why.c_str());
  say("reference: NCCL %d's IB transport (ncclNetIb in %s)%s", ib.version, ib.path.c_str(),
      slot == 0 ? " instead of the plugin" : " beside the plugin");
  check(apis_[slot].init(captureLogger, trafficClass), "init", format("NCCL's IB transport in %s", ib.path.c_str()));
}

void PluginNet::loadNcclIb(const std::string& lib, int trafficClass, bool echoInfo) {
  capture().echoInfo.store(echoInfo);
  openNcclIbInto(0, lib, trafficClass);
}

void PluginNet::addNcclIb(const std::string& lib, int trafficClass) {
  if (libs_[0] == nullptr || libs_[1] != nullptr) fail("nccl-ib beside the plugin: load the plugin first, once");
  if (ncclIb_[0]) fail("nccl-ib beside nccl-ib: load the plugin first");
  openNcclIbInto(1, lib, trafficClass);
}

void PluginNet::use(int slot) {
  if (slot < 0 || slot > 1 || libs_[slot] == nullptr) fail("PluginNet::use(%d): no transport there", slot);
  cur_ = slot;
}

void PluginNet::unload() {
  for (int slot = 1; slot >= 0; --slot) {
    if (libs_[slot] == nullptr) continue;
    cur_ = slot;
    check(apis_[slot].finalize(), "finalize", format("%s, before dlclose", apis_[slot].symbol()));
    // NCCL IB's per-device threads outlive its finalize: its library stays until exit.
    if (!ncclIb_[slot] && dlclose(libs_[slot]) != 0) fail("dlclose failed: %s", dlerror());
    libs_[slot] = nullptr;
  }
  cur_ = 0;
}

void PluginNet::check(ncclResult_t r, const char* what, const std::string& context) const {
  if (r == ncclSuccess) return;
  std::string last = lastWarn();
  fail("%s returned %s (%d): %s%s%s", what, resultName(r), static_cast<int>(r),
       context.c_str(), last.empty() ? "" : "; plugin's last WARN: ", last.c_str());
}

size_t PluginNet::logSize() const {
  std::lock_guard<std::mutex> lock(capture().mutex);
  return capture().lines.size();
}

std::vector<LogLine> PluginNet::logSince(size_t mark) const {
  std::lock_guard<std::mutex> lock(capture().mutex);
  const std::vector<LogLine>& all = capture().lines;
  if (mark >= all.size()) return {};
  return std::vector<LogLine>(all.begin() + static_cast<long>(mark), all.end());
}

std::vector<ConnLine> PluginNet::connLines(size_t since) const {
  std::vector<ConnLine> out;
  for (const LogLine& l : logSince(since)) {
    ConnLine c;
    if (l.level == NCCL_LOG_INFO && parseConnLine(l.text, &c)) out.push_back(c);
  }
  return out;
}

std::string PluginNet::findWarn(const std::string& needle, size_t since) const {
  for (const LogLine& l : logSince(since)) {
    if (l.level == NCCL_LOG_WARN && l.text.find(needle) != std::string::npos) return l.text;
  }
  return std::string();
}

std::string PluginNet::lastWarn() const {
  std::lock_guard<std::mutex> lock(capture().mutex);
  const std::vector<LogLine>& all = capture().lines;
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (it->level == NCCL_LOG_WARN) return it->text;
  }
  return std::string();
}

void PluginNet::dumpTail(size_t n) const {
  std::vector<LogLine> all = logSince(0);
  size_t from = all.size() > n ? all.size() - n : 0;
  if (from < all.size()) say("last %zu of %zu plugin log lines:", all.size() - from, all.size());
  for (size_t i = from; i < all.size(); ++i) {
    say("  plugin %s %.3fs %s", levelName(all[i].level), all[i].at, all[i].text.c_str());
  }
}

}  // namespace e2e
