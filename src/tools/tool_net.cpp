// SPDX-License-Identifier: Apache-2.0
#include "mesh/tools/tool_net.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace mesh {

namespace {

// Milliseconds left until the deadline, for poll(); 0 once it has passed.
int msLeft(CtrlClock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - CtrlClock::now());
  return left.count() > 0 ? static_cast<int>(std::min<long long>(left.count(), 1 << 30)) : 0;
}

// Waits until fd is ready for `events`; false with a message on timeout or error.
bool waitFor(int fd, short events, CtrlClock::time_point deadline, const char* what, std::string* error) {
  for (;;) {
    pollfd p{fd, events, 0};
    int n = poll(&p, 1, msLeft(deadline));
    if (n > 0) return true;
    // msLeft caps one poll at 2^30 ms (12.4 days): a longer wait (--serve) polls again.
    if (n == 0 && CtrlClock::now() < deadline) continue;
    if (n == 0) {
      *error = std::string("timed out ") + what;
      return false;
    }
    if (errno != EINTR) {
      *error = std::string("poll failed ") + what + ": " + strerror(errno);
      return false;
    }
  }
}

std::string addrText(const sockaddr* sa) {
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (sa->sa_family == AF_INET) {
    auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    port = ntohs(in->sin_port);
  } else if (sa->sa_family == AF_INET6) {
    auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
    inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
    port = ntohs(in6->sin6_port);
    if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) {
      inet_ntop(AF_INET, &in6->sin6_addr.s6_addr[12], host, sizeof(host));
    }
  }
  return std::string(host) + ":" + std::to_string(port);
}

