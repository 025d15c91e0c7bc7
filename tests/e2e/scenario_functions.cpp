// SPDX-License-Identifier: Apache-2.0
// Both functions of a cable (issue "Spark-ready"): every cable end is two RDMA devices on one
// wire (scripts/fabric-net --functions 2, both in the cable's subnet or each in its own). Every
// rank sends to each neighbour and receives from it, messages below and above the split size,
// data checked; then, per cable, the fabric's per-device byte counters must show every function
// of this end carrying an equal share (within --tolerance) in both directions.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "comm_setup.h"
#include "probes.h"
#include "scenarios.h"
#include "transfer.h"

extern char** environ;

namespace e2e {
namespace {

struct DeviceBytes {
  std::string dev;
  long sent = 0, rcvd = 0;
};

std::vector<DeviceBytes> readBytes(const std::vector<std::string>& devs) {
  std::vector<DeviceBytes> out;
  for (const std::string& d : devs) {
    DeviceBytes b;
    b.dev = d;
    b.sent = readPortCounter(d, 1, "sent_bytes");
    b.rcvd = readPortCounter(d, 1, "rcvd_bytes");
    if (b.sent < 0 || b.rcvd < 0) fail("cannot read %s's sent_bytes/rcvd_bytes (needs the fabric's stats)", d.c_str());
    out.push_back(b);
  }
  return out;
}

// What is wrong with one direction's shares ("" if each is within tolerance of 1/k).
std::string shareProblems(const char* what, const std::vector<long>& bytes, double tolerance, std::string* table) {
  long total = 0;
  for (long b : bytes) total += b;
  std::string problems;
  double fair = 1.0 / static_cast<double>(bytes.size());
  for (size_t i = 0; i < bytes.size(); ++i) {
    double share = total > 0 ? static_cast<double>(bytes[i]) / static_cast<double>(total) : 0;
    *table += format(" %s[%zu]=%.3f", what, i, share);
    if (std::fabs(share - fair) > tolerance * fair) {
      problems += format(" %s share of function %zu is %.3f, not %.3f +- %.0f%%;", what, i, share, fair,
                         tolerance * 100);
    }
  }
  return problems;
}

std::vector<Op> exchangeOps(Context& ctx, const CommTable& t, std::vector<int> peers, HostBuffer& out,
                            HostBuffer& in, const std::vector<size_t>& sizes, int perSize,
                            std::vector<void*>* mhs) {
  std::vector<Op> ops;
  if (peers.empty()) return ops;  // a relay (--relayed) only forwards
  size_t stride = out.size() / peers.size();
  for (size_t p = 0; p < peers.size(); ++p) {
    int peer = peers[p];
    void* sc = t.at(peer).send[0];
    void* rc = t.at(peer).recv[0];
    uint8_t* o = out.data() + p * stride;
    uint8_t* i = in.data() + p * stride;
    mhs->push_back(regHost(ctx, sc, out, format("functions out -> %d", peer)));
    mhs->push_back(regHost(ctx, rc, in, format("functions in <- %d", peer)));
    void* mhOut = (*mhs)[mhs->size() - 2];
    void* mhIn = mhs->back();
    size_t off = 0;
    int tag = 0;
    for (size_t size : sizes) {
      for (int k = 0; k < perSize; ++k, ++tag, off += size) {
        ops.push_back(sendOp(sc, o + off, static_cast<int>(size), tag, mhOut,
                             format("functions isend %d->%d #%d", ctx.rank, peer, tag)));
        ops.push_back(recvOp(rc, i + off, static_cast<int>(size), tag, mhIn,
                             format("functions irecv %d<-%d #%d", ctx.rank, peer, tag)));
      }
    }
  }
  return ops;
}

// --- --watch: nccl-mesh-info --watch beside the exchange (issue 34) ----------------------------

std::string statsDir() {
  const char* d = getenv("NCCL_MESH_STATS_DIR");
  if (d == nullptr) fail("functions --watch: NCCL_MESH_STATS_DIR is not set");
  return d;
}

// Whether the stats directory holds a counters file of process `pid`.
bool hasCountersFile(pid_t pid) {
  std::string dir = statsDir(), mark = format(".%d.", static_cast<int>(pid));
  bool found = false;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      std::string n = e->d_name;
      if (n[0] != '.' && n.find(mark) != std::string::npos && n.size() > 6 && n.substr(n.size() - 6) == ".stats") found = true;
    }
    closedir(d);
  }
  return found;
}

