// SPDX-License-Identifier: Apache-2.0
// The Prometheus text exposition (prometheus.h) and the atomic file write the textfile
// collector needs: node_exporter reads the file whenever it is scraped, so it must never
// see it half written.
#include "mesh/stats/prometheus.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "mesh/platform/ipv4.h"

namespace mesh {
namespace stats {

namespace {

using Labels = std::vector<std::pair<const char*, std::string>>;

// Text in a label value ("..."): \ " and newline escaped. In a # HELP line: \ and newline.
std::string escaped(const std::string& s, bool labelValue) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && labelValue) {
      out += "\\\"";
    } else {
      out += c;
    }
  }
  return out;
}

std::string addr(uint32_t a) { return a == 0 ? std::string() : formatIpv4(a); }

// Appends one family at a time: family() names it, and its # HELP and # TYPE lines are
// written before its first sample (a family without samples leaves no trace) or at once
// when `always`.
class Exposition {
 public:
  explicit Exposition(std::string* out) : out_(out) {}

  void family(const char* name, const char* type, const char* help, bool always = false) {
    name_ = name;
    type_ = type;
    help_ = help;
    headerWritten_ = false;
    if (always) header();
  }

  void sample(const Labels& labels, uint64_t value) {
    if (!headerWritten_) header();
    *out_ += name_;
    if (!labels.empty()) {
      *out_ += '{';
      for (size_t i = 0; i < labels.size(); ++i) {
        if (i > 0) *out_ += ',';
        *out_ += labels[i].first;
        *out_ += "=\"";
        *out_ += escaped(labels[i].second, true);
        *out_ += '"';
      }
      *out_ += '}';
    }
    *out_ += ' ';
    *out_ += std::to_string(value);
    *out_ += '\n';
  }

 private:
  void header() {
    *out_ += "# HELP " + name_ + " " + escaped(help_, false) + "\n";
    *out_ += "# TYPE " + name_ + " " + type_ + "\n";
    headerWritten_ = true;
  }

  std::string* out_;
  std::string name_, type_, help_;
  bool headerWritten_ = false;
};

Labels linkKey(const LinkCount& l) {
  return {{"device", l.device}, {"port", std::to_string(l.port)},
          {"local", addr(l.localAddr)}, {"peer", addr(l.peerAddr)}};
}

Labels flowKey(const FlowCount& f) {
  return {{"kind", flowKindName(f.kind)}, {"peer", addr(f.peerAddr)},
          {"via", addr(f.viaAddr)}, {"origin", addr(f.originAddr)}};
}

Labels with(Labels l, const char* name, const std::string& value) {
  l.emplace_back(name, value);
  return l;
}

void linkFamilies(Exposition* x, const Totals& t, const std::vector<LinkLabels>& extra) {
  x->family("nccl_mesh_link_bytes_total", "counter",
            "Bytes on a cable end (local port and address to a peer address) by direction: tx is the "
            "RDMA payload posted, control writes included; rx is the payload received.");
  for (size_t i = 0; i < t.links.size(); ++i) {
    const LinkCount& l = t.links[i];
    Labels labels = linkKey(l);
    if (i < extra.size() && !extra[i].cable.empty()) labels.emplace_back("cable", extra[i].cable);
    if (i < extra.size() && !extra[i].function.empty()) labels.emplace_back("function", extra[i].function);
    x->sample(with(labels, "direction", "tx"), l.txBytes);
    x->sample(with(labels, "direction", "rx"), l.rxBytes);
  }
  x->family("nccl_mesh_link_work_requests_total", "counter", "RDMA work requests posted on a cable end.");
  for (const LinkCount& l : t.links) x->sample(linkKey(l), l.txOps);
  x->family("nccl_mesh_link_errors_total", "counter", "Comms that failed on a cable end.");
  for (const LinkCount& l : t.links) x->sample(linkKey(l), l.errors);
}

