// SPDX-License-Identifier: Apache-2.0
// The step engine for collectives as NCCL runs them (coll_pipeline.h) and the topology bound.
#include "coll_pipeline.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>
#include <sched.h>

#include "scenarios.h"

namespace e2e {

Pipeline::~Pipeline() = default;

int Pipeline::addConn(void* comm, bool send, const std::string& label, int tag) {
  Conn c;
  c.comm = comm;
  c.send = send;
  c.label = label;
  c.tag = tag;
  c.staging = HostBuffer(slotBytes_ * kNcclSteps);
  c.mh = regHost(ctx_, comm, c.staging, label + " staging");
  conns_.push_back(std::move(c));
  return static_cast<int>(conns_.size()) - 1;
}

int Pipeline::addLane(std::vector<Step> steps) {
  for (const Step& s : steps) {
    for (const Xfer& x : s.recvs) conns_.at(static_cast<size_t>(x.conn)).items.push_back(x);
    for (const Xfer& x : s.sends) conns_.at(static_cast<size_t>(x.conn)).items.push_back(x);
  }
  Lane l;
  l.steps = std::move(steps);
  lanes_.push_back(std::move(l));
  return static_cast<int>(lanes_.size()) - 1;
}

void Pipeline::release() {
  for (Conn& c : conns_) {
    if (c.mh != nullptr) deregHost(ctx_, c.comm, c.mh, c.label + " staging");
    c.mh = nullptr;
  }
}

// Receives are posted in order into the connection's next free slot, at most 8 ahead of
// the step that consumes them.
bool Pipeline::postReceives(Conn& c) {
  bool moved = false;
  while (!c.send && c.posted < c.items.size() && c.posted - c.consumed < kNcclSteps) {
    const Xfer& x = c.items[c.posted];
    size_t slot = c.posted % kNcclSteps;
    void* buf = c.staging.data() + slot * slotBytes_;
    size_t size = x.bytes;
    int tag = c.tag;
    void* req = nullptr;
    Clock::time_point t0 = Clock::now();
    ncclResult_t r = ctx_.net->irecv(c.comm, 1, &buf, &size, &tag, &c.mh, &req);
    count(&irecvs_, t0, req == nullptr);
    ctx_.net.check(r, "irecv", format("%s #%zu (%zu bytes)", c.label.c_str(), c.posted, size));
    if (req == nullptr) break;  // not yet: NCCL retries
    c.req[slot] = req;
    c.ready[slot] = false;
    ++c.posted;
    moved = true;
  }
  return moved;
}

// Tests the connection's requests in flight, oldest first (completion order is not promised:
// each one is tested), or only the oldest one not yet done (testOldestOnly: NCCL's proxy).
bool Pipeline::testRequests(Conn& c) {
  bool moved = false;
  for (size_t i = c.done; i < c.posted; ++i) {
    size_t slot = i % kNcclSteps;
    if (c.ready[slot]) continue;
    int done = 0;
    size_t sizes[1] = {0};
    Clock::time_point t0 = Clock::now();
    ncclResult_t r = ctx_.net->test(c.req[slot], &done, sizes, 1);
    count(&tests_, t0, done == 0);
    ctx_.net.check(r, "test", format("%s #%zu (%s)", c.label.c_str(), i, c.send ? "isend" : "irecv"));
    if (!done && oldestOnly_) break;
    if (!done) continue;
    if (!c.send && sizes[0] != c.items[i].bytes) {
      fail("%s #%zu: received %zu bytes, expected %zu", c.label.c_str(), i, sizes[0], c.items[i].bytes);
    }
    c.ready[slot] = true;
    c.doneLog.emplace_back(Clock::now(), c.send ? c.items[i].bytes : sizes[0]);
    c.doneSweep.push_back(sweep_);
    moved = true;
    if (oldestOnly_) break;
  }
  while (c.done < c.posted && c.ready[c.done % kNcclSteps]) ++c.done;
  if (c.send) c.consumed = c.done;  // a completed send frees its slot
  return moved;
}

void Pipeline::apply(const Conn& c, size_t slot, const Xfer& x) {
  const uint8_t* src = c.staging.data() + slot * slotBytes_;
  if (x.op == Op::Copy) {
    memcpy(data_ + x.off, src, x.bytes);
  } else if (x.op == Op::Reduce) {
    float* d = reinterpret_cast<float*>(data_ + x.off);
    const float* s = reinterpret_cast<const float*>(src);
    for (size_t i = 0; i < x.bytes / sizeof(float); ++i) d[i] += s[i];
  }
}

// A send copies its slice into the next slot (once 8 are in flight it waits) and posts it.
bool Pipeline::sendOne(Conn& c, const Xfer& x) {
  if (c.posted - c.consumed >= kNcclSteps) return false;
  size_t slot = c.posted % kNcclSteps;
  void* buf = c.staging.data() + slot * slotBytes_;
  memcpy(buf, data_ + x.off, x.bytes);
  void* req = nullptr;
  Clock::time_point t0 = Clock::now();
  ncclResult_t r = ctx_.net->isend(c.comm, buf, x.bytes, c.tag, c.mh, &req);
  count(&isends_, t0, req == nullptr);
  ctx_.net.check(r, "isend", format("%s #%zu (%zu bytes)", c.label.c_str(), c.posted, x.bytes));
  if (req == nullptr) return false;  // the receiver has not posted yet: NCCL retries
  c.req[slot] = req;
  c.ready[slot] = false;
  ++c.posted;
  return true;
}

// Runs the lane's current step as far as it can: its receives (each the next one its
// connection completed), then its sends. True when something moved.
bool Pipeline::advance(Lane& lane) {
  bool moved = false;
  while (lane.cur < lane.steps.size()) {
    const Step& s = lane.steps[lane.cur];
    if (s.afterLane >= 0 && lanes_[static_cast<size_t>(s.afterLane)].cur <= static_cast<size_t>(s.afterStep)) break;
    if (!lane.applied) {
      for (const Xfer& x : s.recvs) {
        const Conn& c = conns_[static_cast<size_t>(x.conn)];
        if (c.done <= c.consumed) return moved;  // its receive has not completed yet
      }
      for (const Xfer& x : s.recvs) {
        Conn& c = conns_[static_cast<size_t>(x.conn)];
        apply(c, c.consumed % kNcclSteps, x);
        ++c.consumed;
      }
      lane.applied = true;
      moved = true;
    }
    while (lane.sent < s.sends.size() && sendOne(conns_[static_cast<size_t>(s.sends[lane.sent].conn)], s.sends[lane.sent])) {
      ++lane.sent;
      moved = true;
    }
    if (lane.sent < s.sends.size()) break;
    lane.applied = false;
    lane.sent = 0;
    ++lane.cur;
  }
  return moved;
}

void Pipeline::count(Calls* calls, Clock::time_point t0, bool idle) {
  calls->seconds += secondsSince(t0);
  ++calls->n;
  if (idle) ++calls->idle;
}

std::string Pipeline::callSummary() const {
  auto one = [](const char* name, const Calls& c) {
    return format("%s=%llu/%llu/%.0fus", name, static_cast<unsigned long long>(c.n),
                  static_cast<unsigned long long>(c.idle), c.seconds * 1e6);
  };
  return one("isend", isends_) + "," + one("irecv", irecvs_) + "," + one("test", tests_);
}

void Pipeline::run(const Deadline& deadline) {
  isends_ = irecvs_ = tests_ = Calls();
  for (Conn& c : conns_) {
    c.posted = c.done = c.consumed = 0;
    c.doneLog.clear();
    c.doneSweep.clear();
  }
  for (Lane& l : lanes_) {
    l.cur = l.sent = 0;
    l.applied = false;
  }
  for (;; ++sweep_) {
    bool moved = false;
    for (Conn& c : conns_) moved = postReceives(c) || moved;
    for (Lane& l : lanes_) moved = advance(l) || moved;
    for (Conn& c : conns_) moved = testRequests(c) || moved;
    bool finished = true;
    for (const Lane& l : lanes_) finished = finished && l.cur == l.steps.size();
    for (const Conn& c : conns_) finished = finished && c.done == c.items.size();
    if (finished) return;
    if (deadline.expired()) {
      std::string where;
      for (const Conn& c : conns_) {
        if (c.done < c.items.size()) where += format(" %s: %zu of %zu done;", c.label.c_str(), c.done, c.items.size());
      }
      fail("collective not complete before the deadline (%s):%s", deadline.what().c_str(), where.c_str());
    }
    if (!moved) sched_yield();  // spin as NCCL's proxy does
  }
}

size_t Pipeline::longestStreak() const {
  size_t n = conns_.size();
  std::map<uint64_t, std::vector<size_t>> bySweep;  // sweep -> completions per connection
  std::vector<size_t> total(n, 0);
  for (size_t i = 0; i < n; ++i) {
    const Conn& c = conns_[i];
    if (c.items.size() < 2 || c.doneSweep.size() != c.items.size()) continue;
    total[i] = c.items.size();
    for (uint64_t s : c.doneSweep) {
      auto& counts = bySweep[s];
      counts.resize(n, 0);
      ++counts[i];
    }
  }
  std::vector<size_t> seen(n, 0);
  // run[x][y]: completions of x in the sweeps since the last one in which y completed any.
  std::vector<std::vector<size_t>> run(n, std::vector<size_t>(n, 0));
  size_t longest = 0;
  for (const auto& sweep : bySweep) {
    const std::vector<size_t>& k = sweep.second;
    for (size_t x = 0; x < n; ++x) seen[x] += k[x];
    for (size_t x = 0; x < n; ++x) {
      for (size_t y = 0; y < n; ++y) {
        if (y == x || total[x] == 0 || total[y] == 0) continue;
        if (k[y] > 0) {
          run[x][y] = 0;
        } else if (k[x] > 0) {
          run[x][y] += k[x];
          if (seen[y] < total[y]) longest = std::max(longest, run[x][y]);  // y still had work
        }
      }
    }
  }
  return longest;
}

// --- the topology's bound -------------------------------------------------------------------

namespace {

Traffic zeros(int n) { return Traffic(static_cast<size_t>(n), std::vector<double>(static_cast<size_t>(n), 0.0)); }

// Every shortest path (as node lists) from a to b over the cables.
std::vector<std::vector<int>> shortestPaths(const Context& ctx, int a, int b) {
  int n = ctx.nodes;
  std::vector<int> dist(static_cast<size_t>(n), -1);
  std::vector<int> frontier{a};
  dist[static_cast<size_t>(a)] = 0;
  while (!frontier.empty()) {
    std::vector<int> next;
    for (int u : frontier) {
      for (int v = 0; v < n; ++v) {
        if (v != u && dist[static_cast<size_t>(v)] < 0 && cabled(ctx, u, v) == 1) {
          dist[static_cast<size_t>(v)] = dist[static_cast<size_t>(u)] + 1;
          next.push_back(v);
        }
      }
    }
    frontier = next;
  }
  std::vector<std::vector<int>> out;
  std::function<void(std::vector<int>&)> walk = [&](std::vector<int>& path) {
    int u = path.back();
    if (u == b) {
      out.push_back(path);
      return;
    }
    for (int v = 0; v < n; ++v) {
      if (cabled(ctx, u, v) == 1 && dist[static_cast<size_t>(v)] == dist[static_cast<size_t>(u)] + 1 &&
          dist[static_cast<size_t>(v)] <= dist[static_cast<size_t>(b)]) {
        path.push_back(v);
        walk(path);
        path.pop_back();
      }
    }
  };
  if (dist[static_cast<size_t>(b)] > 0) {
    std::vector<int> path{a};
    walk(path);
  }
  return out;
}

}  // namespace

Traffic ringAllreduceTraffic(int n) {
  Traffic t = zeros(n);
  for (int r = 0; r < n; ++r) t[static_cast<size_t>(r)][static_cast<size_t>((r + 1) % n)] = 2.0 * (n - 1) / n;
  return t;
}

Traffic treeAllreduceTraffic(int n) {
  Traffic t = zeros(n);
  for (int which = 0; which < 2; ++which) {
    for (int r = 0; r < n; ++r) {
      TreeNode node = which == 0 ? binaryTree(n, r) : secondTree(n, r);
      if (node.up < 0) continue;
      t[static_cast<size_t>(r)][static_cast<size_t>(node.up)] += 0.5;  // reduce: half the data per tree
      t[static_cast<size_t>(node.up)][static_cast<size_t>(r)] += 0.5;  // broadcast
    }
  }
  return t;
}

Traffic alltoallTraffic(int n) {
  Traffic t = zeros(n);
  for (int a = 0; a < n; ++a) {
    for (int b = 0; b < n; ++b) t[static_cast<size_t>(a)][static_cast<size_t>(b)] = a == b ? 0 : 1.0 / n;
  }
  return t;
}

double algbwBound(const Context& ctx, const Traffic& traffic, double cableBytesPerS, std::string* how) {
  int n = ctx.nodes;
  if (ctx.topology == "switch") {
    // Every node has one cable, to the switch: what it sends leaves on it, what it receives
    // arrives on it (the switch's port towards it), whoever the peer.
    double worst = 0;
    for (int a = 0; a < n; ++a) {
      double out = 0, in = 0;
      for (int b = 0; b < n; ++b) {
        out += traffic[static_cast<size_t>(a)][static_cast<size_t>(b)];
        in += traffic[static_cast<size_t>(b)][static_cast<size_t>(a)];
      }
      worst = std::max(worst, std::max(out, in));
    }
    *how = format("busiest node's cable to the switch carries %.3f S", worst);
    return cableBytesPerS / worst;
  }
  struct Flow {
    double bytes;
    std::vector<std::vector<int>> paths;
  };
  std::vector<Flow> flows;
  for (int a = 0; a < n; ++a) {
    for (int b = 0; b < n; ++b) {
      double bytes = traffic[static_cast<size_t>(a)][static_cast<size_t>(b)];
      if (bytes <= 0) continue;
      Flow f{bytes, cabled(ctx, a, b) == 1 ? std::vector<std::vector<int>>{{a, b}} : shortestPaths(ctx, a, b)};
      if (f.paths.empty()) fail("bound: no path of cables from rank %d to rank %d", a, b);
      flows.push_back(f);
    }
  }
  // Every combination of one path per flow (at most 4096; past that, the first paths).
  double best = std::numeric_limits<double>::max();
  std::vector<size_t> pick(flows.size(), 0);
  for (int combos = 0; combos < 4096; ++combos) {
    std::map<std::pair<int, int>, double> load;
    for (size_t i = 0; i < flows.size(); ++i) {
      const std::vector<int>& p = flows[i].paths[pick[i]];
      for (size_t h = 0; h + 1 < p.size(); ++h) load[{p[h], p[h + 1]}] += flows[i].bytes;
    }
    double worst = 0;
    for (const auto& kv : load) worst = std::max(worst, kv.second);
    best = std::min(best, worst);
    size_t i = 0;
    while (i < pick.size() && ++pick[i] == flows[i].paths.size()) pick[i++] = 0;
    if (i == pick.size()) break;
  }
  *how = format("busiest cable direction carries %.3f S (best paths for the uncabled pairs)", best);
  return cableBytesPerS / best;
}

}  // namespace e2e
