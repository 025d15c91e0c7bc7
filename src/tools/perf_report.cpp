// SPDX-License-Identifier: Apache-2.0
#include "mesh/tools/perf_report.h"

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "mesh/platform/text.h"

namespace mesh {

namespace {

uint64_t mix(uint64_t x) {  // splitmix64's finalizer: every word of the pattern differs
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t patternWord(uint64_t seed, size_t word) { return mix(seed * 0x100000001b3ull + word); }

std::string joinSizes(const std::vector<size_t>& sizes) {
  std::string out;
  for (size_t s : sizes) out += (out.empty() ? "" : ",") + std::to_string(s);
  return out;
}

bool parseNumber(const std::string& text, unsigned long long* out) {
  if (text.empty() || text.size() > 20) return false;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
  }
  errno = 0;
  *out = strtoull(text.c_str(), nullptr, 10);
  return errno == 0;
}

bool parseSizeList(const std::string& text, std::vector<size_t>* out) {
  out->clear();
  if (text.empty()) return true;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    unsigned long long v = 0;
    if (!parseNumber(item, &v)) return false;
    out->push_back(static_cast<size_t>(v));
  }
  return true;
}

std::string wrongText(long long wrong) { return wrong < 0 ? "-" : std::to_string(wrong); }

std::string jsonWrong(long long wrong) { return wrong < 0 ? "null" : std::to_string(wrong); }

}  // namespace

void fillPattern(void* buf, size_t n, uint64_t seed) {
  auto* p = static_cast<unsigned char*>(buf);
  size_t words = n / 8;
  for (size_t w = 0; w < words; ++w) {
    uint64_t v = patternWord(seed, w);
    memcpy(p + w * 8, &v, 8);
  }
  if (n % 8 != 0) {
    uint64_t v = patternWord(seed, words);
    memcpy(p + words * 8, &v, n % 8);
  }
}

size_t countPatternErrors(const void* buf, size_t n, uint64_t seed) {
  auto* p = static_cast<const unsigned char*>(buf);
  size_t wrong = 0;
  for (size_t w = 0; w * 8 < n; ++w) {
    uint64_t want = patternWord(seed, w);
    size_t len = std::min<size_t>(8, n - w * 8);
    uint64_t got = 0;
    memcpy(&got, p + w * 8, len);
    if (len < 8) want &= (uint64_t(1) << (len * 8)) - 1;
    if (got == want) continue;
    for (size_t b = 0; b < len; ++b) wrong += ((got >> (b * 8)) & 0xff) != ((want >> (b * 8)) & 0xff);
  }
  return wrong;
}

bool PerfParams::operator==(const PerfParams& o) const { return encodePerfParams(*this) == encodePerfParams(o); }

std::string encodePerfParams(const PerfParams& p) {
  return strf("perf-params 2 lat=%d bw=%d check=%d li=%d lw=%d bi=%d bwu=%d win=%d bb=%zu", p.lat, p.bw,
              p.check, p.latIters, p.latWarmup, p.bwIters, p.bwWarmup, p.bwWindow, p.bwBytes) +
         " ls=" + joinSizes(p.latSizes) + " bs=" + joinSizes(p.bwSizes);
}

