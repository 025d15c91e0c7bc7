// SPDX-License-Identifier: Apache-2.0
// The RDMA NIC's own counters from sysfs (issue 34): what the kernel counts on every port,
// NCCL's traffic or not. Read under a root prefix (as the doctor's --root) so tests use a
// fake tree.
//
//   ROOT/sys/class/infiniband/DEV/ports/N/counters/port_xmit_data, port_rcv_data
//       (the InfiniBand convention: units of 4 bytes), port_xmit_packets, port_rcv_packets
//   ROOT/sys/class/infiniband/DEV/ports/N/hw_counters/*  (driver counters: for mlx5 RoCE the
//       retransmission and sequence errors, out_of_sequence, packet_seq_err,
//       local_ack_timeout_err, rnr_nak_retry_err, roce_adp_retrans, and the congestion
//       counters np_cnp_sent, rp_cnp_handled, np_ecn_marked_roce_packets ...)
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace mesh {
namespace stats {

struct NicPortCounters {
  std::string device;
  int port = 0;
  // counters/port_{xmit,rcv}_{data,packets} were all four read; false: the four below are 0.
  bool haveData = false;
  uint64_t txBytes = 0, rxBytes = 0;  // port_xmit_data * 4, port_rcv_data * 4
  uint64_t txPackets = 0, rxPackets = 0;
  // hw_counters/*, sorted by name; the ones that could not be read are left out (a warning),
  // and so is hw_counters/lifespan, a setting (the driver's cache time), not a counter.
  std::vector<std::pair<std::string, uint64_t>> hw;
};

// The hw_counters the --watch table shows (retransmissions, sequence errors, congestion),
// in its column order; every other one appears in --json and --prometheus only.
const std::vector<std::string>& watchedHwCounters();

// Every port of every device under ROOT/sys/class/infiniband (ROOT "" or "/": the real
// one), devices by name, ports in numeric order. A counter file that exists but cannot be
// read or parsed (mlx5 answers some reads with EIO or EINVAL) adds a line to *warnings
// naming the file and why; a missing file is no warning. A port without counters/ is
// still listed (haveData false). No /sys/class/infiniband at all: an empty list and no
// warning. Never throws on what it finds.
std::vector<NicPortCounters> readNicCounters(const std::string& root, std::vector<std::string>* warnings);

// The hw_counters value named `name` in `p`; 0 when `p` has none by that name.
uint64_t hwValue(const NicPortCounters& p, const std::string& name);

}  // namespace stats
}  // namespace mesh
