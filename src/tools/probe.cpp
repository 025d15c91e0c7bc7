// SPDX-License-Identifier: Apache-2.0
// nccl-mesh-info --probe / --serve: drives the plugin core (net.h) the way NCCL would, one
// port per device, to prove each cable end to end: routing picks the port, the handshake
// runs over the cable, the QPs reach RTS, and one RDMA write (the receiver's FIFO slot
// write travels the other way) lands a pattern the responder verifies.
#include "mesh/tools/probe.h"

#include <poll.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "mesh/platform/check.h"
#include "mesh/platform/ipv4.h"
#include "mesh/platform/text.h"
#include "mesh/platform/version.h"
#include "mesh/plugin/net.h"
#include "mesh/plugin/plugin.h"
#include "mesh/tools/perf_report.h"
#include "mesh/tools/probe_plan.h"
#include "mesh/tools/tool_net.h"

namespace mesh {

namespace {

using Clock = CtrlClock;

// --- the plugin's log: its last WARN explains a failure; -v shows everything ----------------
std::mutex gLogMutex;
std::string gLastWarn;
bool gVerbose = false;

void probeLogger(ncclDebugLogLevel level, unsigned long, const char*, int, const char* fmt, ...) {
  char buf[2048];
  MESH_VFORMAT(buf, fmt);
  std::lock_guard<std::mutex> lock(gLogMutex);
  if (level == NCCL_LOG_WARN) gLastWarn = buf;
  if (gVerbose && level <= NCCL_LOG_INFO) fprintf(stderr, "nccl-mesh-info: plugin %s\n", buf);
}

// The plugin's last WARN without its "NET/Mesh : " tag, and forgets it.
std::string takeLastWarn() {
  std::lock_guard<std::mutex> lock(gLogMutex);
  const char* tag = "NET/Mesh : ";
  std::string text = gLastWarn.compare(0, strlen(tag), tag) == 0 ? gLastWarn.substr(strlen(tag)) : gLastWarn;
  gLastWarn.clear();
  return text;
}

// "connect returned ncclSystemError: <the plugin's last WARN>".
std::string failureText(ncclResult_t r, const std::string& what) {
  std::string warn = takeLastWarn();
  return what + " returned " + resultName(r) + (warn.empty() ? "" : ": " + warn);
}

Clock::time_point after(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

// Initializes the plugin core with each port its own device, so a connect can only use the
// port it is asked to test.
bool initPortMode(double connectTimeoutS, bool verbose, std::string* why) {
  gVerbose = verbose;
  setenv("NCCL_MESH_DEVICES", "port", 1);
  if (connectTimeoutS > 0) {  // the user's own value wins
    setenv("NCCL_MESH_CONNECT_TIMEOUT_MS", std::to_string(static_cast<long>(connectTimeoutS * 1000)).c_str(), 0);
  }
  Plugin& plugin = Plugin::instance();
  ncclResult_t r = plugin.init(probeLogger);
  if (r != ncclSuccess) {
    *why = failureText(r, "the plugin's init");
    return false;
  }
  if (plugin.deviceCount() == 0) {
    std::string warn = takeLastWarn();
    *why = warn.empty() ? "this node has no usable RDMA port; run nccl-mesh-info -v to see why" : warn;
    return false;
  }
  return true;
}

// The node's ports as routing sees them, one per device (port mode), and their labels.
std::vector<LocalNic> portNics() {
  std::vector<LocalNic> nics;
  Plugin& plugin = Plugin::instance();
  for (int dev = 0; dev < plugin.deviceCount(); ++dev) {
    std::vector<LocalNic> one = plugin.transport(dev)->localNics();
    if (!one.empty()) nics.push_back(one.front());
  }
  return nics;
}

std::string hostName() {
  char buf[256] = {};
  return gethostname(buf, sizeof(buf) - 1) == 0 ? buf : "?";
}

// Owns what one probed cable opened on either side, released in reverse order.
struct CableComms {
  SendComm* send = nullptr;
  RecvComm* recv = nullptr;
  MrHandle* mr = nullptr;
  std::vector<unsigned char> buf = std::vector<unsigned char>(kProbeBytes);
  ~CableComms() {
    if (mr != nullptr) netDeregMr(mr);
    if (send != nullptr) netCloseSend(send);
    if (recv != nullptr) netCloseRecv(recv);
  }
};

// Polls test() until done, an error, or the deadline; `stop` is asked between polls.
template <typename Stop>
bool waitRequest(Request* req, Clock::time_point deadline, Stop stop, std::string* why) {
  for (;;) {
    int done = 0, count = 0;
    size_t sizes[kGroupMax] = {};
    ncclResult_t r = netTest(req, &done, sizes, &count);
    if (r != ncclSuccess) {
      *why = failureText(r, "test");
      return false;
    }
    if (done) return true;
    if (Clock::now() > deadline) {
      *why = "the transfer did not complete in time";
      return false;
    }
    if (stop()) {
      *why = "stopped by the other side";
      return false;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

// --- the prober ------------------------------------------------------------------------------

class Prober {
 public:
  Prober(const ProbeOptions& o, CtrlSocket* ctrl, std::string peerName)
      : o_(o), ctrl_(ctrl), peerName_(std::move(peerName)) {}
  // One cable; true when the responder verified the write. *detail says what happened.
  bool testCable(const ProbeCable& c, const ProbePeerPort& peerPort, std::string* detail);

 private:
  bool sendLocal(int dev, const ProbePeerPort& peerPort, CableComms* comms, std::string* why);
  bool responderResult(int peerDev, std::string* text);

  const ProbeOptions& o_;
  CtrlSocket* ctrl_;
  std::string peerName_;
};

bool Prober::sendLocal(int dev, const ProbePeerPort& peerPort, CableComms* comms, std::string* why) {
  Clock::time_point deadline = after(o_.timeoutS);
  uint8_t handle[kHandleSize];
  memcpy(handle, peerPort.handle, sizeof(handle));
  while (comms->send == nullptr) {  // non-blocking, as NCCL calls it
    ncclResult_t r = netConnect(dev, handle, ConnOptions(), &comms->send);
    if (r != ncclSuccess) {
      *why = failureText(r, "connect");
      return false;
    }
    if (comms->send != nullptr) break;
    if (Clock::now() > deadline) {
      *why = "connect: no connection within " + std::to_string(static_cast<int>(o_.timeoutS)) + " s";
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  fillPattern(comms->buf.data(), kProbeBytes, kProbeSeed);
  ncclResult_t r = netRegMr(comms->send, comms->buf.data(), kProbeBytes, kPtrHost, -1, 0, &comms->mr);
  if (r != ncclSuccess) {
    *why = failureText(r, "regMr");
    return false;
  }
  Request* req = nullptr;
  while (req == nullptr) {  // NULL until the responder's receive (its FIFO slot) has arrived
    r = netIsend(comms->send, comms->buf.data(), kProbeBytes, 0, comms->mr, &req);
    if (r != ncclSuccess) {
      *why = failureText(r, "isend");
      return false;
    }
    if (req == nullptr && Clock::now() > deadline) {
      *why = "isend: the responder's receive never arrived (its RDMA write to us did not land)";
      return false;
    }
  }
  return waitRequest(req, deadline, [] { return false; }, why);
}

bool Prober::responderResult(int peerDev, std::string* text) {
  std::string msg, error;
  if (!ctrl_->recv(&msg, after(o_.timeoutS + 5), &error)) {
    *text = "no answer from the responder: " + error;
    return false;
  }
  std::string prefix = "probe-result " + std::to_string(peerDev) + " ";
  if (msg.compare(0, prefix.size(), prefix) != 0) {
    *text = "unexpected answer from the responder: " + msg.substr(0, 120);
    return false;
  }
  std::istringstream in(msg.substr(prefix.size()));
  std::string status;
  in >> status;
  if (status == "ok") {
    size_t bytes = 0;
    long long wrong = -1;
    in >> bytes >> wrong;
    if (bytes == kProbeBytes && wrong == 0) {
      *text = std::to_string(kProbeBytes) + "-byte RDMA write verified by " + peerName_;
      return true;
    }
    *text = peerName_ + " received " + std::to_string(bytes) + " bytes, " + std::to_string(wrong) + " of them wrong";
    return false;
  }
  std::string rest;
  std::getline(in, rest);
  *text = peerName_ + ": " + (rest.empty() ? rest : rest.substr(1));
  return false;
}

bool Prober::testCable(const ProbeCable& c, const ProbePeerPort& peerPort, std::string* detail) {
  std::string error;
  Clock::time_point t0 = Clock::now();
  std::string request = "probe-test " + std::to_string(c.peer) + " " + std::to_string(static_cast<long>(o_.timeoutS * 1000));
  if (!ctrl_->send(request, after(5), &error)) {
    *detail = "the responder went away: " + error;
    return false;
  }
  CableComms comms;
  std::string why;
  bool sent = sendLocal(c.local, peerPort, &comms, &why);
  if (!sent) ctrl_->send("probe-cancel " + std::to_string(c.peer), after(5), &error);
  std::string theirs;
  bool verified = responderResult(c.peer, &theirs);
  double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  char took[32];
  snprintf(took, sizeof(took), " (%.2f s)", seconds);
  if (sent && verified) {
    *detail = "OK: QP connected, " + theirs + took;
    return true;
  }
  *detail = "FAILED: " + (sent ? theirs : why + (theirs.find("stopped by") != std::string::npos ? "" : "; " + theirs)) + took;
  return false;
}

// --- the responder ---------------------------------------------------------------------------

class Responder {
 public:
  Responder(CtrlSocket* ctrl, std::string client) : ctrl_(ctrl), client_(std::move(client)) {}
  ~Responder() {
    for (ListenComm* l : listens_) {
      if (l != nullptr) netCloseListen(l);
    }
  }
  bool serve(std::string* summary);

 private:
  std::string ports();
  std::string testCable(int dev, double timeoutS);
  // True when the prober sent something (a cancel) while we wait on RDMA.
  bool proberSpoke();

  CtrlSocket* ctrl_;
  std::string client_;
  std::vector<ListenComm*> listens_;
  std::string pending_;  // a message proberSpoke() read
};

std::string Responder::ports() {
  Plugin& plugin = Plugin::instance();
  std::vector<std::string> labels;
  std::vector<std::vector<uint8_t>> handles;
  for (int dev = 0; dev < plugin.deviceCount(); ++dev) {
    std::vector<uint8_t> handle(kHandleSize);
    ListenComm* l = nullptr;
    ncclResult_t r = netListen(dev, handle.data(), &l);
    listens_.push_back(l);
    if (r != ncclSuccess) {
      fprintf(stderr, "nccl-mesh-info: %s\n", failureText(r, "listen on device " + std::to_string(dev)).c_str());
      continue;
    }
    const NetDevice* d = nullptr;
    plugin.device(dev, &d);
    labels.push_back(plugin.discovery().ports[d->ports.front()].label());
    handles.push_back(handle);
  }
  return encodeProbePorts(hostName(), versionText(), labels, handles);
}

bool Responder::proberSpoke() {
  if (!pending_.empty()) return true;
  pollfd p{ctrl_->fd(), POLLIN, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  std::string error;
  if (!ctrl_->recv(&pending_, after(5), &error)) pending_ = "gone";
  return true;
}

std::string Responder::testCable(int dev, double timeoutS) {
  if (dev < 0 || dev >= static_cast<int>(listens_.size()) || listens_[dev] == nullptr) {
    return "fail no port " + std::to_string(dev) + " here";
  }
  Clock::time_point deadline = after(timeoutS + 2);
  CableComms comms;
  while (comms.recv == nullptr) {
    ncclResult_t r = netAccept(listens_[dev], &comms.recv);
    if (r != ncclSuccess) return "fail " + failureText(r, "accept");
    if (comms.recv != nullptr) break;
    if (proberSpoke()) return "fail stopped by the prober (its side failed first)";
    if (Clock::now() > deadline) return "fail accept: no connection arrived from the prober in time";
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ncclResult_t r = netRegMr(comms.recv, comms.buf.data(), kProbeBytes, kPtrHost, -1, 0, &comms.mr);
  if (r != ncclSuccess) return "fail " + failureText(r, "regMr");
  void* data = comms.buf.data();
  size_t size = kProbeBytes;
  int tag = 0;
  Request* req = nullptr;
  while (req == nullptr) {
    r = netIrecv(comms.recv, 1, &data, &size, &tag, &comms.mr, &req);
    if (r != ncclSuccess) return "fail " + failureText(r, "irecv");
    if (req == nullptr && Clock::now() > deadline) return "fail irecv: the receive could not be posted";
  }
  std::string why;
  if (!waitRequest(req, deadline, [this] { return proberSpoke(); }, &why)) return "fail receive: " + why;
  return "ok " + std::to_string(kProbeBytes) + " " +
         std::to_string(countPatternErrors(comms.buf.data(), kProbeBytes, kProbeSeed));
}

bool Responder::serve(std::string* summary) {
  std::string msg, error;
  if (!ctrl_->recv(&msg, after(10), &error) || msg.compare(0, 14, "probe-hello 1 ") != 0) {
    *summary = "not a prober (" + (error.empty() ? msg.substr(0, 40) : error) + ")";
    return false;
  }
  if (!ctrl_->send(ports(), after(10), &error)) {
    *summary = "the prober went away: " + error;
    return false;
  }
  int tested = 0, ok = 0;
  for (;;) {
    if (pending_.empty() && !ctrl_->recv(&msg, after(600), &error)) {
      *summary = "the prober went away: " + error;
      return false;
    }
    if (!pending_.empty()) msg = pending_, pending_.clear();
    if (msg == "probe-bye") break;
    if (msg == "gone") {
      *summary = "the prober went away";
      return false;
    }
    int dev = -1;
    long timeoutMs = 0;
    if (sscanf(msg.c_str(), "probe-test %d %ld", &dev, &timeoutMs) == 2) {
      std::string result = testCable(dev, timeoutMs / 1000.0);
      if (!pending_.empty() && pending_.compare(0, 13, "probe-cancel ") == 0) pending_.clear();
      ++tested;
      ok += result.compare(0, 3, "ok ") == 0;
      if (!ctrl_->send("probe-result " + std::to_string(dev) + " " + result, after(10), &error)) {
        *summary = "the prober went away: " + error;
        return false;
      }
    } else if (msg.compare(0, 13, "probe-cancel ") != 0) {  // a late cancel needs no answer
      *summary = "unexpected message '" + msg.substr(0, 40) + "'";
      return false;
    }
  }
  *summary = std::to_string(tested) + " cable(s) tested, " + std::to_string(ok) + " verified";
  return true;
}

}  // namespace

int runProbe(const ProbeOptions& o) {
  std::string host, error, why;
  int port = 0;
  if (!parseHostPort(o.peer, kProbeDefaultPort, &host, &port, &error)) {
    fprintf(stderr, "nccl-mesh-info: --probe %s\n", error.c_str());
    return 64;
  }
  std::string peerName = host;
  if (!initPortMode(o.timeoutS, o.verbose, &why)) {
    printf("probe: this node (%s, %s) -> %s\nverdict: NO PORT: %s\n", hostName().c_str(), versionText().c_str(),
           peerName.c_str(), why.c_str());
    return kProbeNoPort;
  }
  std::vector<LocalNic> local = portNics();
  CtrlSocket ctrl;
  std::string msg;
  ProbePorts peer;
  if (!ctrlConnect(host, port, after(o.timeoutS), &ctrl, &error) ||
      !ctrl.send("probe-hello 1 " + versionText(), after(o.timeoutS), &error) ||
      !ctrl.recv(&msg, after(o.timeoutS + 5), &error) || !decodeProbePorts(msg, &peer, &error)) {
    printf("probe: this node (%s, %s) -> %s\n", hostName().c_str(), versionText().c_str(), peerName.c_str());
    printf("verdict: NO RESPONDER: cannot probe %s over the management network (port %d): %s. Start "
           "`nccl-mesh-info --serve` there (and open TCP port %d)\n",
           peerName.c_str(), port, error.c_str(), port);
    return kProbeNoPeer;
  }
  printf("probe: this node (%s, %s) -> %s (%s, %s)\n", hostName().c_str(), versionText().c_str(), peerName.c_str(),
         peer.host.c_str(), peer.version.c_str());
  printf("  this node's ports: %s\n", describeLocalPorts(local).c_str());
  printf("  %s's ports: %s\n", peerName.c_str(), describePeerPorts(peer.ports).c_str());
  ProbePlan plan = planProbe(local, peer.ports);
  Prober prober(o, &ctrl, peerName);
  std::string failed;
  for (size_t i = 0; i < plan.cables.size(); ++i) {
    const ProbeCable& c = plan.cables[i];
    std::string detail;
    bool ok = prober.testCable(c, peer.ports[c.peer], &detail);
    printf("  cable %zu: %s: %s\n", i + 1, describeCable(c, local, peer.ports, peerName).c_str(), detail.c_str());
    fflush(stdout);
    if (!ok) {
      const Route& r = c.route;
      failed += (failed.empty() ? "" : "; ") + local[c.local].label + " (subnet " +
                formatPrefix(Ipv4Prefix{r.local.addr & prefixMask(r.prefixLen), r.prefixLen}) + ")";
    }
  }
  for (int l : plan.localAlone) printf("  not cabled to %s: %s here\n", peerName.c_str(), describeLocalPorts({local[l]}).c_str());
  for (int p : plan.peerAlone) printf("  not cabled to this node: %s there\n", describePeerPorts({peer.ports[p]}).c_str());
  ctrl.send("probe-bye", after(5), &error);
  if (plan.cables.empty()) {
    printf("verdict: NO CABLE: %s\n", noCableVerdict(local, peer.ports, peerName).c_str());
    return kProbeNoCable;
  }
  if (!failed.empty()) {
    printf("verdict: FAILED: RDMA does not work over %s to %s (details above)\n", failed.c_str(), peerName.c_str());
    return kProbeCableFail;
  }
  printf("verdict: OK: %zu cable(s) to %s carry RDMA\n", plan.cables.size(), peerName.c_str());
  return kProbeOk;
}

int runServe(const ServeOptions& o) {
  std::string why, error;
  if (!initPortMode(0, o.verbose, &why)) {
    fprintf(stderr, "nccl-mesh-info: --serve: %s\n", why.c_str());
    return kProbeNoPort;
  }
  CtrlListener listener;
  if (!listener.listen(o.bind, o.port, &error)) {
    fprintf(stderr, "nccl-mesh-info: --serve: %s\n", error.c_str());
    return kProbeNoPeer;
  }
  printf("serve: %s answering probes on %s port %d; ports: %s\n", versionText().c_str(),
         o.bind.empty() ? "every interface" : o.bind.c_str(), listener.port(), describeLocalPorts(portNics()).c_str());
  fflush(stdout);
  Clock::time_point forever = Clock::now() + std::chrono::hours(24 * 365);
  do {
    CtrlSocket ctrl;
    std::string client;
    Clock::time_point deadline = o.once && o.timeoutS > 0 ? after(o.timeoutS) : forever;
    if (!listener.accept(&ctrl, &client, deadline, &error)) {
      fprintf(stderr, "nccl-mesh-info: --serve: %s\n", error.c_str());
      return kProbeNoPeer;
    }
    std::string summary;
    bool ok;
    {
      Responder responder(&ctrl, client);
      ok = responder.serve(&summary);
    }
    printf("serve: probe from %s: %s\n", client.c_str(), summary.c_str());
    fflush(stdout);
    if (o.once) return ok ? kProbeOk : kProbeNoPeer;
  } while (true);
}

}  // namespace mesh