// A process that loaded the plugin (nccl-mesh-info --serve publishes counters like any
// other), killed with SIGKILL once its counters file is there: its file stays behind, stale.
// Returns its pid.
pid_t leaveStaleFile(const std::string& tool, const Deadline& deadline) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  std::vector<std::string> args{tool, "--serve", "--port", "0", "--bind", "127.0.0.1"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(&a[0]);
  argv.push_back(nullptr);
  pid_t pid = -1;
  int rc = posix_spawn(&pid, tool.c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) fail("functions --watch: cannot run %s: %s", tool.c_str(), strerror(rc));
  std::string dir = statsDir();
  bool found = false;
  while (!found) {
    found = hasCountersFile(pid);
    int status = 0;
    if (!found && waitpid(pid, &status, WNOHANG) == pid) fail("functions --watch: %s --serve exited before it published counters", tool.c_str());
    if (!found && deadline.expired()) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      fail("functions --watch: no counters file of pid %d in %s (%s)", static_cast<int>(pid), dir.c_str(), deadline.what().c_str());
    }
    if (!found) std::this_thread::sleep_for(std::chrono::milliseconds(10));  // polling for the file
  }
  kill(pid, SIGKILL);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return pid;
}

// The tool's plain frames: for every frame, the function rows of the cable made of `devs`:
// the SHARE column (percent; -1 for "-") and the frame's Gb/s both ways.
struct WatchRow {
  std::string function;
  double gbps = 0;
  int share = -1;
};
std::vector<std::vector<WatchRow>> watchFrames(const std::string& out, const std::vector<std::string>& devs) {
  std::vector<std::vector<WatchRow>> frames;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("nccl-mesh-info --watch:", 0) == 0) {
      frames.emplace_back();
      continue;
    }
    if (frames.empty()) continue;
    std::istringstream ls(line);
    std::vector<std::string> tok;
    std::string t;
    while (ls >> t) tok.push_back(t);
    if (tok.size() < 5 || tok[1] == "cable" || tok[0].find_first_not_of("0123456789") != std::string::npos) continue;
    std::string dev = tok[1].substr(0, tok[1].find(':'));
    if (std::find(devs.begin(), devs.end(), dev) == devs.end()) continue;
    WatchRow r;
    r.function = tok[1];
    r.gbps = atof(tok[2].c_str()) + atof(tok[3].c_str());
    r.share = tok[4] == "-" ? -1 : atoi(tok[4].c_str());
    frames.back().push_back(r);
  }
  return frames;
}

