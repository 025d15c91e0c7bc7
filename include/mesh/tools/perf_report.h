// SPDX-License-Identifier: Apache-2.0
// nccl-mesh-perf's pure parts, unit-tested: the data pattern the receiver verifies, the
// parameters both ranks must agree on (the server takes the client's), the receiver's
// error counts sent back at the end, and the report as a table (nccl-tests' columns), CSV
// and JSON.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace mesh {

// --- data verification --------------------------------------------------------------------
// Fills n bytes with a pseudo-random pattern determined by seed (and the offset only).
void fillPattern(void* buf, size_t n, uint64_t seed);
// How many of the n bytes differ from that pattern.
size_t countPatternErrors(const void* buf, size_t n, uint64_t seed);

// --- parameters both ranks run with -------------------------------------------------------
struct PerfParams {
  bool lat = true;
  bool bw = true;
  bool check = true;  // a verified transfer after each size's timed ones
  int latIters = 30;
  int latWarmup = 5;
  int bwIters = 20;
  int bwWarmup = 2;
  int bwWindow = 8;
  size_t bwBytes = size_t(8) << 20;
  std::vector<size_t> latSizes;
  std::vector<size_t> bwSizes;
  bool operator==(const PerfParams& o) const;
};
// One line of text; decode rejects anything it did not write, with a message.
std::string encodePerfParams(const PerfParams& p);
bool decodePerfParams(const std::string& text, PerfParams* out, std::string* error);

// Byte errors the receiver found per size, sent to the reporting rank at the end.
struct CheckCounts {
  std::map<size_t, long long> lat;
  std::map<size_t, long long> bw;
};
std::string encodeCheckCounts(const CheckCounts& c);
bool decodeCheckCounts(const std::string& text, CheckCounts* out, std::string* error);

// --- the report ------------------------------------------------------------------------------
struct LatRow {
  size_t size = 0;
  int iters = 0;
  double typUs = 0, avgUs = 0, minUs = 0;  // half round trip: median, mean, minimum
  long long wrong = -1;                    // bytes wrong in the verified round trip; -1 unchecked
};
struct BwRow {
  size_t size = 0;
  int iters = 0;
  double seconds = 0;   // from the first accepted isend to the last completion
  long long wrong = -1;
  double timeUs() const { return iters > 0 ? seconds * 1e6 / iters : 0; }
  // Bytes per second / 1e9, as nccl-tests; point to point, so busbw equals algbw.
  double algbwGBps() const { return seconds > 0 ? double(size) * iters / seconds / 1e9 : 0; }
  double busbwGBps() const { return algbwGBps(); }
  double mibPerSec() const { return seconds > 0 ? double(size) * iters / seconds / 1048576.0 : 0; }
};
struct PerfReport {
  std::string version;   // "nccl-mesh 0.1.0 (git ...)"
  std::string plugin;    // the ncclNet name
  std::string device;    // "mesh, 100000 Mbps"
  std::string peer;      // how the ranks met: "198.19.0.2:18600" or "files in DIR"
  int window = 0;
  std::vector<LatRow> lat;
  std::vector<BwRow> bw;
  long long totalWrong() const;  // -1 when nothing was checked
};
std::string formatTable(const PerfReport& r);
std::string formatCsv(const PerfReport& r);
std::string formatJson(const PerfReport& r);

}  // namespace mesh
