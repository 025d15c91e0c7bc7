// SPDX-License-Identifier: Apache-2.0
// The node_exporter textfile-collector format (Prometheus text exposition format 0.0.4) for
// the live counters: nccl-mesh-info --prometheus FILE writes it atomically every interval.
#pragma once

#include <string>
#include <vector>

#include "mesh/stats/nic_counters.h"
#include "mesh/stats/stats.h"

namespace mesh {
namespace stats {

// Extra labels a link row gets from the reader's view of this node (the cable it belongs
// to, the PCIe function within it); empty values are left out.
struct LinkLabels {
  std::string cable;     // "0", "1", ... (nccl-mesh-info's cable numbers)
  std::string function;  // the netdev, e.g. enp1s0f1np1
};

// The whole exposition text: each metric family that has samples as one # HELP and one
// # TYPE line, then its samples (no timestamps: the textfile collector refuses them);
// nccl_mesh_processes and nccl_mesh_events_total (every event, 0 included) are always
// there. Names match [a-zA-Z_:][a-zA-Z0-9_:]*, counters end in _total, label values are
// escaped (\\, \", \n). `linkLabels` is parallel to totals.links (may be shorter: missing
// rows get no extras). No two samples share a name and labels as long as totals holds
// each key once (merge() and deltas() do). NIC families: ports with haveData only.
//   nccl_mesh_processes                          gauge    processes publishing counters
//   nccl_mesh_link_bytes_total{device,port,local,peer,cable,function,direction}  counter
//   nccl_mesh_link_work_requests_total{device,port,local,peer}                   counter
//   nccl_mesh_link_errors_total{device,port,local,peer}                          counter
//   nccl_mesh_flow_bytes_total{kind,peer,via,origin,direction}                   counter
//   nccl_mesh_flow_connections{kind,peer,via,origin}    gauge    open comms (opened - closed)
//   nccl_mesh_flow_errors_total{kind,peer,via,origin}                            counter
//   nccl_mesh_events_total{event}                                                counter
//   nccl_mesh_nic_bytes_total{device,port,direction}    counter  sysfs port data counters
//   nccl_mesh_nic_packets_total{device,port,direction}  counter
//   nccl_mesh_nic_hw_counter_total{device,port,counter}  counter  sysfs hw_counters
// Addresses are dotted quads; a flow's via/origin is "" when it has none.
std::string prometheusText(const Totals& totals, const std::vector<LinkLabels>& linkLabels,
                           const std::vector<NicPortCounters>& nics);

// Writes `text` to `path` atomically: a temporary file in the same directory (hidden,
// ".NAME.XXXXXX", so a *.prom glob skips it), written whole, fsync'd, made 0644, renamed
// over `path`. False with *why naming the step and errno's text; the temporary file is
// removed then.
bool writeFileAtomic(const std::string& path, const std::string& text, std::string* why);

}  // namespace stats
}  // namespace mesh
