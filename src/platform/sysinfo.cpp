// SPDX-License-Identifier: Apache-2.0
#include "mesh/platform/sysinfo.h"

#include <sys/resource.h>

#include <cerrno>
#include <cinttypes>
#include <cstring>
#include <fstream>
#include <sstream>

#include "mesh/platform/text.h"

namespace mesh {

bool readTextFile(const std::string& path, std::string* out, std::string* error, size_t maxBytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    *error = "cannot read " + path + ": " + std::strerror(errno != 0 ? errno : ENOENT);
    return false;
  }
  out->clear();
  char buf[4096];
  while (out->size() < maxBytes && in.read(buf, sizeof(buf)).gcount() > 0) {
    out->append(buf, static_cast<size_t>(in.gcount()));
  }
  if (in.bad()) {
    // A directory opens but does not read (EISDIR), as do some sysfs attributes.
    *error = "cannot read " + path + ": " + std::strerror(errno != 0 ? errno : EIO);
    return false;
  }
  return true;
}

namespace {

// The text after `key` at the start of a line, or false.
bool lineAfter(const std::string& text, const std::string& key, std::string* rest) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, key.size(), key) == 0) {
      *rest = line.substr(key.size());
      return true;
    }
  }
  return false;
}

bool parseLimitValue(const std::string& word, uint64_t* value, bool* unlimited) {
  if (word == "unlimited") {
    *unlimited = true;
    return true;
  }
  *unlimited = false;
  if (word.empty() || word.find_first_not_of("0123456789") != std::string::npos) return false;
  errno = 0;
  *value = strtoull(word.c_str(), nullptr, 10);
  return errno == 0;
}

}  // namespace

bool parseMemlockLimit(const std::string& limitsText, MemlockLimit* out) {
  std::string rest;
  if (!lineAfter(limitsText, "Max locked memory", &rest)) return false;
  std::istringstream words(rest);
  std::string soft, hard;
  if (!(words >> soft >> hard)) return false;
  MemlockLimit m;
  if (!parseLimitValue(soft, &m.softBytes, &m.softUnlimited) ||
      !parseLimitValue(hard, &m.hardBytes, &m.hardUnlimited)) {
    return false;
  }
  m.known = true;
  *out = m;
  return true;
}

bool parseMeminfoKb(const std::string& meminfoText, const std::string& key, uint64_t* kb) {
  std::string rest;
  if (!lineAfter(meminfoText, key + ":", &rest)) return false;
  std::istringstream words(rest);
  std::string number, unit;
  if (!(words >> number) || number.find_first_not_of("0123456789") != std::string::npos) return false;
  words >> unit;
  if (!unit.empty() && unit != "kB") return false;
  *kb = strtoull(number.c_str(), nullptr, 10);
  return true;
}

bool parseCma(const std::string& meminfoText, CmaFigures* out) {
  CmaFigures c;
  c.known = parseMeminfoKb(meminfoText, "CmaTotal", &c.totalKb) &&
            parseMeminfoKb(meminfoText, "CmaFree", &c.freeKb);
  *out = c;
  return c.known;
}

bool parseCapIpcLock(const std::string& statusText, bool* has) {
  std::string rest;
  if (!lineAfter(statusText, "CapEff:", &rest)) return false;
  std::string hex = trim(rest);
  if (hex.empty() || hex.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos) return false;
  constexpr int kCapIpcLock = 14;
  *has = (strtoull(hex.c_str(), nullptr, 16) >> kCapIpcLock) & 1;
  return true;
}

std::string bytesText(uint64_t bytes, bool unlimited) {
  if (unlimited) return "unlimited";
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  if (u == 0) return std::to_string(bytes) + " bytes";
  return v == static_cast<double>(static_cast<uint64_t>(v)) ? strf("%" PRIu64 " %s", static_cast<uint64_t>(v), units[u])
                                                           : strf("%.1f %s", v, units[u]);
}

std::string pinningAdvice(const MemlockLimit& limit, const CmaFigures& cma) {
  std::string out;
  if (limit.known) {
    out += "; RLIMIT_MEMLOCK is " + bytesText(limit.softBytes, limit.softUnlimited) + " (soft) / " +
           bytesText(limit.hardBytes, limit.hardUnlimited) + " (hard)";
  } else {
    out += "; the locked-memory limit (RLIMIT_MEMLOCK) could not be read";
  }
  if (cma.known) {
    out += strf("; /proc/meminfo: CmaTotal %" PRIu64 " kB, CmaFree %" PRIu64 " kB", cma.totalKb, cma.freeKb);
  }
  if (cma.anomalous()) {
    out += " (CmaFree above CmaTotal: the kernel hands out pageblocks typed CMA, e.g. Kexec HandOver's "
           "scratch area, and pinned pages cannot stay there; fix: boot with kho=off on the kernel "
           "command line, or a kernel without KHO enabled by default)";
  }
  if (!limit.softUnlimited) {
    out += "; fix: raise the limit: `ulimit -l unlimited` (docker: --ulimit memlock=-1; systemd: "
           "LimitMEMLOCK=infinity)";
  }
  return out;
}

std::string pinningAdviceForThisProcess() {
  MemlockLimit limit;
  rlimit lim{};
  if (getrlimit(RLIMIT_MEMLOCK, &lim) == 0) {
    limit.known = true;
    limit.softUnlimited = lim.rlim_cur == RLIM_INFINITY;
    limit.hardUnlimited = lim.rlim_max == RLIM_INFINITY;
    limit.softBytes = lim.rlim_cur;
    limit.hardBytes = lim.rlim_max;
  }
  CmaFigures cma;
  std::string text, error;
  if (readTextFile("/proc/meminfo", &text, &error)) parseCma(text, &cma);
  return pinningAdvice(limit, cma);
}

}  // namespace mesh
