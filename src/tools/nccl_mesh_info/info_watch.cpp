// SPDX-License-Identifier: Apache-2.0
// nccl-mesh-info --watch / --json / --prometheus (issue 34): the live counters of every
// process on this node that loaded the plugin (mesh/stats/stats.h), per cable and PCIe
// function, per peer (direct, relayed, forwarded by this node's relay), beside the NICs' own
// sysfs counters (mesh/stats/nic_counters.h). A frame is the change between two samples
// --interval seconds apart; totals are since each process loaded the plugin.
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "info.h"
#include "mesh/platform/ipv4.h"
#include "mesh/platform/text.h"
#include "mesh/plugin/net_devices.h"
#include "mesh/stats/nic_counters.h"
#include "mesh/stats/prometheus.h"
#include "mesh/stats/stats.h"

namespace info {

namespace {

using mesh::jsonString;
namespace st = mesh::stats;

volatile sig_atomic_t gStop = 0;
void onSignal(int) { gStop = 1; }

struct Sample {
  std::vector<st::ProcessCounts> procs;
  std::vector<st::NicPortCounters> nics;
  std::chrono::steady_clock::time_point at;
};

struct Reader {
  std::vector<std::string> dirs;
  std::string root;
  // Since the last frame was shown (the caller clears them): files that could not be read,
  // stale files removed or skipped.
  std::vector<std::string> warnings;
  std::vector<std::string> notes;
  // What processes that ended had counted when last seen, so that the Prometheus counters
  // never go back when one ends (a drop would read as a counter reset).
  std::vector<st::ProcessCounts> departed;