bool decodePerfParams(const std::string& text, PerfParams* out, std::string* error) {
  std::stringstream in(text);
  std::string magic, version, token;
  if (!(in >> magic >> version) || magic != "perf-params" || version != "2") {
    *error = "not nccl-mesh-perf parameters of this version (the two sides run different versions?)";
    return false;
  }
  PerfParams p;
  std::map<std::string, int*> ints = {{"li", &p.latIters}, {"lw", &p.latWarmup}, {"bi", &p.bwIters},
                                      {"bwu", &p.bwWarmup}, {"win", &p.bwWindow}};
  std::map<std::string, bool*> flags = {{"lat", &p.lat}, {"bw", &p.bw}, {"check", &p.check}};
  size_t seen = 0;
  while (in >> token) {
    size_t eq = token.find('=');
    std::string key = token.substr(0, eq), value = eq == std::string::npos ? "" : token.substr(eq + 1);
    unsigned long long v = 0;
    bool ok = eq != std::string::npos;
    if (ok && ints.count(key)) {
      ok = parseNumber(value, &v) && v <= 1000000000ull;
      if (ok) *ints[key] = static_cast<int>(v);
    } else if (ok && flags.count(key)) {
      ok = value == "0" || value == "1";
      if (ok) *flags[key] = value == "1";
    } else if (ok && key == "bb") {
      ok = parseNumber(value, &v);
      if (ok) p.bwBytes = static_cast<size_t>(v);
    } else if (ok && (key == "ls" || key == "bs")) {
      ok = parseSizeList(value, key == "ls" ? &p.latSizes : &p.bwSizes);
    } else {
      ok = false;
    }
    if (!ok) {
      *error = "bad parameter '" + token + "'";
      return false;
    }
    ++seen;
  }
  if (seen != ints.size() + flags.size() + 3) {
    *error = "incomplete parameters: " + text;
    return false;
  }
  *out = p;
  return true;
}

std::string encodeCheckCounts(const CheckCounts& c) {
  std::string out = "perf-checks 1";
  for (const auto& kv : c.lat) out += strf(" lat:%zu=%lld", kv.first, kv.second);
  for (const auto& kv : c.bw) out += strf(" bw:%zu=%lld", kv.first, kv.second);
  return out;
}

bool decodeCheckCounts(const std::string& text, CheckCounts* out, std::string* error) {
  std::stringstream in(text);
  std::string magic, version, token;
  if (!(in >> magic >> version) || magic != "perf-checks" || version != "1") {
    *error = "not nccl-mesh-perf check counts";
    return false;
  }
  CheckCounts c;
  while (in >> token) {
    size_t colon = token.find(':'), eq = token.find('=');
    unsigned long long size = 0, wrong = 0;
    std::string kind = token.substr(0, colon);
    if (colon == std::string::npos || eq == std::string::npos || eq < colon ||
        (kind != "lat" && kind != "bw") || !parseNumber(token.substr(colon + 1, eq - colon - 1), &size) ||
        !parseNumber(token.substr(eq + 1), &wrong)) {
      *error = "bad check count '" + token + "'";
      return false;
    }
    (kind == "lat" ? c.lat : c.bw)[static_cast<size_t>(size)] = static_cast<long long>(wrong);
  }
  *out = c;
  return true;
}

long long PerfReport::totalWrong() const {
  long long total = -1;
  for (const LatRow& l : lat) {
    if (l.wrong >= 0) total = (total < 0 ? 0 : total) + l.wrong;
  }
  for (const BwRow& b : bw) {
    if (b.wrong >= 0) total = (total < 0 ? 0 : total) + b.wrong;
  }
  return total;
}

