// SPDX-License-Identifier: Apache-2.0
// What crosses between processes on the fabric: the shared-memory rings, the status page
// every process shares with its peers, the packet header, and the handshake on the Unix
// socket that hands the ring over. Every layout is pinned by static_assert; both ends are
// the same build, but a stale process from another build must be refused (magic+version).
//
// One connection joins a requester process to a responder process: the requester created
// it (connect() to the responder's endpoint socket in the fabric directory) and owns a
// memfd holding two rings:
//   request ring   requester writes, responder reads: WRITE, SEND, READ requests
//   response ring  responder writes, requester reads: ACK, NAK, READ responses
// A process that both sends to and receives from another has two connections with it.
// Ring bytes are a stream of packets: a Packet header, then `len` payload bytes for the
// kinds that carry data (Write, Send, ReadResp). Nothing is padded; a packet may wrap.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace meshfab {

constexpr uint32_t kWireMagic = 0x4d464142;  // "MFAB"
constexpr uint32_t kWireVersion = 2;  // 2: Packet::arriveNs (link delay)

// Shared by the writer and the reader of one ring. `head` is written only by the writer
// (after the bytes), `tail` only by the reader (after it copied them out). `writerWaiting`
// is set by a writer that found the ring full before it sleeps; the reader clears it and
// rings the writer's doorbell after freeing space. Each side stores, then reads the other's
// state, both seq_cst (a Dekker pair: one of them sees the other).
struct RingCtl {
  uint32_t magic;
  uint32_t version;
  uint64_t size;  // data bytes (a power of two); the data starts at kRingDataOffset
  alignas(64) std::atomic<uint64_t> head;
  alignas(64) std::atomic<uint64_t> tail;
  alignas(64) std::atomic<uint32_t> writerWaiting;
};
constexpr size_t kRingDataOffset = 4096;
static_assert(sizeof(RingCtl) <= kRingDataOffset, "ring control must fit its page");
static_assert(std::atomic<uint64_t>::is_always_lock_free, "rings need lock-free 64-bit atomics");

// One page per process, mapped by every peer. `sleeping` is set by the owner's NIC thread
// just before it blocks in epoll_wait (and cleared when it wakes): a peer that published
// bytes for it, or freed space it waits for, writes its doorbell eventfd only then
// (seq_cst, the same Dekker pair with the ring's head/tail).
struct ProcStatus {
  uint32_t magic;
  uint32_t version;
  int32_t pid;
  uint32_t reserved;
  alignas(64) std::atomic<uint32_t> sleeping;
};
static_assert(sizeof(ProcStatus) <= 4096, "status must fit one page");

enum class PktOp : uint8_t {
  Write = 1,     // requester -> responder, payload follows; Imm flag: WRITE_WITH_IMM
  Send = 2,      // requester -> responder, payload follows; Imm flag: SEND_WITH_IMM
  ReadReq = 3,   // requester -> responder, no payload; len = bytes to read
  Ack = 4,       // responder -> requester: every request up to and including psn executed
  Nak = 5,       // responder -> requester: the request at psn failed (see NakCode)
  ReadResp = 6,  // responder -> requester: the data of the READ at psn follows
};

enum class NakCode : uint8_t {
  None = 0,
  Rnr = 1,         // receiver not ready: no receive posted for a SEND / WRITE_WITH_IMM
  Sequence = 2,    // PSN ahead of the expected one; psn carries the expected PSN
  Access = 3,      // remote access error: rkey, range, access flags, PD
  InvalidReq = 4,  // remote invalid request: e.g. a SEND longer than the receive buffers
  RemoteOp = 5,    // remote operational error: the responder could not place the data
};

enum PktFlags : uint8_t {
  kPktImm = 1,        // the message carries an immediate (valid in its last packet)
  kPktSolicited = 2,  // solicited event requested
  kPktFirst = 4,      // first packet of a message
  kPktLast = 8,       // last packet of a message (a one-packet message has both)
};

// 96 bytes, naturally aligned fields; sgid/dgid as in the GRH of a RoCE v2 packet.
struct Packet {
  PktOp op;
  uint8_t flags;     // PktFlags
  NakCode nak;       // Nak only
  uint8_t rnrTimer;  // Nak/Rnr: the responder's min_rnr_timer code
  uint32_t destQpn;
  uint32_t srcQpn;
  uint32_t psn;   // requests: first PSN; Ack: last PSN executed; Nak: the PSN it refers to
  uint32_t npsn;  // requests: PSNs the message occupies (one per path-MTU packet)
  uint32_t imm;   // as given in the WR (network order)
  uint32_t rkey;
  uint32_t reserved;
  uint64_t raddr;
  uint64_t len;  // payload bytes that follow (Write, Send, ReadResp) or bytes asked (ReadReq)
  uint8_t sgid[16];
  uint8_t dgid[16];
  // When the packet reaches the far end of its cable (CLOCK_MONOTONIC ns, the clock every
  // process on the host shares): the reader leaves it in the ring until then. 0 = at once
  // (a cable without a delay; see pace.h).
  int64_t arriveNs;
  uint64_t reserved2;
};
static_assert(sizeof(Packet) == 96, "packet header is 96 bytes");
static_assert(offsetof(Packet, raddr) == 32 && offsetof(Packet, sgid) == 48 &&
                  offsetof(Packet, dgid) == 64,
              "packet header layout");
static_assert(offsetof(Packet, arriveNs) == 80, "packet header layout");

// The first (and only) messages on a connection's Unix socket. HELLO carries three fds
// (SCM_RIGHTS): the rings' memfd, the requester's status memfd, its doorbell eventfd.
// HELLO_ACK carries the responder's status memfd and doorbell. After that the socket
// carries nothing: it stays open so that each side sees the other's death as EOF.
struct Hello {
  uint32_t magic;
  uint32_t version;
  uint32_t kind;  // kHello or kHelloAck
  int32_t pid;
  uint64_t reqRingSize;
  uint64_t respRingSize;
  char endpoint[64];  // the sender's endpoint name (diagnostics)
};
constexpr uint32_t kHello = 1;
constexpr uint32_t kHelloAck = 2;
static_assert(sizeof(Hello) == 96, "hello layout");

}  // namespace meshfab