  Sample take() {
    Sample s;
    for (const std::string& d : dirs) {
      st::ReadResult r = st::readDir(d, true);
      for (auto& p : r.processes) s.procs.push_back(std::move(p));
      for (auto& w : r.warnings) warnings.push_back(w);
      for (auto& w : r.removed) notes.push_back("removed the stale counters of a process that ended: " + w);
      if (r.staleSkipped > 0) {
        notes.push_back(std::to_string(r.staleSkipped) + " stale file(s) of ended processes in " + d +
                        " not ours to remove: ignored");
      }
    }
    s.nics = st::readNicCounters(root, &warnings);
    s.at = std::chrono::steady_clock::now();
    return s;
  }
};

// "12.3": Gb/s with three significant digits for small rates.
std::string gbps(double bytesPerS) {
  double g = bytesPerS * 8 / 1e9;
  if (g < 10) return mesh::strf("%.2f", g);
  if (g < 100) return mesh::strf("%.1f", g);
  return mesh::strf("%.0f", g);
}

std::string bytesText(uint64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  return u == 0 ? mesh::strf("%llu B", static_cast<unsigned long long>(b)) : mesh::strf("%.1f %s", v, units[u]);
}

std::string addr(uint32_t a) { return a == 0 ? std::string("-") : mesh::formatIpv4(a); }

// What the node's ports say, for grouping the counters into cables and functions. With no
// discovery (no RDMA here, or another namespace's ports) every device:port is its own row.
struct PortRow {
  std::string device, netdev;
  int port = 0;
  int cable = -1;     // index into cables
  int speedMbps = 0;
  uint64_t txNow = 0, rxNow = 0;        // bytes in the frame
  uint64_t txTotal = 0, rxTotal = 0;
};

struct View {
  std::vector<PortRow> ports;
  std::vector<std::vector<int>> cables;  // indexes into ports
  std::vector<int> cableSpeedMbps;
};

View buildView(const mesh::Discovery& d) {
  View v;
  for (const mesh::MeshPort& p : d.ports) {
    PortRow r;
    r.device = p.device;
    r.netdev = p.netdev;
    r.port = p.port;
    r.speedMbps = p.speedMbps;
    v.ports.push_back(r);
  }
  v.cables = mesh::cableGroups(d.ports);
  for (size_t c = 0; c < v.cables.size(); ++c) {
    for (int i : v.cables[c]) v.ports[static_cast<size_t>(i)].cable = static_cast<int>(c);
    v.cableSpeedMbps.push_back(mesh::cableSpeedMbps(d.ports, v.cables[c]));
  }
  return v;
}

int portRow(View* v, const std::string& device, int port) {
  for (size_t i = 0; i < v->ports.size(); ++i) {
    if (v->ports[i].device == device && v->ports[i].port == port) return static_cast<int>(i);
  }
  // A port this node's discovery does not list: a row (and a cable) of its own.
  PortRow r;
  r.device = device;
  r.port = port;
  r.cable = static_cast<int>(v->cables.size());
  v->ports.push_back(r);
  v->cables.push_back({static_cast<int>(v->ports.size()) - 1});
  v->cableSpeedMbps.push_back(0);
  return static_cast<int>(v->ports.size()) - 1;
}

void fill(View* v, const st::Totals& now, const st::Totals& total) {
  for (PortRow& r : v->ports) r.txNow = r.rxNow = r.txTotal = r.rxTotal = 0;
  for (const st::LinkCount& l : now.links) {
    PortRow& r = v->ports[static_cast<size_t>(portRow(v, l.device, l.port))];
    r.txNow += l.txBytes;
    r.rxNow += l.rxBytes;
  }
  for (const st::LinkCount& l : total.links) {
    PortRow& r = v->ports[static_cast<size_t>(portRow(v, l.device, l.port))];
    r.txTotal += l.txBytes;
    r.rxTotal += l.rxBytes;
  }
}

std::string functionName(const PortRow& r) {
  return r.device + ":" + std::to_string(r.port) + (r.netdev.empty() ? "" : "/" + r.netdev);
}

std::string percent(double part, double whole) {
  if (whole <= 0) return "-";
  return mesh::strf("%.0f%%", 100.0 * part / whole);
}

// One frame of the table.
std::string textFrame(const Options& opt, const View& v, const Sample& before, const Sample& after,
                      const st::Totals& now, const st::Totals& total, double dt, const Reader& reader) {
  std::string out;
  char when[32] = "";
  time_t t = time(nullptr);
  struct tm tmv {};
  if (localtime_r(&t, &tmv) != nullptr) strftime(when, sizeof(when), "%H:%M:%S", &tmv);
  char host[256] = "";
  gethostname(host, sizeof(host) - 1);
  out += mesh::strf("nccl-mesh-info --watch: %s, %s, %zu process(es) with the plugin, Gb/s over %.1f s\n", host,
                    when, after.procs.size(), dt);
  for (const st::ProcessCounts& p : after.procs) {
    out += mesh::strf("  pid %lld %s\n", static_cast<long long>(p.pid), p.process.c_str());
  }
  if (after.procs.empty()) {
    out += "  no process has the plugin loaded (or NCCL_MESH_STATS=0 there; readers look in " +
           (opt.statsDir.empty() ? std::string("NCCL_MESH_STATS_DIR or /dev/shm/nccl-mesh-<uid>") : opt.statsDir) +
           ")\n";
  }

  out += "\nCables (SHARE: the function's part of its cable's traffic; CEILING: the cable's speed)\n";
  Table cables({"CABLE", "FUNCTION", "TX Gb/s", "RX Gb/s", "SHARE", "CEILING", "TX TOTAL", "RX TOTAL"});
  for (size_t c = 0; c < v.cables.size(); ++c) {
    uint64_t tx = 0, rx = 0, txT = 0, rxT = 0;
    for (int i : v.cables[c]) {
      const PortRow& r = v.ports[static_cast<size_t>(i)];
      tx += r.txNow;
      rx += r.rxNow;
      txT += r.txTotal;
      rxT += r.rxTotal;
    }
    for (int i : v.cables[c]) {
      const PortRow& r = v.ports[static_cast<size_t>(i)];
      cables.add({std::to_string(c), functionName(r), gbps(r.txNow / dt), gbps(r.rxNow / dt),
                  percent(static_cast<double>(r.txNow + r.rxNow), static_cast<double>(tx + rx)), "", bytesText(r.txTotal),
                  bytesText(r.rxTotal)});
    }
    double ceil = v.cableSpeedMbps[c] * 1e6 / 8;  // bytes/s each way
    std::string ceiling = v.cableSpeedMbps[c] > 0
                              ? percent(std::max(tx, rx) / dt, ceil) + " of " + speedText(v.cableSpeedMbps[c])
                              : "unknown";
    cables.add({std::to_string(c), "cable", gbps(tx / dt), gbps(rx / dt), "", ceiling, bytesText(txT), bytesText(rxT)});
  }
  out += v.cables.empty() ? "  none: no RDMA port here and no counters\n" : cables.text();

  out += "\nPeers (KIND direct: over our cables; relayed: through the relay VIA; forwarded: this node's relay\n"
         "moves FROM's bytes on to PEER)\n";
  if (total.flows.empty()) {
    out += "  none yet\n";
  } else {
    Table peers({"PEER", "KIND", "VIA/FROM", "TX Gb/s", "RX Gb/s", "TX TOTAL", "RX TOTAL", "OPEN", "ERRORS"});
    uint64_t fwdNow = 0, fwdTotal = 0, fwdOpen = 0;
    for (const st::FlowCount& f : total.flows) {
      st::FlowCount d;
      for (const st::FlowCount& n : now.flows) {
        if (n.sameKey(f)) d = n;
      }
      std::string via = f.kind == st::FlowKind::Relayed     ? "via " + addr(f.viaAddr)
                        : f.kind == st::FlowKind::Forwarded ? "from " + addr(f.originAddr)
                                                            : "-";
      uint64_t open = f.opened > f.closed ? f.opened - f.closed : 0;
      peers.add({addr(f.peerAddr), st::flowKindName(f.kind), via, gbps(d.txBytes / dt), gbps(d.rxBytes / dt),
                 bytesText(f.txBytes), bytesText(f.rxBytes), std::to_string(open), std::to_string(f.errors)});
      if (f.kind == st::FlowKind::Forwarded) {
        fwdNow += d.txBytes;
        fwdTotal += f.txBytes;
        fwdOpen += open;
      }
    }
    out += peers.text();
    if (fwdTotal > 0 || fwdOpen > 0) {
      out += mesh::strf("  relay on this node: %llu connection(s) open, forwarding %s Gb/s now, %s forwarded in all\n",
                        static_cast<unsigned long long>(fwdOpen), gbps(fwdNow / dt).c_str(), bytesText(fwdTotal).c_str());
    }
  }

  std::string events;
  for (int e = 0; e < st::kEventCount; ++e) {
    events += mesh::strf("%s%s %llu", e == 0 ? "" : ", ", st::eventName(e), static_cast<unsigned long long>(total.events[e]));
  }
  out += "\nEvents since each process loaded the plugin: " + events + "\n";

  out += "\nNIC counters (sysfs, all traffic on the port, NCCL's or not; error columns: new in this frame)\n";
  if (after.nics.empty()) {
    out += "  none: no " + (opt.doctorOpts.root.empty() ? std::string() : opt.doctorOpts.root) +
           "/sys/class/infiniband here\n";
  } else {
    std::vector<std::string> header{"PORT", "TX Gb/s", "RX Gb/s"};
    for (const std::string& h : st::watchedHwCounters()) header.push_back(h);
    Table nic(header);
    for (const st::NicPortCounters& n : after.nics) {
      const st::NicPortCounters* b = nullptr;
      for (const st::NicPortCounters& o : before.nics) {
        if (o.device == n.device && o.port == n.port) b = &o;
      }
      std::vector<std::string> row{n.device + ":" + std::to_string(n.port)};
      if (n.haveData && b != nullptr && b->haveData) {
        row.push_back(gbps((n.txBytes >= b->txBytes ? n.txBytes - b->txBytes : 0) / dt));
        row.push_back(gbps((n.rxBytes >= b->rxBytes ? n.rxBytes - b->rxBytes : 0) / dt));
      } else {
        row.push_back("-");
        row.push_back("-");
      }
      for (const std::string& h : st::watchedHwCounters()) {
        bool has = false;
        for (const auto& kv : n.hw) has = has || kv.first == h;
        if (!has) {
          row.push_back("-");
          continue;
        }
        uint64_t now = st::hwValue(n, h), before = b != nullptr ? st::hwValue(*b, h) : now;
        row.push_back(std::to_string(now >= before ? now - before : 0));
      }
      nic.add(row);
    }
    out += nic.text();
  }
  for (const std::string& n : reader.notes) out += "note: " + n + "\n";
  for (const std::string& w : reader.warnings) out += "WARN: " + w + "\n";
  return out;
}

// One JSON object: the frame's rates and every total.
std::string jsonFrame(const View& v, const Sample& before, const Sample& after, const st::Totals& now,
                      const st::Totals& total, double dt, const Reader& reader) {
  char host[256] = "";
  gethostname(host, sizeof(host) - 1);
  std::string out = "{\n  \"host\": " + jsonString(host) + ",\n  \"interval_s\": " + mesh::strf("%.3f", dt) +
                    ",\n  \"processes\": [";
  for (size_t i = 0; i < after.procs.size(); ++i) {
    const st::ProcessCounts& p = after.procs[i];
    out += std::string(i ? ", " : "") + "{\"pid\": " + std::to_string(p.pid) + ", \"process\": " + jsonString(p.process) +
           ", \"file\": " + jsonString(p.file) + "}";
  }
  out += "],\n  \"cables\": [";
  for (size_t c = 0; c < v.cables.size(); ++c) {
    out += std::string(c ? "," : "") + "\n    {\"cable\": " + std::to_string(c) +
           ", \"speed_mbps\": " + std::to_string(v.cableSpeedMbps[c]) + ", \"functions\": [";
    bool first = true;
    for (int i : v.cables[c]) {
      const PortRow& r = v.ports[static_cast<size_t>(i)];
      out += std::string(first ? "" : ", ") + "{\"device\": " + jsonString(r.device) + ", \"port\": " +
             std::to_string(r.port) + ", \"netdev\": " + jsonString(r.netdev) +
             mesh::strf(", \"tx_bytes_per_s\": %.0f, \"rx_bytes_per_s\": %.0f", r.txNow / dt, r.rxNow / dt) +
             ", \"tx_bytes\": " + std::to_string(r.txTotal) + ", \"rx_bytes\": " + std::to_string(r.rxTotal) + "}";
      first = false;
    }
    out += "]}";
  }
  out += "\n  ],\n  \"links\": [";
  for (size_t i = 0; i < total.links.size(); ++i) {
    const st::LinkCount& l = total.links[i];
    st::LinkCount d;
    for (const st::LinkCount& n : now.links) {
      if (n.sameKey(l)) d = n;
    }
    out += std::string(i ? "," : "") + "\n    {\"device\": " + jsonString(l.device) + ", \"port\": " +
           std::to_string(l.port) + ", \"local\": " + jsonString(addr(l.localAddr)) + ", \"peer\": " +
           jsonString(addr(l.peerAddr)) + mesh::strf(", \"tx_bytes_per_s\": %.0f, \"rx_bytes_per_s\": %.0f", d.txBytes / dt, d.rxBytes / dt) +
           ", \"tx_bytes\": " + std::to_string(l.txBytes) + ", \"rx_bytes\": " + std::to_string(l.rxBytes) +
           ", \"work_requests\": " + std::to_string(l.txOps) + ", \"errors\": " + std::to_string(l.errors) + "}";
  }
  out += "\n  ],\n  \"flows\": [";
  for (size_t i = 0; i < total.flows.size(); ++i) {
    const st::FlowCount& f = total.flows[i];
    st::FlowCount d;
    for (const st::FlowCount& n : now.flows) {
      if (n.sameKey(f)) d = n;
    }
    out += std::string(i ? "," : "") + "\n    {\"kind\": " + jsonString(st::flowKindName(f.kind)) + ", \"peer\": " +
           jsonString(addr(f.peerAddr)) + ", \"via\": " + jsonString(f.viaAddr ? addr(f.viaAddr) : "") +
           ", \"from\": " + jsonString(f.originAddr ? addr(f.originAddr) : "") +
           mesh::strf(", \"tx_bytes_per_s\": %.0f, \"rx_bytes_per_s\": %.0f", d.txBytes / dt, d.rxBytes / dt) +
           ", \"tx_bytes\": " + std::to_string(f.txBytes) + ", \"rx_bytes\": " + std::to_string(f.rxBytes) +
           ", \"opened\": " + std::to_string(f.opened) + ", \"closed\": " + std::to_string(f.closed) +
           ", \"errors\": " + std::to_string(f.errors) + "}";
  }
  out += "\n  ],\n  \"events\": {";
  for (int e = 0; e < st::kEventCount; ++e) {
    out += std::string(e ? ", " : "") + jsonString(st::eventName(e)) + ": " + std::to_string(total.events[e]);
  }
  out += "},\n  \"nic\": [";
  for (size_t i = 0; i < after.nics.size(); ++i) {
    const st::NicPortCounters& n = after.nics[i];
    const st::NicPortCounters* b = nullptr;
    for (const st::NicPortCounters& o : before.nics) {
      if (o.device == n.device && o.port == n.port) b = &o;
    }
    out += std::string(i ? "," : "") + "\n    {\"device\": " + jsonString(n.device) + ", \"port\": " +
           std::to_string(n.port);
    if (n.haveData) {
      out += ", \"tx_bytes\": " + std::to_string(n.txBytes) + ", \"rx_bytes\": " + std::to_string(n.rxBytes);
      if (b != nullptr && b->haveData) {
        out += mesh::strf(", \"tx_bytes_per_s\": %.0f, \"rx_bytes_per_s\": %.0f",
                          (n.txBytes >= b->txBytes ? n.txBytes - b->txBytes : 0) / dt,
                          (n.rxBytes >= b->rxBytes ? n.rxBytes - b->rxBytes : 0) / dt);
      }
    }
    out += ", \"hw_counters\": {";
    for (size_t k = 0; k < n.hw.size(); ++k) {
      out += std::string(k ? ", " : "") + jsonString(n.hw[k].first) + ": " + std::to_string(n.hw[k].second);
    }
    out += "}}";
  }
  out += "\n  ],\n  \"warnings\": [";
  for (size_t i = 0; i < reader.warnings.size(); ++i) out += std::string(i ? ", " : "") + jsonString(reader.warnings[i]);
  out += "]\n}\n";
  return out;
}

std::vector<st::LinkLabels> linkLabels(View* v, const st::Totals& total) {
  std::vector<st::LinkLabels> labels;
  for (const st::LinkCount& l : total.links) {
    const PortRow& r = v->ports[static_cast<size_t>(portRow(v, l.device, l.port))];
    labels.push_back(st::LinkLabels{std::to_string(r.cable), r.netdev});
  }
  return labels;
}

// Sleeps `seconds` unless a signal asks to stop; false when stopped.
bool pause(double seconds) {
  using Clock = std::chrono::steady_clock;
  Clock::time_point until = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  while (!gStop) {
    Clock::time_point now = Clock::now();
    if (now >= until) return true;
    Clock::duration left = until - now;
    Clock::duration step = std::chrono::milliseconds(100);
    std::this_thread::sleep_for(left < step ? left : step);
  }
  return false;
}

}  // namespace

int runWatch(const Options& opt) {
  // The tool's own plugin init (for the node's ports and cables) must not publish counters.
  setenv("NCCL_MESH_STATS", "0", 1);
  mesh::Plugin& plugin = mesh::Plugin::instance();
  std::string statsDir = opt.statsDir;
  if (plugin.init(nullptr) != ncclSuccess) {
    fprintf(stderr, "nccl-mesh-info: the plugin failed to initialize; counters are shown per device:port\n");
  }
  if (statsDir.empty()) statsDir = plugin.config().statsDir;
  View view = buildView(plugin.discovery());
  Reader reader;
  reader.dirs = st::readerDirs(statsDir);
  reader.root = opt.doctorOpts.root;
  struct sigaction sa {};
  sa.sa_handler = onSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  bool tty = isatty(STDOUT_FILENO) == 1;
  bool show = opt.watch || opt.json;
  Sample before = reader.take();
  int frames = 0;
  int status = kExitOk;
  while (!gStop && pause(opt.interval)) {
    Sample after = reader.take();
    double dt = std::chrono::duration<double>(after.at - before.at).count();
    if (dt <= 0) dt = opt.interval;
    st::Totals now = st::deltas(before.procs, after.procs);
    st::Totals total = st::merge(after.procs);
    fill(&view, now, total);
    if (!opt.prometheus.empty()) {
      st::foldDeparted(before.procs, after.procs, &reader.departed);
      std::vector<st::ProcessCounts> all = after.procs;
      all.insert(all.end(), reader.departed.begin(), reader.departed.end());
      st::Totals kept = st::merge(all);
      kept.processes = static_cast<int>(after.procs.size());
      std::string why;
      std::string text = st::prometheusText(kept, linkLabels(&view, kept), after.nics);
      if (!st::writeFileAtomic(opt.prometheus, text, &why)) {
        fprintf(stderr, "nccl-mesh-info: --prometheus: %s\n", why.c_str());
        status = kExitNoPort;
        break;
      }
    }
    if (opt.json) {
      fputs(jsonFrame(view, before, after, now, total, dt, reader).c_str(), stdout);
      fflush(stdout);
      break;  // one snapshot
    }
    if (show) {
      std::string frame = textFrame(opt, view, before, after, now, total, dt, reader);
      if (tty) fputs("\033[H\033[2J", stdout);  // in place on a terminal, plain lines otherwise
      fputs(frame.c_str(), stdout);
      if (!tty) fputs("\n", stdout);
      fflush(stdout);
      reader.warnings.clear();
      reader.notes.clear();
    }
    before = std::move(after);
    if (opt.count > 0 && ++frames >= opt.count) break;
  }
  plugin.shutdown();
  return status;
}

}  // namespace info