// What is wrong with the watched shares of one cable. The frames that carried at least a
// quarter of the busiest frame's traffic are averaged (each function's SHARE weighted by the
// frame's traffic): each function must be within tolerance of 1/k. One frame alone is 1 s of
// a stream that the sender balances by how busy each QP is, so under a loaded CPU a single
// frame may lean to one function (43/57 seen with two CPU burners) while the whole does not.
std::string watchProblems(const std::string& out, int peer, const std::vector<std::string>& devs, double tolerance,
                          std::string* table) {
  std::vector<std::vector<WatchRow>> frames = watchFrames(out, devs);
  double busiest = 0;
  for (const auto& f : frames) {
    double sum = 0;
    for (const WatchRow& r : f) sum += r.gbps;
    busiest = std::max(busiest, sum);
  }
  std::string problems;
  std::map<std::string, double> weighted;
  double weights = 0;
  int checked = 0;
  *table += format(" watch%d:", peer);
  for (const auto& f : frames) {
    double sum = 0;
    for (const WatchRow& r : f) sum += r.gbps;
    if (busiest <= 0 || sum < busiest / 4) continue;
    ++checked;
    if (f.size() != devs.size()) {
      problems += format(" --watch frame shows %zu function(s) of the cable to rank %d, not %zu;", f.size(), peer, devs.size());
      continue;
    }
    *table += " [";
    for (const WatchRow& r : f) {
      *table += format(" %s=%d%%", r.function.c_str(), r.share);
      if (r.share < 0) problems += format(" --watch shows no SHARE for %s in a busy frame;", r.function.c_str());
      weighted[r.function] += sum * r.share;
    }
    *table += " ]";
    weights += sum;
  }
  if (checked == 0) problems += format(" --watch showed no traffic on the cable to rank %d in %zu frame(s);", peer, frames.size());
  double fair = 100.0 / static_cast<double>(devs.size());
  for (const auto& w : weighted) {
    double share = weights > 0 ? w.second / weights : 0;
    *table += format(" %s~%.1f%%", w.first.c_str(), share);
    if (std::fabs(share - fair) > tolerance * fair) {
      problems += format(" --watch shows %s with %.1f%% of its cable over the busy frames, not %.0f%% +- %.0f%%;",
                         w.first.c_str(), share, fair, tolerance * 100);
    }
  }
  return problems;
}

// The sum of `field` ("tx_bytes" or "rx_bytes") over the flows of `kind` in --json output.
uint64_t jsonFlowBytes(const std::string& json, const std::string& kind, const std::string& field = "tx_bytes") {
  uint64_t sum = 0;
  std::istringstream in(json);
  std::string line;
  const std::string key = "\"" + field + "\": ";
  while (std::getline(in, line)) {
    if (line.find("\"kind\": \"" + kind + "\"") == std::string::npos) continue;
    size_t at = line.find(key);
    if (at == std::string::npos) fail("functions --watch: a %s flow without %s: %s", kind.c_str(), field.c_str(), line.c_str());
    sum += strtoull(line.c_str() + at + key.size(), nullptr, 10);
  }
  return sum;
}

// The addresses the flows of `kind` in --json output name nodes by: their "peer" and "from"
// values, space-separated.
std::string jsonFlowNames(const std::string& json, const std::string& kind) {
  std::string names;
  std::istringstream in(json);
  std::string line;
  while (std::getline(in, line)) {
    if (line.find("\"kind\": \"" + kind + "\"") == std::string::npos) continue;
    for (const char* field : {"\"peer\": \"", "\"from\": \""}) {
      size_t at = line.find(field);
      if (at == std::string::npos) continue;
      at += strlen(field);
      std::string name = line.substr(at, line.find('"', at) - at);
      if (!name.empty()) names += (names.empty() ? "" : " ") + name;
    }
  }
  return names;
}

}  // namespace

