// SPDX-License-Identifier: Apache-2.0
// Link rates: the rates file and the shared token buckets (see pace.h).
#include "pace.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <sstream>

namespace meshfab {

namespace {

constexpr uint32_t kBucketMagic = 0x4d465042;  // "MFPB"
constexpr uint32_t kBucketVersion = 1;

bool parseNumber(const std::string& text, double* out) {
  if (text.empty()) return false;
  char* end = nullptr;
  double v = strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size() || !std::isfinite(v) || v < 0) return false;
  *out = v;
  return true;
}

bool validKey(const std::string& key) {
  return key.size() == 12 && key.find_first_not_of("0123456789abcdef") == std::string::npos;
}

bool validId(const std::string& id) {
  return !id.empty() && id.size() <= 64 &&
         id.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-") == std::string::npos;
}

}  // namespace

int64_t monoNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

std::map<std::string, PaceConfig> parseRates(const std::string& text, std::string* errors) {
  std::map<std::string, PaceConfig> out;
  std::istringstream lines(text);
  std::string line;
  int number = 0;
  while (std::getline(lines, line)) {
    ++number;
    size_t hash = line.find('#');
    if (hash != std::string::npos) line.erase(hash);
    std::istringstream words(line);
    std::string key, word;
    if (!(words >> key)) continue;  // blank or comment
    PaceConfig cfg;
    std::string bad;
    bool inbound = key == "in";
    if (inbound) {
      std::string addr;
      in_addr a{};
      if (words >> addr && inet_pton(AF_INET, addr.c_str(), &a) == 1) {
        key = inboundKey(ntohl(a.s_addr));
      } else {
        bad = "'in' needs an IPv4 address, not '" + addr + "'";
      }
    } else if (!validKey(key)) {
      bad = "port key '" + key + "' is not 12 hex digits";
    }
    while (bad.empty() && words >> word) {
      size_t eq = word.find('=');
      std::string name = word.substr(0, eq), value = eq == std::string::npos ? "" : word.substr(eq + 1);
      double v = 0;
      if (name == "wire" && validId(value)) {
        cfg.wire = value;
      } else if (name == "fn" && parseNumber(value, &v)) {
        cfg.fnRate = v;
      } else if (name == "wire_rate" && parseNumber(value, &v)) {
        cfg.wireRate = v;
      } else if (name == "delay_ns" && parseNumber(value, &v)) {
        cfg.delayNs = static_cast<int64_t>(v);
      } else {
        bad = "bad field '" + word + "'";
      }
    }
    if (bad.empty() && cfg.wireRate > 0 && cfg.wire.empty()) bad = "wire_rate without wire=<id>";
    if (bad.empty() && inbound && cfg.delayNs > 0) bad = "an inbound cap has no delay (the sender's cable has it)";
    if (!bad.empty()) {
      if (errors != nullptr) *errors += "line " + std::to_string(number) + ": " + bad + "\n";
      continue;
    }
    out[key] = cfg;
  }
  return out;
}

Bucket::~Bucket() {
  if (page_ != nullptr) munmap(page_, sizeof(BucketPage));
}

bool Bucket::open(const std::string& dir, const std::string& id, double rate, std::string* why) {
  if (rate <= 0) return true;  // no cap: inactive
  mkdir(dir.c_str(), 0777);
  std::string path = dir + "/" + id;
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  if (fd < 0) {
    *why = "cannot open " + path + ": " + strerror(errno);
    return false;
  }
  // Every process truncates to the same size; a new file reads as zeroes: next = 0 (free).
  void* m = MAP_FAILED;
  if (ftruncate(fd, sizeof(BucketPage)) == 0) {
    m = mmap(nullptr, sizeof(BucketPage), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  int err = errno;
  close(fd);
  if (m == MAP_FAILED) {
    *why = "cannot map " + path + ": " + strerror(err);
    return false;
  }
  page_ = static_cast<BucketPage*>(m);
  // Zeroes are a valid free bucket; magic and version only name the file for a reader.
  page_->magic = kBucketMagic;
  page_->version = kBucketVersion;
  nsPerByte_ = 1e9 / rate;
  return true;
}

int64_t Bucket::readyAt(int64_t now, int64_t burst) const {
  return std::max(page_->next.load(std::memory_order_acquire), now - burst);
}

int64_t Bucket::reserve(uint64_t bytes, int64_t now, int64_t burst) {
  int64_t cost = static_cast<int64_t>(std::llround(static_cast<double>(bytes) * nsPerByte_));
  int64_t cur = page_->next.load(std::memory_order_relaxed), start = 0;
  do {
    start = std::max(cur, now - burst);
  } while (!page_->next.compare_exchange_weak(cur, start + cost, std::memory_order_acq_rel, std::memory_order_relaxed));
  page_->wireBytes.fetch_add(bytes, std::memory_order_relaxed);
  return start;
}

bool Pacer::configure(const std::string& dir, const std::string& key, const PaceConfig& cfg, int64_t burstNs,
                      std::string* why) {
  cfg_ = cfg;
  burstNs_ = burstNs;
  std::string pace = dir + "/pace";
  if (!fn_.open(pace, "port-" + key, cfg.fnRate, why)) return false;
  if (!wire_.open(pace, "wire-" + cfg.wire, cfg.wireRate, why)) return false;
  return true;
}

int64_t Pacer::readyAt(int64_t now) const {
  int64_t ready = now - burstNs_;
  if (fn_.active()) ready = std::max(ready, fn_.readyAt(now, burstNs_));
  if (wire_.active()) ready = std::max(ready, wire_.readyAt(now, burstNs_));
  return ready;
}

bool Pacer::tryTransmit(uint64_t bytes, int64_t now, int64_t* retryAt, Pacer* inbound, int64_t* slot) {
  if (inbound != nullptr && *slot != 0) {  // it left this port when it took the slot: it goes then
    if (*slot > now) {
      *retryAt = *slot;
      return false;
    }
    *slot = 0;
    return true;
  }
  int64_t ready = readyAt(now);
  if (ready > now) {
    *retryAt = ready;
    return false;
  }
  chargeAnyway(bytes, now);
  if (inbound != nullptr) {
    int64_t at = inbound->reserve(bytes, now);
    if (at > now) {
      *slot = at;
      *retryAt = at;
      return false;
    }
  }
  return true;
}

void Pacer::chargeAnyway(uint64_t bytes, int64_t now) { reserve(bytes, now); }

int64_t Pacer::reserve(uint64_t bytes, int64_t now) {
  int64_t start = now - burstNs_;
  if (fn_.active()) start = std::max(start, fn_.reserve(bytes, now, burstNs_));
  if (wire_.active()) start = std::max(start, wire_.reserve(bytes, now, burstNs_));
  return start;
}

std::string inboundKey(uint32_t addr) {
  char text[INET_ADDRSTRLEN] = {};
  in_addr a{htonl(addr)};
  inet_ntop(AF_INET, &a, text, sizeof(text));
  return std::string("in-") + text;
}

}  // namespace meshfab
