#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Runs on every fabric node: the speed the plugin reports for each port, and for the device
# NCCL gets (getProperties' speed), read as NCCL 2.30's IB transport reads a port:
# ibv_query_port_speed when it answers, else active_speed_ex, else active_speed (the drop-in's
# MESHFAB_PORT_SPEED, fabric.h). An XDR port read from active_speed alone would be 0 Mb/s,
# which NCCL's topology takes for 10 Gb/s.
# Usage: port_speed.sh PATH_TO_NCCL_MESH_INFO
set -u
info=$1
fails=0
check() {  # MESHFAB_PORT_SPEED value, expected Mb/s, what it stands for
  json=$(MESHFAB_PORT_SPEED=$1 "$info" --json 2>&1)
  speeds=$(echo "$json" | grep -o '"speed_mbps": [0-9-]*' | awk '{print $2}' | sort -u | tr '\n' ' ')
  if [ "$speeds" = "$2 " ]; then
    echo "ok rank $VMESH_RANK: $3: every port and device $2 Mb/s"
  else
    echo "FAIL rank $VMESH_RANK: $3 (MESHFAB_PORT_SPEED=$1): speeds '$speeds', expected $2: $(echo "$json" | head -c 600)"
    fails=$((fails + 1))
  fi
}
check "" 100000 "EDR 4X in active_speed (rdma-core < 49, no ibv_query_port_speed)"
check xdr 800000 "XDR 4X in active_speed_ex, active_speed 0 (rdma-core >= 49)"
check query:4000 400000 "ibv_query_port_speed answers 400 Gb/s (rdma-core >= 62)"
[ "$fails" -eq 0 ] && echo "PORT_SPEED ok rank $VMESH_RANK"
[ "$fails" -eq 0 ]
