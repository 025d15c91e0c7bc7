// SPDX-License-Identifier: Apache-2.0
// The Prometheus text (stats/prometheus.h) read back by a parser of the exposition format
// written here, strict where the format is: # HELP and # TYPE once per family and before its
// samples, a family's samples together, names and label names by the format's regexes,
// escaped label values, numeric values, no sample twice. Then the figures themselves, and
// writeFileAtomic.
#include <gtest/gtest.h>

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "mesh/stats/prometheus.h"
#include "temp_dir.h"

namespace mesh {
namespace stats {
namespace {

using LabelMap = std::map<std::string, std::string>;

struct Family {
  std::string type, help;
  int helpLines = 0, typeLines = 0, samples = 0;
};

struct Exposition {
  std::map<std::string, Family> families;
  std::map<std::pair<std::string, LabelMap>, std::string> samples;  // (name, labels) -> value text
  std::vector<std::string> errors;                                   // "line N: what"
};

const std::regex kMetricName("[a-zA-Z_:][a-zA-Z0-9_:]*");
const std::regex kLabelName("[a-zA-Z_][a-zA-Z0-9_]*");

// `s` from *pos up to the first character of `stops` (or the end).
std::string until(const std::string& s, size_t* pos, const char* stops) {
  size_t end = s.find_first_of(stops, *pos);
  if (end == std::string::npos) end = s.size();
  std::string out = s.substr(*pos, end - *pos);
  *pos = end;
  return out;
}

// A quoted label value at *pos (after its opening quote), unescaped; false on a bad escape or
// no closing quote.
bool labelValue(const std::string& s, size_t* pos, std::string* out) {
  for (size_t i = *pos; i < s.size(); ++i) {
    if (s[i] == '"') {
      *pos = i + 1;
      return true;
    }
    if (s[i] != '\\') {
      *out += s[i];
      continue;
    }
    if (++i == s.size()) return false;
    if (s[i] == 'n') {
      *out += '\n';
    } else if (s[i] == '\\' || s[i] == '"') {
      *out += s[i];
    } else {
      return false;
    }
  }
  return false;
}

// name{label="value",...} value
bool parseSample(const std::string& line, std::string* name, LabelMap* labels, std::string* value, std::string* why) {
  size_t pos = 0;
  *name = until(line, &pos, "{ ");
  if (!std::regex_match(*name, kMetricName)) return *why = "bad metric name '" + *name + "'", false;
  if (pos < line.size() && line[pos] == '{') {
    ++pos;
    while (pos < line.size() && line[pos] != '}') {
      std::string label = until(line, &pos, "=");
      if (!std::regex_match(label, kLabelName)) return *why = "bad label name '" + label + "'", false;
      if (line.compare(pos, 2, "=\"") != 0) return *why = "label " + label + " without =\"", false;
      pos += 2;
      std::string v;
      if (!labelValue(line, &pos, &v)) return *why = "bad value of label " + label, false;
      if (!labels->emplace(label, v).second) return *why = "label " + label + " twice", false;
      if (pos < line.size() && line[pos] == ',') ++pos;
    }
    if (pos == line.size()) return *why = "no closing }", false;
    ++pos;
  }
  if (pos >= line.size() || line[pos] != ' ') return *why = "no space before the value", false;
  *value = line.substr(pos + 1);
  char* end = nullptr;
  errno = 0;
  std::strtod(value->c_str(), &end);
  if (value->empty() || *end != '\0' || errno != 0) return *why = "value '" + *value + "' is not a number", false;
  return true;
}

std::string unescapeHelp(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size()) {
      ++i;
      out += s[i] == 'n' ? '\n' : s[i];
    } else {
      out += s[i];
    }
  }
  return out;
}

Exposition parse(const std::string& text) {
  Exposition x;
  if (!text.empty() && text.back() != '\n') x.errors.push_back("no newline at the end");
  std::istringstream in(text);
  std::string line, current;  // current: the family whose samples we are in
  std::set<std::string> finished;
  for (int n = 1; std::getline(in, line); ++n) {
    std::string at = "line " + std::to_string(n) + ": ";
    if (line.rfind("# HELP ", 0) == 0 || line.rfind("# TYPE ", 0) == 0) {
      size_t pos = 7;
      std::string name = until(line, &pos, " ");
      if (!std::regex_match(name, kMetricName)) x.errors.push_back(at + "bad family name '" + name + "'");
      if (pos == line.size()) x.errors.push_back(at + "no text after the name");
      std::string rest = pos < line.size() ? line.substr(pos + 1) : "";
      Family& f = x.families[name];
      if (f.samples > 0) x.errors.push_back(at + name + ": HELP or TYPE after its samples");
      int& seen = line[2] == 'H' ? f.helpLines : f.typeLines;
      if (++seen > 1) x.errors.push_back(at + name + ": a second " + line.substr(2, 4) + " line");
      if (line[2] == 'H') {
        f.help = unescapeHelp(rest);
      } else {
        f.type = rest;
        if (rest != "counter" && rest != "gauge") x.errors.push_back(at + name + ": type '" + rest + "'");
      }
      continue;
    }
    if (line.empty() || line[0] == '#') {
      x.errors.push_back(at + "unexpected line '" + line + "'");
      continue;
    }
    std::string name, value, why;
    LabelMap labels;
    if (!parseSample(line, &name, &labels, &value, &why)) {
      x.errors.push_back(at + why + " in '" + line + "'");
      continue;
    }
    auto f = x.families.find(name);
    if (f == x.families.end() || f->second.helpLines == 0 || f->second.typeLines == 0) {
      x.errors.push_back(at + name + ": sample before its HELP and TYPE");
    } else {
      f->second.samples++;
    }
    if (name != current) {
      if (!finished.insert(name).second) x.errors.push_back(at + name + ": its samples are not together");
      current = name;
    }
    if (!x.samples.emplace(std::make_pair(name, labels), value).second) {
      x.errors.push_back(at + "duplicate sample '" + line + "'");
    }
  }
  return x;
}

// The value text of (name, labels), or "" when there is no such sample.
std::string valueOf(const Exposition& x, const std::string& name, const LabelMap& labels) {
  auto it = x.samples.find(std::make_pair(name, labels));
  return it == x.samples.end() ? std::string() : it->second;
}

int samplesOf(const Exposition& x, const std::string& name) {
  int n = 0;
  for (const auto& s : x.samples) n += s.first.first == name;
  return n;
}

constexpr uint32_t kA = 0xc6120001;  // 198.18.0.1
constexpr uint32_t kB = 0xc6120002;  // 198.18.0.2
constexpr uint32_t kC = 0xc6120103;  // 198.18.1.3
const std::string kWeird = "rocep1s0f1 \"quoted\" back\\slash\nsecond line";

Totals sampleTotals() {
  Totals t;
  t.processes = 3;
  for (int e = 0; e < kEventCount; ++e) t.events[e] = 100 + static_cast<uint64_t>(e);
  LinkCount l1;
  l1.device = "rocep1s0f0";
  l1.port = 1;
  l1.localAddr = kA;
  l1.peerAddr = kB;
  l1.txBytes = (uint64_t(1) << 53) + 1;  // past a double's integers: the text must stay exact
  l1.rxBytes = 2000;
  l1.txOps = 30;
  l1.errors = 1;
  LinkCount l2 = l1;
  l2.device = kWeird;
  l2.port = 2;
  l2.txBytes = 5;
  l2.rxBytes = 6;
  l2.txOps = 7;
  l2.errors = 0;
  t.links = {l1, l2};
  FlowCount direct;
  direct.peerAddr = kB;
  direct.txBytes = 11;
  direct.rxBytes = 12;
  direct.opened = 5;
  direct.closed = 2;
  FlowCount relayed;
  relayed.kind = FlowKind::Relayed;
  relayed.peerAddr = kC;
  relayed.viaAddr = kB;
  relayed.txBytes = 21;
  relayed.rxBytes = 22;
  relayed.opened = 1;
  relayed.closed = 2;  // read mid-update: never a negative gauge
  relayed.errors = 4;
  FlowCount forwarded;
  forwarded.kind = FlowKind::Forwarded;
  forwarded.peerAddr = kC;
  forwarded.originAddr = kA;
  forwarded.txBytes = 31;
  t.flows = {direct, relayed, forwarded};
  return t;
}

std::vector<NicPortCounters> sampleNics() {
  NicPortCounters a;
  a.device = "mlx5_0";
  a.port = 1;
  a.haveData = true;
  a.txBytes = 4000;
  a.rxBytes = 8000;
  a.txPackets = 10;
  a.rxPackets = 20;
  a.hw = {{"np_cnp_sent", 3}, {"roce_adp_retrans", 9}};
  NicPortCounters b;  // no readable counters/: hw counters only
  b.device = "mlx5_0";
  b.port = 2;
  b.hw = {{"roce_adp_retrans", 1}};
  return {a, b};
}

TEST(Prometheus, EveryFamilyHasOneHelpAndTypeBeforeItsSamples) {
  std::vector<LinkLabels> extra = {{"0", kWeird}};  // shorter than the links: l2 gets none
  std::string text = prometheusText(sampleTotals(), extra, sampleNics());
  Exposition x = parse(text);
  EXPECT_TRUE(x.errors.empty()) << ::testing::PrintToString(x.errors) << "\n" << text;
  EXPECT_EQ(x.families.size(), 11u) << text;
  for (const auto& f : x.families) {
    EXPECT_EQ(f.second.helpLines, 1) << f.first;
    EXPECT_EQ(f.second.typeLines, 1) << f.first;
    EXPECT_GT(f.second.samples, 0) << f.first;
    EXPECT_FALSE(f.second.help.empty()) << f.first;
    bool total = f.first.size() > 6 && f.first.compare(f.first.size() - 6, 6, "_total") == 0;
    EXPECT_EQ(f.second.type == "counter", total) << f.first << " is a " << f.second.type;
    EXPECT_EQ(f.first.rfind("nccl_mesh_", 0), 0u) << f.first;
  }
}

TEST(Prometheus, LabelValuesRoundTripTheirEscapes) {
  std::vector<LinkLabels> extra = {{"0", kWeird}};
  std::string text = prometheusText(sampleTotals(), extra, {});
  EXPECT_NE(text.find("\\\"quoted\\\" back\\\\slash\\nsecond"), std::string::npos) << text;
  Exposition x = parse(text);
  ASSERT_TRUE(x.errors.empty()) << ::testing::PrintToString(x.errors);
  LabelMap l1 = {{"device", "rocep1s0f0"}, {"port", "1"}, {"local", "198.18.0.1"}, {"peer", "198.18.0.2"},
                 {"cable", "0"}, {"function", kWeird}, {"direction", "rx"}};
  EXPECT_EQ(valueOf(x, "nccl_mesh_link_bytes_total", l1), "2000");
  LabelMap l2 = {{"device", kWeird}, {"port", "2"}, {"local", "198.18.0.1"}, {"peer", "198.18.0.2"}};
  EXPECT_EQ(valueOf(x, "nccl_mesh_link_work_requests_total", l2), "7");
}

TEST(Prometheus, TheFiguresAreTheTotals) {
  Totals t = sampleTotals();
  std::vector<LinkLabels> extra = {{"0", "enp1s0f0np0"}};
  Exposition x = parse(prometheusText(t, extra, sampleNics()));
  ASSERT_TRUE(x.errors.empty()) << ::testing::PrintToString(x.errors);
  EXPECT_EQ(valueOf(x, "nccl_mesh_processes", {}), "3");

  LabelMap link1 = {{"device", "rocep1s0f0"}, {"port", "1"}, {"local", "198.18.0.1"}, {"peer", "198.18.0.2"}};
  LabelMap bytes1 = link1;
  bytes1["cable"] = "0";
  bytes1["function"] = "enp1s0f0np0";
  bytes1["direction"] = "tx";
  EXPECT_EQ(valueOf(x, "nccl_mesh_link_bytes_total", bytes1), "9007199254740993");
  bytes1["direction"] = "rx";
  EXPECT_EQ(valueOf(x, "nccl_mesh_link_bytes_total", bytes1), "2000");
  EXPECT_EQ(valueOf(x, "nccl_mesh_link_work_requests_total", link1), "30");
  EXPECT_EQ(valueOf(x, "nccl_mesh_link_errors_total", link1), "1");
  LabelMap bytes2 = {{"device", kWeird}, {"port", "2"}, {"local", "198.18.0.1"}, {"peer", "198.18.0.2"}, {"direction", "tx"}};
  EXPECT_EQ(valueOf(x, "nccl_mesh_link_bytes_total", bytes2), "5");  // no cable, no function
  EXPECT_EQ(samplesOf(x, "nccl_mesh_link_bytes_total"), 4);

  LabelMap direct = {{"kind", "direct"}, {"peer", "198.18.0.2"}, {"via", ""}, {"origin", ""}};
  LabelMap relayed = {{"kind", "relayed"}, {"peer", "198.18.1.3"}, {"via", "198.18.0.2"}, {"origin", ""}};
  LabelMap forwarded = {{"kind", "forwarded"}, {"peer", "198.18.1.3"}, {"via", ""}, {"origin", "198.18.0.1"}};
  auto dir = [](LabelMap l, const char* d) {
    l["direction"] = d;
    return l;
  };
  EXPECT_EQ(valueOf(x, "nccl_mesh_flow_bytes_total", dir(direct, "tx")), "11");
  EXPECT_EQ(valueOf(x, "nccl_mesh_flow_bytes_total", dir(direct, "rx")), "12");
  EXPECT_EQ(valueOf(x, "nccl_mesh_flow_bytes_total", dir(relayed, "tx")), "21");
  EXPECT_EQ(valueOf(x, "nccl_mesh_flow_bytes_total", dir(forwarded, "tx")), "31");
  EXPECT_EQ(valueOf(x, "nccl_mesh_flow_connections", direct), "3");
  EXPECT_EQ(valueOf(x, "nccl_mesh_flow_connections", relayed), "0");
  EXPECT_EQ(valueOf(x, "nccl_mesh_flow_errors_total", relayed), "4");
  EXPECT_EQ(samplesOf(x, "nccl_mesh_flow_bytes_total"), 6);

  ASSERT_EQ(samplesOf(x, "nccl_mesh_events_total"), kEventCount);
  const char* names[] = {"connects", "accepts", "connect_fails", "closes", "comm_errors", "relay_retries", "truncations", "slots_full"};
  for (int e = 0; e < kEventCount; ++e) {
    EXPECT_EQ(eventName(e), std::string(names[e]));
    EXPECT_EQ(valueOf(x, "nccl_mesh_events_total", {{"event", names[e]}}), std::to_string(100 + e)) << names[e];
  }

  EXPECT_EQ(valueOf(x, "nccl_mesh_nic_bytes_total", {{"device", "mlx5_0"}, {"port", "1"}, {"direction", "tx"}}), "4000");
  EXPECT_EQ(valueOf(x, "nccl_mesh_nic_bytes_total", {{"device", "mlx5_0"}, {"port", "1"}, {"direction", "rx"}}), "8000");
  EXPECT_EQ(valueOf(x, "nccl_mesh_nic_packets_total", {{"device", "mlx5_0"}, {"port", "1"}, {"direction", "rx"}}), "20");
  EXPECT_EQ(samplesOf(x, "nccl_mesh_nic_bytes_total"), 2);  // port 2 has no data
  EXPECT_EQ(valueOf(x, "nccl_mesh_nic_hw_counter_total", {{"device", "mlx5_0"}, {"port", "1"}, {"counter", "roce_adp_retrans"}}), "9");
  EXPECT_EQ(valueOf(x, "nccl_mesh_nic_hw_counter_total", {{"device", "mlx5_0"}, {"port", "2"}, {"counter", "roce_adp_retrans"}}), "1");
  EXPECT_EQ(samplesOf(x, "nccl_mesh_nic_hw_counter_total"), 3);
}

// Flow kinds a newer plugin wrote (its layout is the same) are each their own series:
// two under one "unknown" label made duplicate samples, which node_exporter refuses.
TEST(Prometheus, FlowKindsOfANewerPluginAreSeriesOfTheirOwn) {
  Totals t = sampleTotals();
  FlowCount seven, eight;
  seven.kind = static_cast<FlowKind>(7);
  eight.kind = static_cast<FlowKind>(8);
  seven.peerAddr = eight.peerAddr = kC;
  seven.txBytes = 70;
  eight.txBytes = 80;
  t.flows.push_back(seven);
  t.flows.push_back(eight);
  Exposition x = parse(prometheusText(t, {}, {}));
  ASSERT_TRUE(x.errors.empty()) << ::testing::PrintToString(x.errors);
  EXPECT_EQ(flowKindName(static_cast<FlowKind>(7)), "unknown_7");
  EXPECT_EQ(valueOf(x, "nccl_mesh_flow_bytes_total",
                    {{"kind", "unknown_8"}, {"peer", "198.18.1.3"}, {"via", ""}, {"origin", ""},
                     {"direction", "tx"}}),
            "80");
}

TEST(Prometheus, NothingCountedIsProcessesAndEventsOnly) {
  std::string text = prometheusText(Totals(), {}, {});
  Exposition x = parse(text);
  EXPECT_TRUE(x.errors.empty()) << ::testing::PrintToString(x.errors);
  EXPECT_EQ(x.families.size(), 2u) << text;
  EXPECT_EQ(valueOf(x, "nccl_mesh_processes", {}), "0");
  EXPECT_EQ(samplesOf(x, "nccl_mesh_events_total"), kEventCount);
  EXPECT_EQ(text.find("nccl_mesh_link"), std::string::npos) << text;
  EXPECT_EQ(text.find("nccl_mesh_nic"), std::string::npos) << text;
}

TEST(Prometheus, TheParserRefusesWhatTheFormatForbids) {
  const std::string ok = "# HELP a_total x\n# TYPE a_total counter\n";
  EXPECT_TRUE(parse(ok + "a_total{l=\"v\"} 1\n").errors.empty());
  EXPECT_FALSE(parse("a_total 1\n" + ok).errors.empty());                          // sample first
  EXPECT_FALSE(parse(ok + "# HELP a_total y\na_total 1\n").errors.empty());        // second HELP
  EXPECT_FALSE(parse(ok + "a_total{l=\"v\"} 1\na_total{l=\"v\"} 2\n").errors.empty());  // twice
  EXPECT_FALSE(parse(ok + "a_total{l=\"a\\tb\"} 1\n").errors.empty());             // bad escape
  EXPECT_FALSE(parse(ok + "a_total{1l=\"v\"} 1\n").errors.empty());                // label name
  EXPECT_FALSE(parse(ok + "a_total one\n").errors.empty());                        // value
  EXPECT_FALSE(parse(ok + "a_total 1").errors.empty());                            // last newline
  EXPECT_FALSE(parse(ok + "# TYPE a_total gauge\na_total 1\n").errors.empty());   // second TYPE
  EXPECT_FALSE(parse(ok + "a_total 1\n# HELP a_total y\n").errors.empty());       // HELP after
  std::string apart = ok + "# HELP b x\n# TYPE b gauge\na_total 1\nb 1\na_total{l=\"v\"} 2\n";
  EXPECT_FALSE(parse(apart).errors.empty());  // a_total's samples are not together
}

class PrometheusFile : public ::testing::Test {
 protected:
  std::string read(const std::string& path) {
    std::ifstream in(path);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  std::vector<std::string> entries() {
    std::vector<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(dir_)) out.push_back(e.path().filename().string());
    return out;
  }
  TempDir tmp_{"mesh-prom-"};
  std::string dir_ = tmp_.path();
};

TEST_F(PrometheusFile, WritesAndReplacesLeavingNoTemporaryFile) {
  std::string path = dir_ + "/nccl_mesh.prom";
  std::string why;
  ASSERT_TRUE(writeFileAtomic(path, "first\n", &why)) << why;
  EXPECT_EQ(read(path), "first\n");
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0644u);
  std::string big(1 << 20, 'x');
  ASSERT_TRUE(writeFileAtomic(path, big, &why)) << why;
  EXPECT_EQ(read(path), big);
  ASSERT_TRUE(writeFileAtomic(path, "", &why)) << why;
  EXPECT_EQ(read(path), "");
  EXPECT_EQ(entries(), std::vector<std::string>{"nccl_mesh.prom"});
}

TEST_F(PrometheusFile, FailsWithAReasonAndCleansUp) {
  std::string why;
  std::string missing = dir_ + "/no-such-dir/nccl_mesh.prom";
  EXPECT_FALSE(writeFileAtomic(missing, "x\n", &why));
  EXPECT_NE(why.find(missing), std::string::npos) << why;
  EXPECT_NE(why.find(std::strerror(ENOENT)), std::string::npos) << why;

  // The rename fails (a directory is in the way): the temporary file goes too.
  std::filesystem::create_directories(dir_ + "/taken.prom/inside");
  why.clear();
  EXPECT_FALSE(writeFileAtomic(dir_ + "/taken.prom", "x\n", &why));
  EXPECT_NE(why.find("taken.prom"), std::string::npos) << why;
  EXPECT_EQ(entries(), std::vector<std::string>{"taken.prom"});
}

}  // namespace
}  // namespace stats
}  // namespace mesh
