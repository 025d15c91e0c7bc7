// SPDX-License-Identifier: Apache-2.0
// mesh_e2e support: failures, clocks and deadlines, console output, the watchdog that
// turns any hang into a clear FAIL, and command-line options.
// Owns: the process-wide output label ("[e2e r<rank>]"), the current phase text and the
// watchdog thread. Everything else in tests/e2e builds on these.
#pragma once

#include <chrono>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace e2e {

// A scenario failure: what went wrong, with rank/peer/comm/sizes in the text. Thrown
// anywhere in a scenario, caught once in main, printed in the FAIL line.
class Failure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
[[noreturn]] void fail(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

using Clock = std::chrono::steady_clock;
double secondsBetween(Clock::time_point from, Clock::time_point to);
double secondsSince(Clock::time_point from);

// A point in time that loops poll against; `what` names it in timeout messages.
class Deadline {
 public:
  Deadline() : at_(Clock::time_point::max()) {}
  Deadline(double seconds, std::string what);
  bool expired() const { return Clock::now() >= at_; }
  double remaining() const;
  const std::string& what() const { return what_; }
  // The earlier of the two.
  Deadline min(const Deadline& other) const { return other.at_ < at_ ? other : *this; }

 private:
  Clock::time_point at_;
  std::string what_;
};

// One line to stdout, prefixed "[e2e r<rank>] ", flushed (vmesh prefixes the guest too).
void say(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
// The same to stderr (warnings the person must see even when stdout is filtered).
void warn(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void setRankLabel(int rank);

// What the scenario is doing now; the watchdog and the FAIL line quote it.
void setPhase(const std::string& phase);
std::string currentPhase();

// Starts the hard stop: if the process is still running `seconds` from now, prints
//   FAIL <scenario> rank=<r>: hard deadline of <s> s exceeded in phase '<phase>' ...
// and _exit(3)s. Soft deadlines inside the scenario fire first with better messages;
// this one catches a call into the plugin that never returns.
void startWatchdog(const std::string& scenario, int rank, double seconds);

// Sleeps a little; for poll loops that made no progress (the lab's guests have one vCPU
// shared with the plugin's reactor thread and the kernel's Soft-RoCE).
void pollPause(int micros);

// "--key value" / "--key=value" / "--flag" options after the scenario name.
class Options {
 public:
  // Throws Failure on a malformed argument list.
  void parse(int argc, char** argv, int first);
  bool has(const std::string& key) const { return values_.count(key) != 0; }
  std::string str(const std::string& key, const std::string& def) const;
  long integer(const std::string& key, long def) const;
  double real(const std::string& key, double def) const;
  // Throws Failure naming any option not in `known`.
  void requireKnown(const std::set<std::string>& known) const;
  std::string describe() const;

 private:
  std::map<std::string, std::string> values_;
};

// Parses "4M", "64K", "1048589", "1G" (binary multiples).
bool parseSize(const std::string& text, size_t* out);
std::string humanBytes(double bytes);

// Median of a copy of v (0 for an empty vector).
double median(std::vector<double> v);

}  // namespace e2e