void flowFamilies(Exposition* x, const Totals& t) {
  x->family("nccl_mesh_flow_bytes_total", "counter",
            "Payload bytes to and from a peer node by kind: direct, relayed (through the relay node via), "
            "forwarded (this node's relay moving origin's bytes on to peer).");
  for (const FlowCount& f : t.flows) {
    x->sample(with(flowKey(f), "direction", "tx"), f.txBytes);
    x->sample(with(flowKey(f), "direction", "rx"), f.rxBytes);
  }
  x->family("nccl_mesh_flow_connections", "gauge", "Open comms of a flow (opened minus closed).");
  for (const FlowCount& f : t.flows) {
    // opened and closed are two loads: a comm opened and closed between them can make the
    // difference negative for one read.
    x->sample(flowKey(f), f.opened > f.closed ? f.opened - f.closed : 0);
  }
  x->family("nccl_mesh_flow_errors_total", "counter", "Comms of a flow that failed.");
  for (const FlowCount& f : t.flows) x->sample(flowKey(f), f.errors);
}

void nicFamilies(Exposition* x, const std::vector<NicPortCounters>& nics) {
  auto port = [](const NicPortCounters& p) -> Labels {
    return {{"device", p.device}, {"port", std::to_string(p.port)}};
  };
  x->family("nccl_mesh_nic_bytes_total", "counter",
            "Bytes the RDMA port counted, all traffic (sysfs counters/port_xmit_data, port_rcv_data times 4).");
  for (const NicPortCounters& p : nics) {
    if (!p.haveData) continue;
    x->sample(with(port(p), "direction", "tx"), p.txBytes);
    x->sample(with(port(p), "direction", "rx"), p.rxBytes);
  }
  x->family("nccl_mesh_nic_packets_total", "counter",
            "Packets the RDMA port counted, all traffic (sysfs counters/port_xmit_packets, port_rcv_packets).");
  for (const NicPortCounters& p : nics) {
    if (!p.haveData) continue;
    x->sample(with(port(p), "direction", "tx"), p.txPackets);
    x->sample(with(port(p), "direction", "rx"), p.rxPackets);
  }
  x->family("nccl_mesh_nic_hw_counter_total", "counter",
            "The RDMA driver's port counters (sysfs hw_counters): retransmissions, sequence errors, congestion.");
  for (const NicPortCounters& p : nics) {
    for (const auto& hw : p.hw) x->sample(with(port(p), "counter", hw.first), hw.second);
  }
}

// write() until done; false with errno set.
bool writeAll(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

std::string prometheusText(const Totals& totals, const std::vector<LinkLabels>& linkLabels,
                           const std::vector<NicPortCounters>& nics) {
  std::string out;
  Exposition x(&out);
  x.family("nccl_mesh_processes", "gauge", "Processes on this node publishing nccl-mesh live counters.", true);
  x.sample({}, static_cast<uint64_t>(totals.processes > 0 ? totals.processes : 0));
  linkFamilies(&x, totals, linkLabels);
  flowFamilies(&x, totals);
  x.family("nccl_mesh_events_total", "counter",
           "Plugin events summed over the processes: comms connected, accepted, closed, failed, ...");
  for (int e = 0; e < kEventCount; ++e) x.sample({{"event", eventName(e)}}, totals.events[e]);
  nicFamilies(&x, nics);
  return out;
}

bool writeFileAtomic(const std::string& path, const std::string& text, std::string* why) {
  // A hidden name in the same directory (rename() does not cross file systems), which the
  // textfile collector's *.prom glob does not match.
  size_t slash = path.rfind('/');
  std::string dir = slash == std::string::npos ? std::string() : path.substr(0, slash + 1);
  std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  std::string tmp = dir + "." + base + ".XXXXXX";
  int fd = mkostemp(&tmp[0], O_CLOEXEC);
  if (fd < 0) {
    *why = "cannot create a temporary file beside " + path + ": " + std::strerror(errno);
    return false;
  }
  const char* step = nullptr;
  if (!writeAll(fd, text)) {
    step = "write";
  } else if (fsync(fd) != 0) {
    step = "fsync";
  } else if (fchmod(fd, 0644) != 0) {  // mkostemp makes it 0600; the collector may run as another user
    step = "fchmod";
  }
  int err = errno;
  if (::close(fd) != 0 && step == nullptr) {
    step = "close";
    err = errno;
  }
  if (step == nullptr && rename(tmp.c_str(), path.c_str()) != 0) {
    *why = "cannot rename " + tmp + " to " + path + ": " + std::strerror(errno);
    unlink(tmp.c_str());
    return false;
  }
  if (step != nullptr) {
    *why = std::string("cannot write ") + path + " (" + step + " of " + tmp + "): " + std::strerror(err);
    unlink(tmp.c_str());
    return false;
  }
  return true;
}

}  // namespace stats
}  // namespace mesh