bool sendAll(int fd, const char* p, size_t n, CtrlClock::time_point deadline, std::string* error) {
  while (n > 0) {
    if (!waitFor(fd, POLLOUT, deadline, "sending to the peer", error)) return false;
    ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (w <= 0) {
      *error = std::string("send failed: ") + strerror(errno);
      return false;
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool recvAll(int fd, char* p, size_t n, CtrlClock::time_point deadline, std::string* error) {
  while (n > 0) {
    if (!waitFor(fd, POLLIN, deadline, "waiting for the peer", error)) return false;
    ssize_t r = ::recv(fd, p, n, MSG_DONTWAIT);
    if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (r == 0) {
      *error = "the peer closed the connection";
      return false;
    }
    if (r < 0) {
      *error = std::string("recv failed: ") + strerror(errno);
      return false;
    }
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

}  // namespace

CtrlSocket::~CtrlSocket() {
  if (fd_ >= 0) ::close(fd_);
}

CtrlSocket& CtrlSocket::operator=(CtrlSocket&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

bool CtrlSocket::send(const std::string& msg, CtrlClock::time_point deadline, std::string* error) {
  if (msg.size() > kCtrlMaxMessage) {
    *error = "message of " + std::to_string(msg.size()) + " bytes is too long";
    return false;
  }
  uint32_t len = htonl(static_cast<uint32_t>(msg.size()));
  return sendAll(fd_, reinterpret_cast<const char*>(&len), sizeof(len), deadline, error) &&
         sendAll(fd_, msg.data(), msg.size(), deadline, error);
}

bool CtrlSocket::recv(std::string* msg, CtrlClock::time_point deadline, std::string* error) {
  uint32_t len = 0;
  if (!recvAll(fd_, reinterpret_cast<char*>(&len), sizeof(len), deadline, error)) return false;
  len = ntohl(len);
  if (len > kCtrlMaxMessage) {
    *error = "the peer announced a " + std::to_string(len) + "-byte message (not this protocol?)";
    return false;
  }
  msg->assign(len, '\0');
  return recvAll(fd_, &(*msg)[0], len, deadline, error);
}

CtrlListener::~CtrlListener() {
  if (fd_ >= 0) ::close(fd_);
}

bool CtrlListener::listen(const std::string& bindHost, int port, std::string* error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  std::string service = std::to_string(port);
  int rc = getaddrinfo(bindHost.empty() ? nullptr : bindHost.c_str(), service.c_str(), &hints, &res);
  if (rc != 0) {
    *error = "cannot resolve '" + bindHost + "': " + gai_strerror(rc);
    return false;
  }
  // Prefer IPv6 for a wildcard bind (it takes IPv4 too unless the host forbids it).
  std::string lastError = "no address to bind";
  for (int pass = 0; pass < 2 && fd_ < 0; ++pass) {
    for (addrinfo* ai = res; ai != nullptr && fd_ < 0; ai = ai->ai_next) {
      if ((pass == 0) != (ai->ai_family == AF_INET6)) continue;
      int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
      if (fd < 0) continue;
      int one = 1, zero = 0;
      setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
      if (ai->ai_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
      if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && ::listen(fd, 8) == 0) {
        fd_ = fd;
      } else {
        lastError = "cannot listen on " + addrText(ai->ai_addr) + ": " + strerror(errno);
        ::close(fd);
      }
    }
  }
  freeaddrinfo(res);
  if (fd_ < 0) {
    *error = lastError;
    return false;
  }
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  getsockname(fd_, reinterpret_cast<sockaddr*>(&ss), &len);
  port_ = ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                   : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  return true;
}

bool CtrlListener::accept(CtrlSocket* out, std::string* peer, CtrlClock::time_point deadline,
                          std::string* error) {
  if (!waitFor(fd_, POLLIN, deadline, "waiting for a client to connect", error)) return false;
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  int fd = ::accept4(fd_, reinterpret_cast<sockaddr*>(&ss), &len, SOCK_CLOEXEC);
  if (fd < 0) {
    *error = std::string("accept failed: ") + strerror(errno);
    return false;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  *out = CtrlSocket(fd);
  if (peer) *peer = addrText(reinterpret_cast<sockaddr*>(&ss));
  return true;
}

bool ctrlConnect(const std::string& host, int port, CtrlClock::time_point deadline, CtrlSocket* out,
                 std::string* error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  std::string service = std::to_string(port);
  std::string target = host + ":" + service;
  for (;;) {
    addrinfo* res = nullptr;
    int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &res);
    if (rc != 0) {
      *error = "cannot resolve '" + host + "': " + gai_strerror(rc);
      return false;
    }
    bool refused = false;
    std::string lastError;
    for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
      int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
      if (fd < 0) continue;
      int r = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
      int err = r == 0 ? 0 : errno;
      if (err == EINPROGRESS && waitFor(fd, POLLOUT, deadline, ("connecting to " + target).c_str(), &lastError)) {
        socklen_t len = sizeof(err);
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      } else if (err == EINPROGRESS) {
        ::close(fd);
        continue;
      }
      if (err == 0) {
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        freeaddrinfo(res);
        *out = CtrlSocket(fd);
        return true;
      }
      refused = refused || err == ECONNREFUSED;
      lastError = "cannot connect to " + addrText(ai->ai_addr) + ": " + strerror(err);
      ::close(fd);
    }
    freeaddrinfo(res);
    if (!refused || CtrlClock::now() >= deadline) {
      *error = lastError.empty() ? "cannot connect to " + target : lastError;
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the server is not up yet
  }
}

bool parseHostPort(const std::string& text, int defaultPort, std::string* host, int* port,
                   std::string* error) {
  std::string portText;
  bool hasPort = false;
  if (!text.empty() && text[0] == '[') {  // [v6addr] or [v6addr]:port
    size_t close = text.find(']');
    if (close == std::string::npos || (close + 1 < text.size() && text[close + 1] != ':')) {
      *error = "'" + text + "': expected [ADDRESS] or [ADDRESS]:PORT";
      return false;
    }
    *host = text.substr(1, close - 1);
    hasPort = close + 1 < text.size();
    if (hasPort) portText = text.substr(close + 2);
  } else {
    size_t colon = text.find(':');
    hasPort = colon != std::string::npos && text.find(':', colon + 1) == std::string::npos;
    *host = hasPort ? text.substr(0, colon) : text;  // several colons: a bare IPv6 address
    if (hasPort) portText = text.substr(colon + 1);
  }
  if (host->empty()) {
    *error = "'" + text + "': no host";
    return false;
  }
  *port = defaultPort;
  if (hasPort) {
    char* end = nullptr;
    long v = strtol(portText.c_str(), &end, 10);
    if (portText.empty() || *end != '\0' || v < 1 || v > 65535) {
      *error = "'" + text + "': the port must be a number 1..65535";
      return false;
    }
    *port = static_cast<int>(v);
  }
  return true;
}

}  // namespace mesh
