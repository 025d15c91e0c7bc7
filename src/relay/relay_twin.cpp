// SPDX-License-Identifier: Apache-2.0
// A relayed connection over two relays (mesh/relay/relay_twin.h).
#include "mesh/relay/relay_twin.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "mesh/platform/check.h"
#include "mesh/platform/ipv4.h"
#include "mesh/platform/log.h"

namespace mesh {

// --- TwinSteer ------------------------------------------------------------------------------

double TwinSteer::score(const Leg& l, uint64_t bytes, Clock::time_point now) const {
  double rate = l.rate;
  if (!l.inflight.empty() && rate > 0) {
    const InFlight& oldest = l.inflight.front();
    double waited = std::chrono::duration<double>(now - std::max(oldest.at, l.lastDone)).count();
    if (waited > 0) rate = std::min(rate, static_cast<double>(oldest.bytes) / waited);
  }
  if (rate == 0) return static_cast<double>(l.held) * 1e-12;  // untried: take it
  if (l.inflight.empty() && std::chrono::duration<double>(now - l.lastDone).count() > kRetryIdle) return 0;
  return static_cast<double>(l.held + bytes) / rate;
}

int TwinSteer::pick(uint64_t bytes, Clock::time_point now) const {
  int quiet = quieterLeg();
  if (quiet >= 0) return quiet;
  if (planLeg_) return 0;
  return score(legs_[0], bytes, now) <= score(legs_[1], bytes, now) ? 0 : 1;
}

void TwinSteer::setLoad(int leg, double bytesPerSecond) {
  load_[leg] = bytesPerSecond;
  loadKnown_[leg] = true;
}

void TwinSteer::setOwnRate(double bytesPerSecond) { ownRate_ = bytesPerSecond; }

int TwinSteer::quieterLeg() const {
  if (!loadKnown_[0] || !loadKnown_[1] || ownRate_ < 0) return -1;
  double hi = std::max(load_[0], load_[1]);
  double lo = std::min(load_[0], load_[1]);
  if (hi <= kLoadFloor * ownRate_ || hi - lo <= kLoadMargin * hi) return -1;
  return load_[0] < load_[1] ? 0 : 1;
}

bool LoadMeter::sample(uint64_t total, uint64_t relay, Clock::time_point now) {
  // Relay-path bytes are a part of the total; a torn read of the two can make them lead the
  // total by a post: such a sample counts as no direct traffic.
  uint64_t other = total >= relay ? total - relay : 0;
  if (!started_) {
    started_ = true;
    firstOther_ = lastOther_ = other;
    firstAt_ = lastAt_ = now;
    return false;
  }
  double secs = std::chrono::duration<double>(now - lastAt_).count();
  if (secs < kMinGap) return false;
  if (!known_) {
    // For the first kWarm: nothing; then the average since the first reading.
    double since = std::chrono::duration<double>(now - firstAt_).count();
    if (since < kWarm) return false;
    rate_ = other >= firstOther_ ? static_cast<double>(other - firstOther_) / since : 0;
  } else {
    // Then a moving average over about kSmooth: an all-to-all's rounds (one neighbour's
    // sends now, the other's next) average out; NCCL's tree keeps one cable busier throughout.
    double sample = other >= lastOther_ ? static_cast<double>(other - lastOther_) / secs : 0;
    rate_ += (1 - std::exp(-secs / kSmooth)) * (sample - rate_);
  }
  known_ = true;
  lastOther_ = other;
  lastAt_ = now;
  return true;
}

void TwinSteer::posted(int leg, uint64_t id, uint64_t bytes, Clock::time_point now) {
  Leg& l = legs_[leg];
  ++l.sends;
  l.total += bytes;
  // What score() reads; on the plan's way nothing does, so nothing is kept (a deque grows
  // by allocating, and this is the data path).
  if (planLeg_) return;
  l.inflight.push_back(InFlight{id, bytes, now});
  l.held += bytes;
}

void TwinSteer::completed(int leg, uint64_t id, Clock::time_point now) {
  if (planLeg_) return;  // nothing in flight was kept (posted)
  Leg& l = legs_[leg];
  auto it = std::find_if(l.inflight.begin(), l.inflight.end(), [id](const InFlight& f) { return f.id == id; });
  if (it == l.inflight.end()) return;
  double secs = std::chrono::duration<double>(now - std::max(it->at, l.lastDone)).count();
  double sample = static_cast<double>(it->bytes) / std::max(secs, 1e-6);
  l.rate = l.rate == 0 ? sample : 0.7 * l.rate + 0.3 * sample;
  l.lastDone = now;
  l.held -= it->bytes;
  l.inflight.erase(it);
}

// --- TwinComm -------------------------------------------------------------------------------

TwinComm::TwinComm(Comm* first, std::unique_ptr<Comm> second) : first_(first), second_(std::move(second)) {
  first_->setTwin(this);
  second_->setTwin(this);
  // Test switches (A/B figures; the two-way data path's tests): MESH_TEST_TWIN_RATES, the
  // loads, else the rates; MESH_TEST_TWIN_RATES_ONLY, the rates alone, as before the cables'
  // direct traffic was read.
  static const bool ratesOnly = getenv("MESH_TEST_TWIN_RATES_ONLY") != nullptr;
  static const bool rates = ratesOnly || getenv("MESH_TEST_TWIN_RATES") != nullptr;
  if (rates) steer_.useRates();
  for (int i = 0; i < 2 && !ratesOnly; ++i) {
    Comm* c = leg(i);
    for (int l = 0; l < c->linkCount(); ++l) {
      cables_[i].slots.push_back(c->linkSlot(l));
      cables_[i].relay.push_back(c->relayPathTx(l));
    }
  }
}

// What each leg carried, for the log (NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=NET).
TwinComm::~TwinComm() {
  if (steer_.sends(0) + steer_.sends(1) == 0) return;
  MESH_INFO(NCCL_NET, "relay: two-relay connection closed: its sends went %llu (%.1f MB) via leg 1, %llu (%.1f MB) "
            "via leg 2; direct traffic on the legs' first cables %.1f / %.1f MB/s",
            static_cast<unsigned long long>(steer_.sends(0)), static_cast<double>(steer_.bytes(0)) / 1e6,
            static_cast<unsigned long long>(steer_.sends(1)), static_cast<double>(steer_.bytes(1)) / 1e6,
            steer_.load(0) / 1e6, steer_.load(1) / 1e6);
}

// Each leg's cable ends: all this process posted there, and what relay paths did.
void TwinComm::sampleLoads(TwinSteer::Clock::time_point now) {
  if (cables_[0].slots.empty()) return;  // MESH_TEST_TWIN_RATES_ONLY
  for (int i = 0; i < 2; ++i) {
    uint64_t total = 0, relay = 0;
    for (size_t l = 0; l < cables_[i].slots.size(); ++l) {
      if (cables_[i].relay[l] == nullptr) return;  // unpublished counters: the rates decide
      relay += stats::load(cables_[i].relay[l]);
      total += stats::load(&cables_[i].slots[l]->txBytes);
    }
    if (meters_[i].sample(total, relay, now)) steer_.setLoad(i, meters_[i].rate());
  }
  if (own_.sample(steer_.bytes(0) + steer_.bytes(1), 0, now)) steer_.setOwnRate(own_.rate());
}

Request* TwinComm::link(Request* whole, Request* other, bool dataSend) {
  whole->twinned = true;
  Part& p = part(whole);
  p = Part();
  p.other = other;
  p.dataSend = dataSend;
  p.id = nextId_++;
  return whole;
}

ncclResult_t TwinComm::payOwed(bool* paid) {
  *paid = !owed_.active;
  if (*paid) return ncclSuccess;
  Request* r = nullptr;
  Comm* c = leg(owed_.leg);
  // A failed leg fails the connection: the owed part is what the whole request waits on,
  // and nothing else tests that leg (the request's own leg may be healthy).
  if (owed_.kind == Request::Kind::Send) {
    MESH_CHECK(static_cast<SendComm*>(c)->isend(owed_.data[0], 0, owed_.tags[0], owed_.mh[0], &r));
  } else {
    MESH_CHECK(static_cast<RecvComm*>(c)->irecv(owed_.n, owed_.data, owed_.sizes, owed_.tags, owed_.mh, &r));
  }
  if (r == nullptr) return ncclSuccess;
  part(owed_.whole).other = r;
  owed_.active = false;
  *paid = true;
  return ncclSuccess;
}

ncclResult_t TwinComm::isend(void* data, size_t size, int tag, const MrHandle* mh, Request** out) {
  *out = nullptr;
  bool paid = false;
  MESH_CHECK(payOwed(&paid));
  if (!paid) return ncclSuccess;  // the previous message's other part first
  auto now = TwinSteer::Clock::now();
  sampleLoads(now);
  int d = steer_.pick(size, now);
  Request* whole = nullptr;
  MESH_CHECK(static_cast<SendComm*>(leg(d))->isend(data, size, tag, mh, &whole));
  if (whole == nullptr) return ncclSuccess;
  Request* other = nullptr;
  MESH_CHECK(static_cast<SendComm*>(leg(1 - d))->isend(data, 0, tag, mh, &other));
  link(whole, other, size > 0);
  if (size > 0) steer_.posted(d, part(whole).id, size, now);
  if (other == nullptr) {
    owed_ = Owed();
    owed_.active = true;
    owed_.leg = 1 - d;
    owed_.whole = whole;
    owed_.kind = Request::Kind::Send;
    owed_.data[0] = data;
    owed_.tags[0] = tag;
    owed_.mh[0] = const_cast<MrHandle*>(mh);
  }
  *out = whole;
  return ncclSuccess;
}

ncclResult_t TwinComm::irecv(int n, void** data, const size_t* sizes, const int* tags, MrHandle* const* mh,
                             Request** out) {
  *out = nullptr;
  MESH_REQUIRE(n >= 1 && n <= kGroupMax, ncclInvalidArgument, "irecv: %d buffers (1..%d)", n, kGroupMax);
  bool paid = false;
  MESH_CHECK(payOwed(&paid));
  if (!paid) return ncclSuccess;
  Request* whole = nullptr;
  MESH_CHECK(static_cast<RecvComm*>(first_)->irecv(n, data, sizes, tags, mh, &whole));
  if (whole == nullptr) return ncclSuccess;
  Request* other = nullptr;
  MESH_CHECK(static_cast<RecvComm*>(second_.get())->irecv(n, data, sizes, tags, mh, &other));
  link(whole, other, false);
  if (other == nullptr) {
    owed_ = Owed();
    owed_.active = true;
    owed_.leg = 1;
    owed_.whole = whole;
    owed_.kind = Request::Kind::Recv;
    owed_.n = n;
    for (int i = 0; i < n; ++i) {
      owed_.data[i] = data[i];
      owed_.sizes[i] = sizes[i];
      owed_.tags[i] = tags[i];
      owed_.mh[i] = mh[i];
    }
  }
  *out = whole;
  return ncclSuccess;
}

ncclResult_t TwinComm::iflush(int n, void** data, const int* sizes, MrHandle* const* mh, Request** out) {
  *out = nullptr;
  Request* a = nullptr;
  Request* b = nullptr;
  MESH_CHECK(static_cast<RecvComm*>(first_)->iflush(n, data, sizes, mh, &a));
  MESH_CHECK(static_cast<RecvComm*>(second_.get())->iflush(n, data, sizes, mh, &b));
  if (a != nullptr && b != nullptr) {
    *out = link(a, b, false);
  } else {
    *out = a != nullptr ? a : b;  // one part alone is a plain request of its leg
  }
  return ncclSuccess;
}

ncclResult_t TwinComm::test(Request* req, int* done, size_t* sizes) {
  *done = 0;
  int l = legOf(req);
  Part& p = part(req);
  if (p.other == nullptr) {
    bool paid = false;
    if (owed_.active && owed_.whole == req) MESH_CHECK(payOwed(&paid));
    if (!paid) {
      // Still owed: keep this leg moving (its completions free what the other part waits on).
      // No grace here once the peer is gone (Comm::test gives one): the peer cannot have
      // finished this message, since its other part was never posted (a send's zero-byte
      // marker, or a receive the sender's marker waits for), so a close means it gave up.
      MESH_CHECK(leg(l)->pollAlive("with a request pending"));
      return ncclSuccess;
    }
  }
  if (!p.otherDone) {
    int d = 0;
    MESH_CHECK(leg(1 - l)->test(p.other, &d, p.otherSizes));
    if (!d) return ncclSuccess;
    p.otherDone = true;
  }
  Request::Kind kind = req->kind;
  int n = req->n;
  MESH_CHECK(leg(l)->test(req, done, sizes));
  if (!*done) return ncclSuccess;
  if (sizes != nullptr && kind == Request::Kind::Recv) {
    for (int i = 0; i < n; ++i) sizes[i] += p.otherSizes[i];
  }
  if (p.dataSend) steer_.completed(l, p.id, TwinSteer::Clock::now());
  p = Part();
  return ncclSuccess;
}

namespace {
// a's entries, then b's that a lacks.
std::vector<int> unionOf(std::vector<int> a, const std::vector<int>& b) {
  for (int x : b) {
    if (std::find(a.begin(), a.end(), x) == a.end()) a.push_back(x);
  }
  return a;
}
}  // namespace

std::vector<int> TwinComm::deviceIndexes() const { return unionOf(first_->deviceIndexes(), second_->deviceIndexes()); }

std::vector<int> TwinComm::localPorts() const { return unionOf(first_->localPorts(), second_->localPorts()); }

// --- Connect and accept ---------------------------------------------------------------------

void discardComm(Handshaker* hs, std::unique_ptr<PreparedConn> conn) {
  if (conn == nullptr) return;
  Comm* c = static_cast<Comm*>(conn.get());
  c->close();
  if (hs != nullptr) hs->closeControl(c->control);
}

namespace {
// Counts a relayed connection NCCL gets (one of one relay, or one over two relays) and
// returns its number in this process. The first one also gets the process's one WARN, naming
// the target by its node address (its lowest, as the route plan and the live counters name
// nodes) and `via` (one relay's address, or "A and B"); the count is for the INFO lines after it. Only
// TwinConnector calls it: every relayed connect of this process's own goes through one, and
// a hop a relay forwards for another node is not this process's connection.
uint64_t noteRelayedConnection(const std::string& target, const std::string& via) {
  // One WARN per process: relayed pairs are slower than cabled ones, and a job that relays
  // more than it must usually launched its ranks out of cable order.
  static std::atomic<uint64_t> relayed{0};
  uint64_t n = relayed.fetch_add(1) + 1;
  if (n == 1) {
    MESH_WARN("relay: connection to %s goes through %s (no cable to it): relayed connections are slower "
              "than cabled ones; launching ranks in cable order (nccl-mesh-info --ring-order) keeps "
              "NCCL's ring on cables. Further relayed connections are counted at INFO level",
              target.c_str(), via.c_str());
  }
  return n;
}
}  // namespace

TwinConnector::TwinConnector(Handshaker* hs, std::vector<LocalNic> nics, Handle target, RelayConnector::Lookup lookup,
                             ConnOptions opts, RelayConnectSettings s, bool twinAllowed)
    : hs_(hs),
      nics_(std::move(nics)),
      target_(std::move(target)),
      lookup_(std::move(lookup)),
      opts_(opts),
      settings_(s),
      twinAllowed_(twinAllowed) {
  auto now = std::chrono::steady_clock::now();
  settleUntil_ = now + std::chrono::milliseconds(std::max(0, std::min(s.settleMs, s.timeoutMs / 2)));
  // The whole connect, both relays, the one-relay fallback and its retries, ends within two
  // timeouts: a relay that went silent costs one, the next way gets the other.
  settings_.endBy = now + 2 * std::chrono::milliseconds(s.timeoutMs);
  if (!twinAllowed_) single("");
}

TwinConnector::~TwinConnector() {
  legs_[0].reset();
  legs_[1].reset();
  for (auto& d : done_) discardComm(hs_, std::move(d));
}

std::unique_ptr<RelayConnector> TwinConnector::connector(std::vector<NextHop> fixed, int twinLeg, int settleMs,
                                                         NodeId last) const {
  ConnOptions o = opts_;
  o.twinLeg = twinLeg;
  RelayConnector::Lookup lookup = lookup_;
  if (!fixed.empty()) {
    lookup = [fixed](bool) { return fixed; };
  } else if (last != 0) {
    // A failed leg's relay goes last: the plan preferred it, so asked first it would cost a
    // second timeout when it went silent (a stopped process) before the other way is tried.
    RelayConnector::Lookup all = lookup_;
    lookup = [all, last](bool mayWait) {
      std::vector<NextHop> c = all(mayWait);
      std::stable_partition(c.begin(), c.end(), [last](const NextHop& h) { return h.route.nextHop != last; });
      return c;
    };
  }
  RelayConnectSettings s = settings_;
  s.settleMs = settleMs;
  // Test-only (MESH_TEST_TWIN_FAIL_LEG=2, fabric_e2e_relay_ring4_twin_fallback): that leg asks
  // the relay on the port after the relay port, where nothing listens, so it cannot come up.
  static const char* failLeg = getenv("MESH_TEST_TWIN_FAIL_LEG");
  if (failLeg != nullptr && twinLeg != 0 && atoi(failLeg) == twinLeg) s.port = s.port % 65535 + 1;
  return std::make_unique<RelayConnector>(hs_, nics_, target_, lookup, o, s);
}

void TwinConnector::single(const std::string& why, NodeId failed) {
  if (!why.empty()) {
    MESH_INFO(NCCL_INIT | NCCL_NET, "relay: connection to %s goes through one relay: %s",
              target_.addrs.empty() ? "?" : formatIpv4(nodeAddress(target_.addrs)).c_str(), why.c_str());
  }
  legs_[1].reset();
  for (auto& d : done_) discardComm(hs_, std::move(d));
  // What is left of the picture's settling time, not a fresh one: this connect waited already.
  auto left = std::chrono::ceil<std::chrono::milliseconds>(settleUntil_ - std::chrono::steady_clock::now());
  legs_[0] = connector({}, 0, static_cast<int>(std::max<int64_t>(0, left.count())), failed);
  state_ = State::Single;
}

ncclResult_t TwinConnector::poll(std::unique_ptr<PreparedConn>* out) {
  *out = nullptr;
  if (state_ == State::Deciding) {
    auto now = std::chrono::steady_clock::now();
    std::vector<NextHop> c = lookup_(now < settleUntil_);
    if (c.empty()) {
      if (now < settleUntil_) return ncclSuccess;  // the picture is settling: NCCL calls again
      single("");
    } else {
      // A second way: as short as the first, through another relay.
      size_t j = 1;
      while (j < c.size() && (c[j].route.nextHop == c[0].route.nextHop || c[j].route.hops != c[0].route.hops ||
                              c[j].route.localPort == c[0].route.localPort)) {
        ++j;
      }
      if (j == c.size()) {
        single("");
      } else {
        legs_[0] = connector({c[0]}, 1, 0);  // a fixed candidate: nothing to wait for
        legs_[1] = connector({c[j]}, 2, 0);
        legRelay_[0] = c[0].route.nextHop;
        legRelay_[1] = c[j].route.nextHop;
        state_ = State::Twin;
      }
    }
  }
  if (state_ == State::Single) {
    const RelayConnector& c = *legs_[0];
    if (legs_[0]->poll(out) != ncclSuccess) {
      MESH_WARN("connect to %s: no cable to it, and no relay took the connection%s", c.targetText().c_str(),
                c.tried().c_str());
      return ncclSystemError;
    }
    if (*out != nullptr) {
      auto* comm = static_cast<SendComm*>(out->get());
      uint32_t peer = nodeAddress(target_.addrs);
      comm->countAs(stats::FlowKind::Relayed, peer, c.viaAddr(), 0);
      uint64_t n = noteRelayedConnection(formatIpv4(peer), c.via());
      MESH_INFO(NCCL_INIT | NCCL_NET, "relay: connected to %s via %s (%s; relayed connection %llu of this process)",
                c.targetText().c_str(), c.via().c_str(), c.rule().c_str(), static_cast<unsigned long long>(n));
    }
    return ncclSuccess;
  }
  for (int i = 0; i < 2; ++i) {
    if (done_[i] != nullptr) continue;
    const RelayConnector& c = *legs_[i];
    if (legs_[i]->poll(&done_[i]) != ncclSuccess) {
      MESH_INFO(NCCL_INIT | NCCL_NET, "relay: leg %d of a two-relay connection to %s did not come up%s", i + 1,
                c.targetText().c_str(), c.tried().c_str());
      single("leg " + std::to_string(i + 1) + " (via " + c.via() + ") did not come up", legRelay_[i]);
      return ncclSuccess;
    }
    // Leg 1 is the way one relay would take (the route plan's, or the fallback rule's), leg 2
    // the other way as short. The connection is counted (and the first one WARNed about)
    // once both legs are up, naming both relays (below).
    if (done_[i] != nullptr) {
      MESH_INFO(NCCL_INIT | NCCL_NET, "relay: connected to %s via %s (%s; leg %d of a two-relay connection)",
                c.targetText().c_str(), c.via().c_str(), i == 1 ? "second way" : c.rule().c_str(), i + 1);
    }
  }
  if (done_[0] == nullptr || done_[1] == nullptr) return ncclSuccess;
  uint32_t peer = nodeAddress(target_.addrs);
  for (int i = 0; i < 2; ++i) {
    auto* comm = static_cast<SendComm*>(done_[i].get());
    comm->countAs(stats::FlowKind::Relayed, peer, legs_[i]->viaAddr(), 0);
    comm->markOpen();
  }
  std::string both = legs_[0]->via() + " and " + legs_[1]->via();
  uint64_t n = noteRelayedConnection(formatIpv4(peer), both);
  MESH_INFO(NCCL_INIT | NCCL_NET, "relay: connection to %s goes through %s (two relays), relayed connection %llu "
            "of this process", formatIpv4(peer).c_str(), both.c_str(), static_cast<unsigned long long>(n));
  auto* first = static_cast<Comm*>(done_[0].get());
  std::unique_ptr<Comm> second(static_cast<Comm*>(done_[1].release()));
  new TwinComm(first, std::move(second));  // owned by `first` (Comm::twin(), closed with it)
  *out = std::move(done_[0]);
  return ncclSuccess;
}

void TwinAccept::take(Handshaker* hs, std::unique_ptr<PreparedConn> conn, std::unique_ptr<PreparedConn>* out) {
  auto* c = static_cast<Comm*>(conn.get());
  if (c->twinLeg() == 0) {
    *out = std::move(conn);
    return;
  }
  int i = c->twinLeg() - 1;
  discardComm(hs, std::move(held[i]));  // an earlier leg i whose pair never completed
  held[i] = std::move(conn);
  dropDead(hs);
  if (held[0] == nullptr || held[1] == nullptr) return;
  auto* first = static_cast<Comm*>(held[0].get());
  std::unique_ptr<Comm> second(static_cast<Comm*>(held[1].release()));
  MESH_INFO(NCCL_INIT | NCCL_NET, "relay: accepted a two-relay connection from %s (via %s and %s)",
            formatIpv4(first->originAddr()).c_str(), formatIpv4(first->peerAddr()).c_str(),
            formatIpv4(second->peerAddr()).c_str());
  new TwinComm(first, std::move(second));
  *out = std::move(held[0]);
}

void TwinAccept::dropDead(Handshaker* hs) {
  for (auto& h : held) {
    if (h != nullptr && !static_cast<Comm*>(h.get())->peerAlive()) discardComm(hs, std::move(h));
  }
}

void TwinAccept::clear(Handshaker* hs) {
  for (auto& h : held) discardComm(hs, std::move(h));
}

}  // namespace mesh
