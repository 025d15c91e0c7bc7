// SPDX-License-Identifier: Apache-2.0
// The tools' control channel over the management network: nccl-mesh-perf's --server /
// --client rendezvous and nccl-mesh-info's --probe / --serve. Blocking TCP with a deadline
// on every call, length-prefixed messages (4-byte big-endian length, at most
// kCtrlMaxMessage bytes). Not used by the plugin itself, whose handshake runs on the mesh
// links through the reactor.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace mesh {

using CtrlClock = std::chrono::steady_clock;
constexpr size_t kCtrlMaxMessage = 1u << 20;

// A connected socket; closed when destroyed.
class CtrlSocket {
 public:
  CtrlSocket() = default;
  explicit CtrlSocket(int fd) : fd_(fd) {}
  ~CtrlSocket();
  CtrlSocket(CtrlSocket&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  CtrlSocket& operator=(CtrlSocket&& o) noexcept;
  CtrlSocket(const CtrlSocket&) = delete;
  CtrlSocket& operator=(const CtrlSocket&) = delete;

  bool valid() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  // One message each way. False with *error set on failure, timeout or a closed peer.
  bool send(const std::string& msg, CtrlClock::time_point deadline, std::string* error);
  bool recv(std::string* msg, CtrlClock::time_point deadline, std::string* error);

 private:
  int fd_ = -1;
};

// A listening socket; closed when destroyed.
class CtrlListener {
 public:
  CtrlListener() = default;
  ~CtrlListener();
  CtrlListener(const CtrlListener&) = delete;
  CtrlListener& operator=(const CtrlListener&) = delete;

  // Binds `bindHost` (empty: every interface, IPv6 and IPv4 where the kernel allows) on
  // `port` (0: an ephemeral one). SO_REUSEADDR, so a server can be restarted at once.
  bool listen(const std::string& bindHost, int port, std::string* error);
  int port() const { return port_; }
  // Waits for one connection; *peer is its address ("198.19.0.1:40112").
  bool accept(CtrlSocket* out, std::string* peer, CtrlClock::time_point deadline, std::string* error);

 private:
  int fd_ = -1;
  int port_ = 0;
};

// Connects to host:port, retrying a refused connection (the server not started yet) until
// the deadline, as the two sides of a test are started by hand in either order.
bool ctrlConnect(const std::string& host, int port, CtrlClock::time_point deadline, CtrlSocket* out,
                 std::string* error);

// "host", "host:port", "[v6addr]:port" → host and port (defaultPort when absent). False,
// with a message, on an empty host or a port outside 1..65535.
bool parseHostPort(const std::string& text, int defaultPort, std::string* host, int* port,
                   std::string* error);

}  // namespace mesh