// --relayed (a 4-node ring, NCCL_MESH_RELAY=auto): ranks 0 and 2, which no cable joins,
// exchange through a relay, and every cable that carried the relayed stream (both legs: at
// the ends and at the relay) must show each of its functions with an equal share. Ranks 1
// and 3 only relay; at least one of them must have carried the stream on both its cables.
std::string runFunctions(Context& ctx) {
  requireNodes(ctx, 0);
  double tolerance = ctx.opts.real("tolerance", 0.10);
  int perSize = static_cast<int>(ctx.opts.integer("count", 24));
  bool relayed = ctx.opts.has("relayed");
  const std::vector<size_t> sizes = {4096, 65536, 1 << 20};
  std::vector<int> peers = {ctx.next()};
  if (ctx.nodes > 2 && ctx.prev() != ctx.next()) peers.push_back(ctx.prev());
  std::sort(peers.begin(), peers.end());
  std::vector<int> cables = peers;  // the neighbours whose cables are counted
  if (relayed) {
    if (ctx.nodes != 4 || ctx.topology != "ring") fail("functions --relayed needs a 4-node ring (--topology ring)");
    peers.clear();
    if (ctx.rank % 2 == 0) peers.push_back(ctx.next(2));
  }
  std::map<int, std::vector<std::string>> devs;
  std::map<int, std::vector<DeviceBytes>> before;
  for (int peer : cables) {
    devs[peer] = labDevicesTowards(peer);
    if (devs[peer].size() < 2) {
      fail("functions needs two devices per cable end towards rank %d (scripts/fabric-net --functions 2); found %zu",
           peer, devs[peer].size());
    }
    before[peer] = readBytes(devs[peer]);
  }
  size_t perPeer = 0;
  for (size_t s : sizes) perPeer += s * static_cast<size_t>(perSize);
  HostBuffer out(perPeer * peers.size()), in(perPeer * peers.size());
  for (size_t p = 0; p < peers.size(); ++p) {
    fillPattern(out.data() + p * perPeer, perPeer, patternSeed(ctx.rank, peers[p], 11, perPeer, 0));
  }
  size_t mark = ctx.net.logSize();
  CommTable t = establish(ctx, {peers, peers, 1, "functions"}, ctx.deadline);
  std::vector<void*> mhs;
  std::vector<Op> ops = exchangeOps(ctx, t, peers, out, in, sizes, perSize, &mhs);
  std::string tool = ctx.opts.str("watch", "");
  pid_t victim = -1;
  std::string watchOut, watchError, watchBad;
  bool watchOk = true;
  std::thread watcher;
  if (!tool.empty()) {
    setPhase("functions: a killed process's counters file");
    // The first killed process's file is swept by the next plugin that starts (the second
    // --serve removes it before it publishes its own); the second's is left for --watch.
    pid_t first = leaveStaleFile(tool, ctx.deadline);
    victim = leaveStaleFile(tool, ctx.deadline);
    if (hasCountersFile(first)) {
      watchBad += format(" the plugin that started after pid %d was killed left its stale counters file;", static_cast<int>(first));
    }
    ctx.barrier("functions-watch");  // every rank starts its exchange and its watch together
    watcher = std::thread([&] {
      watchOk = runCapture({tool, "--watch", "--interval", "1", "--count", "3", "--stats-dir", statsDir()}, &watchOut,
                           &watchError);
    });
  }
  setPhase("functions: exchanging with every neighbour");
  Clock::time_point t0 = Clock::now();
  Engine(ctx, ctx.seed).run(ops, ctx.deadline);
  double seconds = secondsSince(t0);
  std::string watchTable;
  if (!tool.empty()) {
    setPhase("functions: waiting for nccl-mesh-info --watch");
    watcher.join();
    if (!watchOk) fail("functions --watch: %s", watchError.c_str());
    std::string gone = format("(pid %d is gone)", static_cast<int>(victim));
    if (watchOut.find("removed the stale counters of a process that ended") == std::string::npos ||
        watchOut.find(gone) == std::string::npos) {
      watchBad += format(" --watch did not say it removed the stale file of the killed pid %d;", static_cast<int>(victim));
    }
    if (watchOut.find("WARN:") != std::string::npos) watchBad += " --watch printed a WARN line;";
  }
  for (size_t p = 0; p < peers.size(); ++p) {
    std::string bad = checkPattern(in.data() + p * perPeer, perPeer, patternSeed(peers[p], ctx.rank, 11, perPeer, 0));
    if (!bad.empty()) fail("functions: data from rank %d corrupt: %s", peers[p], bad.c_str());
  }
  ctx.barrier("functions-moved");
  std::string routeText = "relayed";
  if (!relayed) routeText = checkRouting(ctx, mark, std::set<int>(peers.begin(), peers.end())).describe();
  std::string table, problems;
  int busyCables = 0;
  int sendCables = 0, recvCables = 0;  // cables this rank's own stream left / arrived on
  // --two-relays: each way carries the share the steering gives it, not a half (under CPU
  // load a relay that is starved for a while gets less: 12 % was seen): a way counts as used
  // from 256 KiB on (control traffic alone is a few KiB), and its functions' shares are
  // checked from a quarter of the stream on (fewer 512 KiB pieces would make them coarse).
  const bool twoRelays = ctx.opts.has("two-relays");
  const long carried = static_cast<long>(twoRelays ? perPeer / 4 : perPeer / 2);
  const long used = twoRelays ? 256L << 10 : carried;
  for (int peer : cables) {
    std::vector<DeviceBytes> after = readBytes(devs[peer]);
    std::vector<long> sent, rcvd;
    long sentSum = 0, rcvdSum = 0;
    table += format(" peer%d:", peer);
    for (size_t i = 0; i < after.size(); ++i) {
      sent.push_back(after[i].sent - before[peer][i].sent);
      rcvd.push_back(after[i].rcvd - before[peer][i].rcvd);
      sentSum += sent.back();
      rcvdSum += rcvd.back();
      table += format(" %s=+%ld/+%ld", after[i].dev.c_str(), sent.back(), rcvd.back());
    }
    // Relayed: a cable direction the stream did not take carries only control traffic (the
    // route plan sends 0 -> 2 and 2 -> 0 through different relays on a 4-ring).
    bool sentData = !relayed || sentSum >= carried;
    bool rcvdData = !relayed || rcvdSum >= carried;
    sendCables += sentSum >= used ? 1 : 0;
    recvCables += rcvdSum >= used ? 1 : 0;
    if (!sentData && !rcvdData) continue;
    ++busyCables;
    if (sentData) problems += shareProblems("sent", sent, tolerance, &table);
    if (rcvdData) problems += shareProblems("rcvd", rcvd, tolerance, &table);
    // Relayed, the pieces go to whichever QP is less busy (Comm::pickRelayQp), so over the
    // tool's three 1-s frames a starved relay leans further than the whole stream does (44/56
    // with two CPU burners and more, the fabric's counters 0.476/0.524 for the whole): the
    // watched shares get twice the tolerance there; the whole stream's keep theirs (above).
    if (!tool.empty()) watchBad += watchProblems(watchOut, peer, devs[peer], relayed ? 2 * tolerance : tolerance, &watchTable);
  }
  if (!tool.empty() && relayed) {
    // The relays' forwarded bytes are what ranks 0 and 2 sent through them: exact, once every
    // receive completed (a relay posts a piece before the receiver can complete).
    std::string json, error;
    if (!runCapture({tool, "--watch", "--json", "--interval", "0.2", "--stats-dir", statsDir()}, &json, &error)) {
      fail("functions --watch --json: %s", error.c_str());
    }
    uint64_t mine = jsonFlowBytes(json, ctx.rank % 2 == 0 ? "relayed" : "forwarded");
    // The receiving end counts what arrived through the relay as relayed from the other end
    // (the relay's HELLO names the sender), not as direct from the relay node.
    if (ctx.rank % 2 == 0) {
      uint64_t in = jsonFlowBytes(json, "relayed", "rx_bytes");
      if (in != perPeer) {
        watchBad += format(" rank %d counted %llu bytes received as relayed (expected %zu: what rank %d sent it);", ctx.rank,
                           static_cast<unsigned long long>(in), perPeer, ctx.next(2));
      }
    }
    ctx.rv->publish(format("functions-flow.%d", ctx.rank), std::to_string(mine));
    ctx.rv->publish(format("functions-names.%d", ctx.rank),
                    jsonFlowNames(json, ctx.rank % 2 == 0 ? "relayed" : "forwarded") + " ");
    if (ctx.rank == 0) {
      uint64_t relayedSent = 0, forwarded = 0;
      std::map<int, std::set<std::string>> names;  // node -> every address a flow row names it by
      for (int r = 0; r < 4; ++r) {
        uint64_t v = std::stoull(ctx.rv->fetch(format("functions-flow.%d", r), ctx.deadline, "a rank's --json flow bytes"));
        (r % 2 == 0 ? relayedSent : forwarded) += v;
        std::istringstream list(ctx.rv->fetch(format("functions-names.%d", r), ctx.deadline, "a rank's flow names"));
        for (std::string a; list >> a;) names[labNodeOf(a)].insert(a);
      }
      // One node, one name: the sender's row, the receiver's and the relays' name each end
      // alike, whichever cable a leg takes (nodeAddress in relay_service.h).
      for (const auto& [node, addrs] : names) {
        std::string all;
        for (const std::string& a : addrs) all += " " + a;
        watchTable += format(" node%d_named:%s", node, all.c_str());
        if (node != 0 && node != 2) watchBad += format(" a relayed or forwarded flow names node %d (%s);", node, all.c_str());
        if (addrs.size() != 1) {
          watchBad += format(" the relayed and forwarded flows name node %d by %zu addresses (%s ), expected one;", node,
                             addrs.size(), all.c_str());
        }
      }
      watchTable += format(" relayed_sent=%llu forwarded=%llu", static_cast<unsigned long long>(relayedSent),
                           static_cast<unsigned long long>(forwarded));
      if (relayedSent != 2 * perPeer || forwarded != relayedSent) {
        watchBad += format(" ranks 0 and 2 sent %llu bytes through the relays (expected %zu) and the relays forwarded %llu;",
                           static_cast<unsigned long long>(relayedSent), 2 * perPeer,
                           static_cast<unsigned long long>(forwarded));
      }
    }
    ctx.barrier("functions-flows");
  }
  if (relayed) {
    ctx.rv->publish(format("functions-busy.%d", ctx.rank), std::to_string(busyCables));
    if (ctx.rank == 0) {
      int relays = 0;
      for (int r : {1, 3}) {
        if (std::stoi(ctx.rv->fetch(format("functions-busy.%d", r), ctx.deadline, "a relay's cable count")) == 2) ++relays;
      }
      if (relays < 1 || busyCables < 1) {
        problems += format(" the relayed stream crossed %d relay(s) on both cables and %d of rank 0's cables;", relays,
                           busyCables);
      }
      // --two-relays (NCCL_MESH_RELAY_TWIN=1): 0 -> 2 goes over both relays, and so does 2 -> 0:
      // rank 0 sends and receives on both of its cables (with one relay per connection, the
      // route plan sends one way out of one cable and takes the other way in on the other).
      if (twoRelays && (sendCables != 2 || recvCables != 2)) {
        problems += format(" --two-relays: rank 0 sent its stream on %d cable(s) and received on %d (expected 2 "
                           "and 2);", sendCables, recvCables);
      }
      table += format(" send_cables=%d recv_cables=%d", sendCables, recvCables);
      table += format(" relays=%d", relays);
    }
    ctx.barrier("functions-counted");
  }
  for (size_t i = 0; i < mhs.size(); i += 2) {
    int peer = peers[i / 2];
    deregHost(ctx, t[peer].send[0], mhs[i], "functions out");
    deregHost(ctx, t[peer].recv[0], mhs[i + 1], "functions in");
  }
  closeAll(ctx, t);
  std::string figures = format("seconds=%.3f route=[%s] bytes(sent/rcvd):%s", seconds, routeText.c_str(),
                               table.c_str());
  if (!problems.empty()) fail("functions: not an equal share per function:%s (%s)", problems.c_str(), figures.c_str());
  if (!watchBad.empty()) {
    fail("functions --watch:%s (%s)\n--- nccl-mesh-info --watch said:\n%s", watchBad.c_str(), watchTable.c_str(),
         watchOut.c_str());
  }
  if (!tool.empty()) figures += " --watch:" + watchTable;
  return figures;
}

}  // namespace e2e