std::string formatTable(const PerfReport& r) {
  std::string out = "# nccl-mesh-perf: " + r.version + "\n# plugin " + r.plugin + ", device " + r.device +
                    "; ranks met through " + r.peer + "\n";
  if (!r.lat.empty()) {
    out += "#\n# latency: ping-pong between the two ranks; time = half the round trip (median)\n";
    out += strf("# %10s %12s %6s %11s %11s %11s %7s %7s\n", "size", "count", "type", "time(us)", "avg(us)",
                "min(us)", "iters", "#wrong");
    for (const LatRow& l : r.lat) {
      out += strf("  %10zu %12zu %6s %11.2f %11.2f %11.2f %7d %7s\n", l.size, l.size, "uint8", l.typUs, l.avgUs,
                  l.minUs, l.iters, wrongText(l.wrong).c_str());
    }
  }
  if (!r.bw.empty()) {
    out += strf("#\n# bandwidth: rank 0 sends to rank 1, %d sends outstanding; time = per message;\n"
                "# algbw = size / time (GB/s = 1e9 B/s); busbw = algbw (point to point)\n", r.window);
    out += strf("# %10s %12s %6s %11s %11s %11s %7s %7s\n", "size", "count", "type", "time(us)", "algbw(GB/s)",
                "busbw(GB/s)", "iters", "#wrong");
    for (const BwRow& b : r.bw) {
      out += strf("  %10zu %12zu %6s %11.2f %11.3f %11.3f %7d %7s\n", b.size, b.size, "uint8", b.timeUs(),
                  b.algbwGBps(), b.busbwGBps(), b.iters, wrongText(b.wrong).c_str());
    }
  }
  long long wrong = r.totalWrong();
  out += "#\n";
  out += wrong < 0 ? std::string("# Data check: not done (--no-check)\n")
                   : strf("# Data check: %lld byte(s) wrong%s\n", wrong, wrong == 0 ? ", every transfer verified" : "");
  if (!r.bw.empty()) {
    double sum = 0;
    for (const BwRow& b : r.bw) sum += b.busbwGBps();
    out += strf("# Avg bus bandwidth: %.3f GB/s\n", sum / static_cast<double>(r.bw.size()));
  }
  return out;
}

std::string formatCsv(const PerfReport& r) {
  std::string out = "test,size_bytes,count,type,iters,time_us,avg_us,min_us,algbw_GBps,busbw_GBps,wrong\n";
  for (const LatRow& l : r.lat) {
    out += strf("latency,%zu,%zu,uint8,%d,%.3f,%.3f,%.3f,,,%s\n", l.size, l.size, l.iters, l.typUs, l.avgUs, l.minUs,
                l.wrong < 0 ? "" : std::to_string(l.wrong).c_str());
  }
  for (const BwRow& b : r.bw) {
    out += strf("bandwidth,%zu,%zu,uint8,%d,%.3f,,,%.6f,%.6f,%s\n", b.size, b.size, b.iters, b.timeUs(),
                b.algbwGBps(), b.busbwGBps(), b.wrong < 0 ? "" : std::to_string(b.wrong).c_str());
  }
  return out;
}

std::string formatJson(const PerfReport& r) {
  std::string out = "{\n  \"tool\": \"nccl-mesh-perf\",\n  \"version\": " + jsonString(r.version) +
                    ",\n  \"plugin\": " + jsonString(r.plugin) + ",\n  \"device\": " + jsonString(r.device) +
                    ",\n  \"peer\": " + jsonString(r.peer) + ",\n  \"window\": " + std::to_string(r.window) +
                    ",\n  \"latency\": [";
  for (size_t i = 0; i < r.lat.size(); ++i) {
    const LatRow& l = r.lat[i];
    out += strf("%s\n    {\"size\": %zu, \"count\": %zu, \"type\": \"uint8\", \"iters\": %d, \"time_us\": %.3f, "
                "\"avg_us\": %.3f, \"min_us\": %.3f, \"wrong\": %s}",
                i ? "," : "", l.size, l.size, l.iters, l.typUs, l.avgUs, l.minUs, jsonWrong(l.wrong).c_str());
  }
  out += r.lat.empty() ? "],\n  \"bandwidth\": [" : "\n  ],\n  \"bandwidth\": [";
  for (size_t i = 0; i < r.bw.size(); ++i) {
    const BwRow& b = r.bw[i];
    out += strf("%s\n    {\"size\": %zu, \"count\": %zu, \"type\": \"uint8\", \"iters\": %d, \"time_us\": %.3f, "
                "\"algbw_GBps\": %.6f, \"busbw_GBps\": %.6f, \"wrong\": %s}",
                i ? "," : "", b.size, b.size, b.iters, b.timeUs(), b.algbwGBps(), b.busbwGBps(),
                jsonWrong(b.wrong).c_str());
  }
  out += r.bw.empty() ? "],\n" : "\n  ],\n";
  return out + "  \"wrong\": " + jsonWrong(r.totalWrong()) + "\n}\n";
}

}  // namespace mesh
