// SPDX-License-Identifier: Apache-2.0
#include "e2e_util.h"

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

namespace e2e {
namespace {

// Never destroyed: the watchdog thread reads these until _exit, possibly while main()
// is already running static destructors.
std::mutex& phaseMutex() {
  static std::mutex* m = new std::mutex;
  return *m;
}
std::string& phaseText() {
  static std::string* s = new std::string("starting");
  return *s;
}
int gRank = -1;

std::string vformat(const char* fmt, va_list ap) {
  va_list copy;
  va_copy(copy, ap);
  int n = vsnprintf(nullptr, 0, fmt, copy);
  va_end(copy);
  if (n <= 0) return std::string();
  std::string out(static_cast<size_t>(n) + 1, '\0');
  vsnprintf(&out[0], out.size(), fmt, ap);
  out.resize(static_cast<size_t>(n));
  return out;
}

void emit(FILE* stream, const std::string& text) {
  // One fwrite per line keeps lines whole when the plugin's threads print too.
  std::string line = gRank >= 0 ? format("[e2e r%d] ", gRank) : std::string("[e2e] ");
  line += text;
  line += '\n';
  fwrite(line.data(), 1, line.size(), stream);
  fflush(stream);
}

}  // namespace

std::string format(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::string s = vformat(fmt, ap);
  va_end(ap);
  return s;
}

void fail(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::string s = vformat(fmt, ap);
  va_end(ap);
  throw Failure(s);
}

double secondsBetween(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

double secondsSince(Clock::time_point from) { return secondsBetween(from, Clock::now()); }

Deadline::Deadline(double seconds, std::string what)
    : at_(Clock::now() + std::chrono::duration_cast<Clock::duration>(
                             std::chrono::duration<double>(seconds))),
      what_(std::move(what)) {}

double Deadline::remaining() const {
  if (at_ == Clock::time_point::max()) return 1e9;
  return secondsBetween(Clock::now(), at_);
}

void say(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::string s = vformat(fmt, ap);
  va_end(ap);
  emit(stdout, s);
}

void warn(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::string s = vformat(fmt, ap);
  va_end(ap);
  emit(stderr, s);
}

void setRankLabel(int rank) { gRank = rank; }

void setPhase(const std::string& phase) {
  std::lock_guard<std::mutex> lock(phaseMutex());
  phaseText() = phase;
}

std::string currentPhase() {
  std::lock_guard<std::mutex> lock(phaseMutex());
  return phaseText();
}

void startWatchdog(const std::string& scenario, int rank, double seconds) {
  std::thread([scenario, rank, seconds] {
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
    std::string msg = format(
        "FAIL %s rank=%d: hard deadline of %.0f s exceeded in phase '%s' (a call into the "
        "plugin or the peer never returned; see the lines above)\n",
        scenario.c_str(), rank, seconds, currentPhase().c_str());
    fflush(stdout);
    ssize_t w = write(STDOUT_FILENO, msg.data(), msg.size());
    (void)w;
    _exit(3);
  }).detach();
}

void pollPause(int micros) {
  struct timespec ts = {0, static_cast<long>(micros) * 1000L};
  while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
  }
}

void Options::parse(int argc, char** argv, int first) {
  for (int i = first; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("--", 0) != 0 || arg.size() < 3) {
      fail("unexpected argument '%s' (options are --name value or --name=value)", arg.c_str());
    }
    std::string key = arg.substr(2);
    std::string value = "1";
    size_t eq = key.find('=');
    if (eq != std::string::npos) {
      value = key.substr(eq + 1);
      key = key.substr(0, eq);
    } else if (i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0) {
      value = argv[++i];
    }
    values_[key] = value;
  }
}

std::string Options::str(const std::string& key, const std::string& def) const {
  auto it = values_.find(key);
  return it == values_.end() ? def : it->second;
}

long Options::integer(const std::string& key, long def) const {
  auto it = values_.find(key);
  if (it == values_.end()) return def;
  size_t size = 0;
  if (parseSize(it->second, &size)) return static_cast<long>(size);
  char* end = nullptr;
  long v = strtol(it->second.c_str(), &end, 0);
  if (end == it->second.c_str() || *end != '\0') {
    fail("--%s '%s' is not an integer", key.c_str(), it->second.c_str());
  }
  return v;
}

double Options::real(const std::string& key, double def) const {
  auto it = values_.find(key);
  if (it == values_.end()) return def;
  char* end = nullptr;
  double v = strtod(it->second.c_str(), &end);
  if (end == it->second.c_str() || *end != '\0') {
    fail("--%s '%s' is not a number", key.c_str(), it->second.c_str());
  }
  return v;
}

void Options::requireKnown(const std::set<std::string>& known) const {
  for (const auto& kv : values_) {
    if (known.count(kv.first) == 0) {
      std::string list;
      for (const std::string& k : known) list += " --" + k;
      fail("unknown option --%s (this scenario takes:%s)", kv.first.c_str(), list.c_str());
    }
  }
}

std::string Options::describe() const {
  std::string out;
  for (const auto& kv : values_) out += " --" + kv.first + "=" + kv.second;
  return out;
}

bool parseSize(const std::string& text, size_t* out) {
  if (text.empty()) return false;
  char* end = nullptr;
  errno = 0;
  unsigned long long v = strtoull(text.c_str(), &end, 10);
  if (end == text.c_str() || errno != 0 || text[0] == '-') return false;
  std::string suffix(end);
  unsigned long long mult = 1;
  if (suffix == "" ) {
    mult = 1;
  } else if (suffix == "K" || suffix == "k" || suffix == "KiB") {
    mult = 1ull << 10;
  } else if (suffix == "M" || suffix == "m" || suffix == "MiB") {
    mult = 1ull << 20;
  } else if (suffix == "G" || suffix == "g" || suffix == "GiB") {
    mult = 1ull << 30;
  } else {
    return false;
  }
  *out = static_cast<size_t>(v * mult);
  return true;
}

std::string humanBytes(double bytes) {
  if (bytes >= 1024.0 * 1024 * 1024) return format("%.2f GiB", bytes / (1024.0 * 1024 * 1024));
  if (bytes >= 1024.0 * 1024) return format("%.2f MiB", bytes / (1024.0 * 1024));
  if (bytes >= 1024.0) return format("%.1f KiB", bytes / 1024.0);
  return format("%.0f B", bytes);
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace e2e
