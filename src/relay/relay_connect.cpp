// SPDX-License-Identifier: Apache-2.0
// A's side of a relayed connect (mesh/relay/relay_service.h): RELAY-OPEN to each candidate next
// hop in turn, then the leg's ordinary handshake. Runs inside NCCL's connect() calls and
// never blocks: every socket call is non-blocking and each state has a deadline.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>

#include "mesh/platform/check.h"
#include "mesh/platform/ipv4.h"
#include "mesh/platform/log.h"
#include "mesh/relay/relay_proto.h"
#include "mesh/relay/relay_service.h"
#include "mesh/routing/subnet_routing.h"

namespace mesh {

namespace {
std::string addrList(const std::vector<HandleAddress>& addrs) {
  std::string s;
  for (const HandleAddress& a : addrs) s += (s.empty() ? "" : ",") + formatIpv4(a.addr);
  return s;
}
}  // namespace

uint32_t nodeAddress(const std::vector<HandleAddress>& handleAddrs) {
  uint32_t lowest = 0;
  for (const HandleAddress& a : handleAddrs) {
    if (a.addr != 0 && (lowest == 0 || a.addr < lowest)) lowest = a.addr;
  }
  return lowest;
}

uint32_t nodeAddress(const std::vector<LocalNic>& nics) {
  uint32_t lowest = 0;
  for (const LocalNic& nic : nics) {
    for (const LocalAddress& a : nic.addrs) {
      if (a.ip.addr != 0 && (lowest == 0 || a.ip.addr < lowest)) lowest = a.ip.addr;
    }
  }
  return lowest;
}

RelayConnector::RelayConnector(Handshaker* hs, std::vector<LocalNic> nics, Handle target, Lookup lookup,
                               ConnOptions opts, RelayConnectSettings s)
    : hs_(hs),
      nics_(std::move(nics)),
      target_(std::move(target)),
      lookup_(std::move(lookup)),
      opts_(opts),
      settings_(s) {
  auto now = std::chrono::steady_clock::now();
  routeDeadline_ = capped(now + std::chrono::milliseconds(s.timeoutMs));
  settleUntil_ = now + std::chrono::milliseconds(std::max(0, std::min(s.settleMs, s.timeoutMs / 2)));
  std::random_device rd;
  request_ = (uint64_t{rd()} << 32) | rd();
}

RelayConnector::~RelayConnector() {
  if (fd_ >= 0) close(fd_);
  if (leg_ != nullptr) hs_->discardConnect(leg_);
}

std::chrono::steady_clock::time_point RelayConnector::capped(std::chrono::steady_clock::time_point t) const {
  return settings_.endBy != std::chrono::steady_clock::time_point() ? std::min(t, settings_.endBy) : t;
}

bool RelayConnector::pastEnd(std::chrono::steady_clock::time_point now) const {
  return settings_.endBy != std::chrono::steady_clock::time_point() && now >= settings_.endBy;
}

std::string RelayConnector::via() const {
  if (candidates_.empty()) return "?";
  // Past the last candidate (every one failed): the last one asked.
  return formatIpv4(candidates_[std::min(index_, candidates_.size() - 1)].route.nextHopAddr);
}

std::string RelayConnector::rule() const {
  if (index_ >= candidates_.size()) return "?";
  return candidates_[index_].planned ? "route plan" : "fallback rule";
}

std::string RelayConnector::endText() const {
  return "twice NCCL_MESH_CONNECT_TIMEOUT_MS, " + std::to_string(2 * int64_t{settings_.timeoutMs}) + " ms, after it began";
}

std::string RelayConnector::targetText() const { return addrList(target_.addrs); }

std::string RelayConnector::tried() const {
  std::string all;
  for (const std::string& t : tried_) all += "; " + t;
  return all;
}

uint32_t RelayConnector::viaAddr() const {
  return index_ < candidates_.size() ? candidates_[index_].route.nextHopAddr : 0;
}

void RelayConnector::nextCandidate(const std::string& why) {
  stats::Publisher::event(stats::kRelayRetries);
  tried_.push_back("via " + via() + ": " + why);
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
  if (leg_ != nullptr) hs_->discardConnect(leg_);
  leg_.reset();
  out_.clear();
  in_.clear();
  sent_ = 0;
  ++index_;
  state_ = State::Start;
}

ncclResult_t RelayConnector::poll(std::unique_ptr<PreparedConn>* out) {
  *out = nullptr;
  for (int guard = 0; guard < 16; ++guard) {
    State before = state_;
    size_t candidate = index_;
    MESH_CHECK(stepCandidate());
    if (state_ == State::Failed) return ncclSystemError;  // the caller logs tried()
    if (state_ == State::Leg) {
      ncclResult_t r = hs_->pollConnect(leg_, out);
      if (r != ncclSuccess) {
        nextCandidate("the leg's handshake failed (see above)");
        continue;
      }
      if (*out != nullptr) {
        leg_.reset();
      } else if (pastEnd(std::chrono::steady_clock::now())) {
        nextCandidate("the leg's handshake had not finished at the connect's end (" + endText() + ")");
        continue;
      }
      return ncclSuccess;
    }
    if (state_ == before && index_ == candidate) return ncclSuccess;  // waiting on the network
  }
  return ncclSuccess;
}

ncclResult_t RelayConnector::stepCandidate() {
  auto now = std::chrono::steady_clock::now();
  if (state_ != State::Start && state_ != State::Leg && now > deadline_) {
    nextCandidate(deadline_ == settings_.endBy
                      ? "no answer before the connect's end (" + endText() + ")"
                      : "no answer within " + std::to_string(settings_.timeoutMs) + " ms (NCCL_MESH_CONNECT_TIMEOUT_MS)");
  }
  switch (state_) {
    case State::Start: {
      if (candidates_.empty() && tried_.empty()) {
        candidates_ = lookup_(now < settleUntil_);
        if (candidates_.empty()) {
          if (now < routeDeadline_) return ncclSuccess;  // no neighbour heard yet: NCCL calls again
          tried_.push_back("no neighbour announced a route to it within " + std::to_string(settings_.timeoutMs) +
                           " ms (NCCL_MESH_RELAY=auto on the neighbours? NCCL_MESH_ROUTES?)");
        }
      }
      if (index_ >= candidates_.size()) {
        // Every candidate failed. Until the connect timeout, ask again every 100 ms: a
        // neighbour's relay may not be listening yet. A two-relay leg does not wait: its
        // connect falls back to one relay, which does. Relays that all said their staging
        // memory is full end it at once: NCCL sets up a communicator's connections before
        // any closes, so waiting would only move the same error 30 s later.
        bool allFull = !candidates_.empty() && memRefusals_ == candidates_.size();
        if (now >= routeDeadline_ || candidates_.empty() || opts_.twinLeg != 0 || allFull) {
          state_ = State::Failed;
          return ncclSuccess;
        }
        if (retryAt_ == std::chrono::steady_clock::time_point()) retryAt_ = now + std::chrono::milliseconds(100);
        if (now < retryAt_) return ncclSuccess;
        retryAt_ = std::chrono::steady_clock::time_point();
        std::vector<NextHop> again = lookup_(false);
        if (!again.empty()) candidates_ = again;
        index_ = 0;
        memRefusals_ = 0;
        tried_.clear();
      }
      if (pastEnd(now)) {
        // The connect's time is up: the relays not asked yet are named, and the connect fails.
        for (size_t i = index_; i < candidates_.size(); ++i) {
          tried_.push_back("via " + formatIpv4(candidates_[i].route.nextHopAddr) + ": not asked before the connect's end");
        }
        state_ = State::Failed;
        return ncclSuccess;
      }
      const NextHop& hop = candidates_[index_];
      uint32_t local = 0;
      for (const LocalNic& nic : nics_) {
        if (nic.index != hop.route.localPort) continue;
        for (const LocalAddress& a : nic.addrs) {
          if (sameSubnet(hop.route.nextHopAddr, a.ip.addr, a.ip.prefixLen)) local = a.ip.addr;
        }
      }
      deadline_ = capped(now + std::chrono::milliseconds(settings_.timeoutMs));
      fd_ = newTcpSocket();
      if (fd_ < 0) {
        nextCandidate(std::string("socket: ") + strerror(errno));
        return ncclSuccess;
      }
      sockaddr_in sa = ipv4SockAddr(local, 0);
      if (local != 0 && bind(fd_, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
        nextCandidate(std::string("bind ") + formatIpv4(local) + ": " + strerror(errno));
        return ncclSuccess;
      }
      sa = ipv4SockAddr(hop.route.nextHopAddr, static_cast<uint16_t>(settings_.port));
      if (connect(fd_, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 && errno != EINPROGRESS) {
        nextCandidate(std::string("connect to the relay port: ") + strerror(errno));
        return ncclSuccess;
      }
      RelayMessage m;
      m.type = RelayType::Open;
      m.open.origin = settings_.origin != 0 ? settings_.origin : settings_.self;
      // Named by its node address (not `local`, the cable this leg leaves on), so the
      // receiver's counters name this node as ours name it (nodeAddress).
      uint32_t self = nodeAddress(nics_);
      m.open.originAddr = settings_.originAddr != 0 ? settings_.originAddr : self != 0 ? self : local;
      m.open.twinLeg = opts_.twinLeg;
      m.open.visited = settings_.visited;
      m.open.request = request_;
      m.open.hopBudget = std::max(1, std::min(settings_.maxHops, kRelayMaxHopBudget));
      m.open.target = target_;
      std::string error;
      if (!encodeRelay(m, &out_, &error)) {
        nextCandidate("cannot encode the request: " + error);
        return ncclSuccess;
      }
      state_ = State::Connecting;
      return ncclSuccess;
    }
    case State::Connecting: {
      pollfd p{fd_, POLLOUT, 0};
      if (::poll(&p, 1, 0) <= 0) return ncclSuccess;
      int err = 0;
      socklen_t len = sizeof(err);
      getsockopt(fd_, SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) {
        nextCandidate(std::string("cannot reach its relay port ") + std::to_string(settings_.port) + ": " +
                      strerror(err) + " (NCCL_MESH_RELAY=auto there? a process with the plugin running?)");
        return ncclSuccess;
      }
      state_ = State::Sending;
      return ncclSuccess;
    }
    case State::Sending: {
      ssize_t n = send(fd_, out_.data() + sent_, out_.size() - sent_, MSG_NOSIGNAL);
      if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        nextCandidate(std::string("send: ") + strerror(errno));
        return ncclSuccess;
      }
      if (n > 0) sent_ += static_cast<size_t>(n);
      if (sent_ == out_.size()) state_ = State::Reading;
      return ncclSuccess;
    }
    case State::Reading: {
      uint8_t buf[kRelayMaxMessage];
      ssize_t n = recv(fd_, buf, sizeof(buf), 0);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        nextCandidate("the relay closed the connection without an answer");
        return ncclSuccess;
      }
      if (n > 0) in_.insert(in_.end(), buf, buf + n);
      std::string error;
      long need = relayMessageLength(in_.data(), in_.size(), &error);
      if (need < 0) {
        nextCandidate("bad answer: " + error);
        return ncclSuccess;
      }
      if (need == 0 || in_.size() < static_cast<size_t>(need)) return ncclSuccess;
      RelayMessage m;
      if (!parseRelay(in_.data(), static_cast<size_t>(need), &m, &error) || m.type != RelayType::OpenReply ||
          m.reply.request != request_) {
        nextCandidate("bad answer: " + (error.empty() ? std::string("not the reply to our request") : error));
        return ncclSuccess;
      }
      if (m.reply.status != RelayStatus::Ok) {
        if (m.reply.status == RelayStatus::NoMemory) ++memRefusals_;
        nextCandidate(std::string(relayStatusName(m.reply.status)) + ": " + m.reply.reason);
        return ncclSuccess;
      }
      close(fd_);
      fd_ = -1;
      RouteResult route = connectRoutes(nics_, m.reply.leg.addrs, kMaxLinks);
      if (!route.ok()) {
        nextCandidate("no cable to the relay's leg addresses: " + route.error);
        return ncclSuccess;
      }
      ConnOptions legOpts = opts_;
      legOpts.twinLeg = 0;  // the relay's leg is a plain connection; the OPEN named the leg
      legOpts.originAddr = 0;
      legOpts.acceptAtOnce = true;  // a hung relay costs one timeout, then the next one is tried
      if (hs_->startConnect(m.reply.leg, route.routes, legOpts, &leg_) != ncclSuccess) {
        nextCandidate("cannot start the leg's handshake");
        return ncclSuccess;
      }
      state_ = State::Leg;
      return ncclSuccess;
    }
    case State::Leg:
    case State::Failed:
      return ncclSuccess;
  }
  return ncclSuccess;
}

}  // namespace mesh
