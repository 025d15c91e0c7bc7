// SPDX-License-Identifier: Apache-2.0
// Handshake engine: listen comms, pending connects and pending accepts, all driven by the
// reactor thread. NCCL's thread calls listen/startConnect/pollConnect/pollAccept/close*,
// which only create sockets, post work and read published state — they never block.
//
// Ownership: Listener and Connector are shared between NCCL's thread and the reactor
// (shared_ptr). Fields are annotated with the thread that writes them; cross-thread state is
// atomic or guarded by Listener::mutex_.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "err.h"
#include "mesh/connect/reactor.h"
#include "mesh/connect/transport.h"
#include "mesh/wire/handle_codec.h"
#include "mesh/wire/handshake_proto.h"

namespace mesh {

struct HandshakeSettings {
  int timeoutMs = 30000;       // every step of a handshake must finish within this, but the wait for accept()
  bool listenAny = false;      // bind 0.0.0.0 instead of the mesh addresses
  int portMin = 0;             // 0: ephemeral ports
  int portMax = 0;
  size_t maxPending = 256;     // unauthenticated sockets per listener; the oldest is evicted beyond
  int peerTimeoutMs = 30000;   // keepalive on established connections; 0: off
  // How long a HELLO may wait for the listener's accept() while both ends are alive (TCP
  // keepalive, peerTimeoutMs, watches the wait); below timeoutMs counts as timeoutMs.
  int acceptWaitMs = 0;
};

// The wait for accept() that `s` allows: max(timeoutMs, acceptWaitMs).
std::chrono::milliseconds acceptWait(const HandshakeSettings& s);

// A TCP socket as the handshake uses them: non-blocking, close-on-exec, TCP_NODELAY (small
// request/reply messages). -1 with errno on failure.
int newTcpSocket();
// Closes a connected TCP socket so that the peer reads an end of stream, never a reset:
// close() with unread bytes in the receive buffer (a heartbeat that came in just before)
// makes the kernel send RST instead of FIN, and the peer's recv() fails with ECONNRESET,
// which the relay reads as a failed end (fail both ends) where a closed one (deliver what
// was sent, then end) was meant. So: FIN first (shutdown SHUT_WR), then read away what
// is queued, then close; a reset that still follows the FIN is not seen by the peer before
// its end of stream. Safe on any fd (a listener, or -1: errors are ignored).
void closeStream(int fd);

class Listener;
class Connector;
struct PendingAccept;

class Handshaker {
 public:
  Handshaker(Reactor* reactor, Transport* transport, HandshakeSettings settings);
  ~Handshaker();

  // Binds the listener sockets (non-blocking) and fills *handle. NCCL thread.
  ncclResult_t listen(std::shared_ptr<Listener>* out, Handle* handle);
  // Returns a finished connection, or nullptr while none is ready. NCCL thread. An error
  // once a connect meant for this listener failed here and none followed within two connect
  // timeouts, or its sockets could not take a connection for want of descriptors that long
  // (NCCL's IB transport fails accept() with its connection; without this NCCL's thread
  // would call accept() forever).
  ncclResult_t pollAccept(const std::shared_ptr<Listener>& listener,
                          std::unique_ptr<PreparedConn>* conn);
  void closeListener(std::shared_ptr<Listener> listener);

  // Starts connecting to a peer's handle over the routes chosen for it. NCCL thread.
  ncclResult_t startConnect(const Handle& handle, const std::vector<Route>& routes,
                            const ConnOptions& opts, std::shared_ptr<Connector>* out);
  // nullptr while pending; the connection when done; an error (with a logged reason) when
  // the handshake failed or ran out of time.
  ncclResult_t pollConnect(const std::shared_ptr<Connector>& connector, std::unique_ptr<PreparedConn>* conn);
  // NCCL will not poll this connect again (it reused the handle for another, or the plugin
  // shuts down): its socket is closed and its comm, half-built or finished and never
  // claimed, released. Any thread; runs inline when the reactor has stopped.
  void discardConnect(std::shared_ptr<Connector> connector);

  // Closes a finished connection's control socket (any thread).
  void closeControl(const std::shared_ptr<ControlLink>& control);

  // Reactor-thread internals (public for the file-local helpers in handshake.cpp).
  Reactor* reactor() const { return reactor_; }
  Transport* transport() const { return transport_; }
  const HandshakeSettings& settings() const { return settings_; }
  // A finished handshake's socket becomes the connection's control link: watched for the
  // peer closing it, owned by conn->control (*fd is taken, set to -1).
  void adoptControl(int* fd, PreparedConn* conn, const std::string& peer);
  // accept4 on a listening socket failed for want of a descriptor or memory (EMFILE, ENFILE,
  // ENOBUFS, ENOMEM): the socket stops being watched for 100 ms, so that the reactor does not
  // spin on a connection it cannot take, and the process WARNs once. Counted for tests.
  void pauseListening(const std::shared_ptr<Listener>& l, int lfd, int err);
  uint64_t acceptShortages() const { return acceptShortages_.load(std::memory_order_acquire); }

 private:
  Reactor* reactor_;
  Transport* transport_;
  HandshakeSettings settings_;
  // Addresses a listen could not bind (gone from their netdev), each WARNed once.
  std::mutex unboundMutex_;
  std::vector<uint32_t> unboundWarned_;
  std::atomic<uint64_t> acceptShortages_{0};
  bool shortageWarned_ = false;  // reactor thread only
};

}  // namespace mesh
