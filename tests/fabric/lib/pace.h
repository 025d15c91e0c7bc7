// SPDX-License-Identifier: Apache-2.0
// Link rates: a cable with a rate of its own, so that bandwidth figures on the fabric measure
// the ports, functions and relays a program chooses, not this machine's memcpy.
//
// Owns: what a port may put on its wire per second, per direction (full duplex), and the
// one-way delay of its cable. A NIC serializes at the sender, so the rate is enforced where
// a packet is written into the peer's ring, per segment, counting the RoCE v2 bytes every
// path-MTU packet of it occupies on Ethernet (kRoceWireOverhead), so that the goodput
// ceiling is what a real link gives: rate x MTU / (MTU + 82).
//
// Two caps apply to every packet: the port's own (a PCIe function: `fn-rate`) and the wire's
// (`rate`), which several ports may share (both functions of a DGX Spark cable end). Each cap
// is a token bucket whose state, the virtual time at which the cap is free again, lives in
// shared memory (<fabric dir>/pace/<id>), so every process sending on a port or a wire
// draws from one bucket, as they would share one NIC. A bucket lets a sender that came back
// late (it was descheduled, or slept until the cap freed) catch up for at most `burst`
// nanoseconds: the long-run rate is the cap, and a late wake-up does not lower it.
//
// Configuration: <fabric dir>/rates (MESHFAB_RATES overrides the path), written by
// scripts/fabric-net, one line per port, keyed by its MAC (the device key):
//   <mac hex> fn=<bytes/s> wire=<id> wire_rate=<bytes/s> delay_ns=<ns>
// A port without a line, or a rate of 0, is not capped: the fabric then behaves as before.
//
// Inbound caps (a switch): on a cable every port has one peer, so capping senders caps what
// each port receives too. Behind a switch several nodes send to one port at once, and what
// reaches it is held to the switch's port towards it: its cable's rate, and the receiving
// function's. Lines keyed by the destination's IPv4 address give those caps:
//   in <a.b.c.d> fn=<bytes/s> wire=<id> wire_rate=<bytes/s>
// (stored under the key "in-a.b.c.d"). A sender to that address draws from these buckets as
// well as from its own port's, so together the senders get no more than the destination's
// cable. Once its own caps are free it charges them (the packet has left its port) and
// reserves the packet's slot at the destination (Pacer::reserve); the packet goes when the
// slot comes, whatever its port sends meanwhile: it waits in the switch port's queue, and
// the senders' packets take turns in the order they asked, however late each sender's thread
// wakes up. (Checking the shared bucket and charging it only when free gave the slot to
// whichever sender looked first: one of two senders got 13 MB/s of 185. Waiting for its own
// port again at the slot lost the slot: a switch all-to-all at 0.85 of its bound, 0.95 now.)
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <string>

namespace meshfab {

// Bytes of a RoCE v2 packet on Ethernet besides its payload: preamble + SFD 8, MAC header 14,
// IPv4 20, UDP 8, BTH 12, ICRC 4, FCS 4, inter-frame gap 12.
constexpr uint64_t kRoceWireOverhead = 8 + 14 + 20 + 8 + 12 + 4 + 4 + 12;
static_assert(kRoceWireOverhead == 82, "RoCE v2 per-packet overhead on Ethernet");
constexpr uint64_t kRethBytes = 16;  // RDMA extended transport header: first packet of a WRITE/READ
constexpr uint64_t kImmBytes = 4;    // immediate data: last packet of a message WITH_IMM
constexpr uint64_t kAethBytes = 4;   // ACK extended transport header: ACK, NAK, READ response

// Wire bytes of `packets` path-MTU packets carrying `payload` bytes and `extra` header bytes.
inline uint64_t wireBytes(uint64_t payload, uint64_t packets, uint64_t extra) {
  return payload + packets * kRoceWireOverhead + extra;
}

struct PaceConfig {
  double fnRate = 0;    // bytes/s this port may send; 0 = no cap of its own
  double wireRate = 0;  // bytes/s of the wire it shares; 0 = none
  std::string wire;     // the wire's id (ports with one id share its cap)
  int64_t delayNs = 0;  // one-way delay of the cable
  bool capped() const { return fnRate > 0 || wireRate > 0; }
  bool any() const { return capped() || delayNs > 0; }
};

// Parses the rates file: key (MAC hex) -> config. Malformed lines are skipped and named in
// *errors (one line each), never fatal.
std::map<std::string, PaceConfig> parseRates(const std::string& text, std::string* errors);

// One bucket's shared state. `next` is the CLOCK_MONOTONIC nanosecond at which the cap is free.
struct BucketPage {
  uint32_t magic;
  uint32_t version;
  alignas(64) std::atomic<int64_t> next;
  std::atomic<uint64_t> wireBytes;  // everything charged (diagnostics)
};

class Bucket {
 public:
  Bucket() = default;
  Bucket(const Bucket&) = delete;
  Bucket& operator=(const Bucket&) = delete;
  ~Bucket();
  // Maps <dir>/pace/<id> (created zeroed by the first process). False with *why on failure.
  bool open(const std::string& dir, const std::string& id, double rate, std::string* why);
  bool active() const { return page_ != nullptr && nsPerByte_ > 0; }
  // When a packet may leave: max(next, now - burst).
  int64_t readyAt(int64_t now, int64_t burst) const;
  // Takes `bytes` of the cap, next = max(next, now - burst) + bytes / rate, and returns when
  // the bytes' turn starts: max(next, now - burst) before the charge.
  int64_t reserve(uint64_t bytes, int64_t now, int64_t burst);

 private:
  BucketPage* page_ = nullptr;
  double nsPerByte_ = 0;
};

// The caps of one port.
class Pacer {
 public:
  // Opens the port's buckets for `cfg`; false (and *why) when a bucket cannot be mapped:
  // the port then runs uncapped.
  bool configure(const std::string& dir, const std::string& key, const PaceConfig& cfg, int64_t burstNs,
                 std::string* why);
  bool capped() const { return fn_.active() || wire_.active(); }
  int64_t delayNs() const { return cfg_.delayNs; }
  const PaceConfig& config() const { return cfg_; }
  // A packet of `bytes` on the wire: true when it may leave now (and is charged); otherwise
  // false and *retryAt is when to try again. With `inbound` (the destination's caps: a
  // switch's port towards it), once this port's caps are free they are charged and the packet
  // takes a slot there, kept in *slot (0: none) until it comes; the sender keeps *slot per
  // packet.
  bool tryTransmit(uint64_t bytes, int64_t now, int64_t* retryAt, Pacer* inbound = nullptr,
                   int64_t* slot = nullptr);
  // Charges without waiting (ACKs and NAKs: small, and never held behind data).
  void chargeAnyway(uint64_t bytes, int64_t now);
  // Takes `bytes` of both caps and returns when the later of their turns starts.
  int64_t reserve(uint64_t bytes, int64_t now);
  // When both caps are free (now - burst at the earliest).
  int64_t readyAt(int64_t now) const;

 private:
  PaceConfig cfg_;
  Bucket fn_, wire_;
  int64_t burstNs_ = 0;
};

// The rates file's key for the inbound caps of IPv4 address `addr` (host order).
std::string inboundKey(uint32_t addr);

// CLOCK_MONOTONIC in nanoseconds (the clock of every bucket and of Packet::arriveNs).
int64_t monoNs();

}  // namespace meshfab
