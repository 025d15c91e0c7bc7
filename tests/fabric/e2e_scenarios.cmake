# SPDX-License-Identifier: Apache-2.0
# tests/e2e's scenarios on the userspace fabric: the one list both the fabric tier
# (tests/fabric/CMakeLists.txt) and the arm64 tier (arm64.cmake) register, each through its
# own fabric_scenario(NAME NODES DEADLINE FABRIC_NET_ARGS... -- SCENARIO_ARGS...) macro.
fabric_scenario(connect_mesh 3 60 -- connect-mesh)
fabric_scenario(ring_diagonal 4 60 --topology ring -- ring-diagonal)
fabric_scenario(cycles 2 120 -- cycles --count 200)
foreach(mode never-accept listener-dies peer-killed idle exits)
  string(REPLACE "-" "_" mode_name ${mode})
  fabric_scenario(dead_peer_${mode_name} 2 60 --env NCCL_MESH_CONNECT_TIMEOUT_MS=5000 --env NCCL_MESH_ACCEPT_WAIT_MS=8000
                  -- dead-peer --mode ${mode})
endforeach()
# A rank whose accept comes 1.5 connect timeouts after the connect (its NCCL was exchanging
# handles with a slower rank) still gets its connection, as with NCCL's IB transport.
fabric_scenario(late_accept 2 60 --env NCCL_MESH_CONNECT_TIMEOUT_MS=2000 -- late-accept)
# ... and a peer whose cable goes down while the connect waits for its accept fails the connect
# through TCP keepalive (NCCL_MESH_PEER_TIMEOUT_MS), not at the end of the wait.
fabric_scenario(late_accept_cut 2 60 --env NCCL_MESH_CONNECT_TIMEOUT_MS=2000 --env NCCL_MESH_PEER_TIMEOUT_MS=3000
                --env NCCL_MESH_ACCEPT_WAIT_MS=120000 -- late-accept --cut)
# mid-send: the 64 MiB send must still be on the wire when rank 1 dies. Unrated, the fabric
# moved it in under 0.5 s under qemu-user (arm64) before the victim got to its SIGKILL; at
# 4 MB/s it needs 16 s, far longer than the victim takes to die and the sender to see it.
fabric_scenario(dead_peer_mid_send 2 60 --rate 4M --env NCCL_MESH_CONNECT_TIMEOUT_MS=5000 -- dead-peer --mode mid-send)
fabric_scenario(pair 2 60 -- pair)
fabric_scenario(pair_v9 2 60 -- pair --api v9)
fabric_scenario(pair_v10 2 60 -- pair --api v10 --traffic-class 96)
fabric_scenario(pair_v11 2 60 -- pair --api v11)
fabric_scenario(chunked_v11 2 60 --env NCCL_MESH_CHUNK_SIZE=64K -- pair --api v11 --big 4194305 --iters 1)
fabric_scenario(pair_flush 2 60 --env NCCL_MESH_FORCE_FLUSH=1 -- pair)
fabric_scenario(allreduce_3 3 60 -- allreduce --pairs 4)
fabric_scenario(allreduce_ring4 4 60 --topology ring -- allreduce --pairs 4)
fabric_scenario(links 2 60 --links 2 -- links)
# Both PCIe functions of every cable end (a DGX Spark port), both addressings: every function
# carries an equal share at both ends.
foreach(subnets shared split)
  fabric_scenario(functions_pair_${subnets} 2 60 --functions 2 --fn-subnets ${subnets} -- functions)
  fabric_scenario(functions_tri_${subnets} 3 60 --functions 2 --fn-subnets ${subnets} -- functions)
  # A relayed pair: every function of both legs (issue 31).
  # Rated as a Spark cable (each function 0.56 of the wire): relayed pieces go to the least busy
  # QP (Comm::pickRelayQp), so on unrated links the shares follow the fabric's own scheduling.
  fabric_scenario(functions_relay_ring4_${subnets} 4 90 --topology ring --functions 2 --fn-subnets ${subnets}
                  --rate 40M --fn-rate 22400K --env NCCL_MESH_RELAY=auto -- functions --relayed)
endforeach()
# NCCL_MESH_QPS_PER_CONN 9..16 on Spark cables: two functions x 9 QPs exceed a comm's 16, so
# the connector offers one function's link and the acceptor answers for it; that ACCEPT used
# to be refused (checked against both links), so every connect failed. Direct and relayed.
fabric_scenario(pair_spark_qps9 2 60 --functions 2 --env NCCL_MESH_QPS_PER_CONN=9 -- pair)
fabric_scenario(relay_ring4_spark_qps9 4 180 --topology ring --functions 2 --env NCCL_MESH_RELAY=auto
                --env NCCL_MESH_QPS_PER_CONN=9 -- relay)
# Registration where the connection runs (issue 32): a triangle of Spark cables, 4 devices per
# node; a comm's registrations cover the 2 towards its peer.
fabric_scenario(registrations_tri_spark 3 60 --functions 2 -- registrations --sizes 256K,4M --count 3)
fabric_scenario(close_inflight 2 60 -- close-inflight)
# The receiver closes as soon as its receive is done; 5 ms cables deliver the sender's last ACK
# well after the close's FIN: the send must still complete (Comm::test's 200 ms grace).
fabric_scenario(close_after_receive 2 60 --delay 5ms -- close-after-receive --rounds 10)
fabric_scenario(demo_3 3 60 -- demo)
# The fabric has no spurious retransmissions (the lab keeps the default timeout 20, see
# tests/e2e/CMakeLists.txt): the cut side fails in 8 x 67 ms, the far side by keepalive.
fabric_scenario(link_down 3 60 --env NCCL_MESH_PEER_TIMEOUT_MS=5000 --env NCCL_MESH_IB_TIMEOUT=14 -- link-down)
fabric_scenario(reload 2 60 -- reload --rounds 3)
fabric_scenario(bad_input 2 60 --env NCCL_MESH_CONNECT_TIMEOUT_MS=5000 -- bad-input)
fabric_scenario(memlock 2 60 -- memlock)
# NCCL's proxy contract (issue 12): tags out of slot order, truncation, 256 outstanding,
# abandoned connects with dlclose, a fork mid-traffic.
fabric_scenario(contract_v8 2 60 -- contract)
fabric_scenario(contract_v11 2 60 -- contract --api v11 --traffic-class 96)
# NCCL_IB_FIFO_TC's counterpart: every receive line says 184, every send line the comm's 96.
fabric_scenario(contract_fifo_tc 2 60 --env NCCL_MESH_IB_FIFO_TC=184 -- contract --api v11 --traffic-class 96)
# ECE as NCCL IB negotiates it, on a fabric that answers as mlx5 (MESHFAB_ECE): both ends' lines
# show the options they settled on; NCCL_MESH_IB_ECE_ENABLE=0 or a provider without ECE: none.
fabric_scenario(contract_ece 2 60 --env MESHFAB_ECE=15b3:30000003 --env MESH_E2E_EXPECT_ECE=0x15b3:0x30000003 -- contract)
fabric_scenario(contract_ece_off 2 60 --env NCCL_MESH_IB_ECE_ENABLE=0 --env MESH_E2E_EXPECT_ECE=none -- contract)
fabric_scenario(contract_ece_unsupported 2 60 --env MESHFAB_ECE=off --env MESH_E2E_EXPECT_ECE=none -- contract)
fabric_scenario(abort_reload 2 120 -- abort-reload --api v11 --cycles 20)
fabric_scenario(fork 2 60 -- fork)
# Beyond the lab's 4 nodes: 8 ranks, 4 comm pairs per neighbour.
fabric_scenario(allreduce_mesh8 8 120 -- allreduce --pairs 4)
fabric_scenario(allreduce_ring8 8 120 --topology ring -- allreduce --pairs 4)
fabric_scenario(connect_mesh8 8 120 -- connect-mesh --comms 4)
# Issue 15's acceptance: every ordered pair, cabled or not, byte-exact through the ABI (v8 and
# v11). On a full mesh every pair is direct, so these pass without the relay.
fabric_scenario(relay_full3 3 120 -- relay --big 8M)
fabric_scenario(relay_full3_v11 3 120 -- relay --api v11 --big 8M)
# Through the relay (issue 15): a 4-ring (distance-2 pairs through one relay), a 4-line (0-3
# through two relays) and an 8-ring (distance 4: three relays, so NCCL_MESH_RELAY_MAX_HOPS=3).
# --big is more than a relay's staging ring holds (32 x 128 KiB): 64 MiB, 16 MiB on the 8-ring
# to keep the tier's time down on 2 cores.
fabric_scenario(relay_ring4 4 180 --topology ring --env NCCL_MESH_RELAY=auto -- relay)
fabric_scenario(relay_ring4_v11 4 180 --topology ring --env NCCL_MESH_RELAY=auto -- relay --api v11)
fabric_scenario(relay_line4 4 180 --topology line --env NCCL_MESH_RELAY=auto -- relay)
# NCCL's ring on a line of cables: the wrap edge 3 -> 0 goes through two relays.
fabric_scenario(allreduce_line4_relay 4 60 --topology line --env NCCL_MESH_RELAY=auto -- allreduce --pairs 4)
# NCCL's other patterns as collectives (issue 15): the double binary tree's all-reduce (on 4
# ranks both diagonals of the ring), PAT's +-1/+-2 reduce-scatter + all-gather and a 4-way
# all-to-all, exact; on the 4-line 0 <-> 3 goes through two relays. --ring-first: NCCL's ring
# connects first, and the relayed connects must use the cable direction it leaves idle.
fabric_scenario(patterns_full4 4 120 -- patterns)
fabric_scenario(patterns_ring4 4 180 --topology ring --env NCCL_MESH_RELAY=auto -- patterns --ring-first)
# The 4-line also pins NCCL_MESH_PORT_RANGE: every listener, the relays' leg listeners of a
# two-relay path included, in the range (or on the relay port).
fabric_scenario(patterns_line4_v11 4 180 --topology line --env NCCL_MESH_RELAY=auto --env NCCL_MESH_PORT_RANGE=20000-20999
                -- patterns --api v11 --check-port-range)
# 8-ring: the trees' edges reach distance 4 and PAT's +-4 (three relays).
fabric_scenario(patterns_ring8 8 300 --topology ring --env NCCL_MESH_RELAY=auto --env NCCL_MESH_RELAY_MAX_HOPS=3
                -- patterns --ring-first)
fabric_scenario(relay_ring8 8 300 --topology ring --env NCCL_MESH_RELAY=auto --env NCCL_MESH_RELAY_MAX_HOPS=3 -- relay --big 16M)
# Issue 15's fault acceptance on the 4-ring: rank 0 -> rank 2 goes through rank 1 or 3 (B).
# B killed or stopped mid-transfer, the receiver or the sender killed, 200 relayed connect/close cycles (no
# fd or RDMA object left on any rank), B unloading the plugin while it relays, A's cable to B
# cut before a connect (tests/e2e/README.md).
# Two relays per connection are the default (NCCL_MESH_RELAY_TWIN=1): the other faults run over
# both; kill-relay runs with one relay (its twin: fabric_e2e_relay_faults_kill_relay_twin).
fabric_scenario(relay_faults_kill_relay 4 120 --topology ring --env NCCL_MESH_RELAY=auto --env NCCL_MESH_RELAY_TWIN=0
                -- relay-faults --mode kill-relay)
# A stopped relay: its kernel still answers TCP keepalive, so only the control links'
# heartbeat notices it (NCCL_MESH_PEER_TIMEOUT_MS).
fabric_scenario(relay_faults_stop_relay 4 120 --topology ring --env NCCL_MESH_RELAY=auto
                --env NCCL_MESH_PEER_TIMEOUT_MS=5000 -- relay-faults --mode stop-relay)
fabric_scenario(relay_faults_kill_receiver 4 120 --topology ring --env NCCL_MESH_RELAY=auto -- relay-faults --mode kill-receiver)
# The sender killed mid-message: 8 MiB messages through one relay (two of its 4 MiB rings each)
# on 40 MB/s cables take 0.2 s a hop, so A dies with one half through the relay (a send that
# two sweeps did not finish). The relay must fail the link, or C's posted receive waits
# forever (its peer, the relay, lives): C's error within 10 s of A's death.
fabric_scenario(relay_faults_kill_sender 4 120 --topology ring --rate 40M --env NCCL_MESH_RELAY=auto
                --env NCCL_MESH_RELAY_TWIN=0 -- relay-faults --mode kill-sender --size 8M --bound 10)
fabric_scenario(relay_faults_cycles 4 400 --topology ring --env NCCL_MESH_RELAY=auto -- relay-faults --mode relay-cycles --count 200)
fabric_scenario(relay_faults_finalize 4 120 --topology ring --env NCCL_MESH_RELAY=auto -- relay-faults --mode relay-finalize)
fabric_scenario(relay_faults_finalize_v11 4 120 --topology ring --env NCCL_MESH_RELAY=auto -- relay-faults --mode relay-finalize --api v11)
fabric_scenario(relay_faults_cut 4 120 --topology ring --env NCCL_MESH_RELAY=auto --env NCCL_MESH_CONNECT_TIMEOUT_MS=5000
                -- relay-faults --mode cut)
# Two relayed comms through one relay: one stalled (its receiver posts nothing) must not hold
# up the other. The route plan puts 0 -> 2 and 2 -> 0 through different relays (each relay node
# one pair), so this runs with the fallback rule, whose choices differ from try to try.
fabric_scenario(relay_faults_isolation 4 120 --topology ring --env NCCL_MESH_RELAY=auto --env NCCL_MESH_RELAY_PLAN=0
                -- relay-faults --mode isolation)
# Issue 31: one relay route table for the whole cluster. Every node of a 4-ring logs the same
# table digest and the 4 relayed pairs load each of the 8 cable directions once; with node 0's
# HELLOs to node 1 dropped (198.18.0.1 is node 0's end of link 0, the 0-1 cable; a test-only
# switch) every node logs the disagreement and every pair still connects by the fallback rule.
fabric_scenario(route_plan_ring4 4 60 --topology ring --env NCCL_MESH_RELAY=auto -- route-plan)
fabric_scenario(route_plan_drop_ring4 4 60 --topology ring --env NCCL_MESH_RELAY=auto
                --env MESH_TEST_DROP_HELLOS_FROM=198.18.0.1 -- route-plan --expect disagree)
# A relay memory cap of one ring (4M = 32 x 128K), one relay per connection (NCCL_MESH_RELAY_TWIN=0):
# two 0->2 connects take both relays, a third is refused by both (NoMemory) and fails within
# the connect timeout. (A two-relay connection stages at both relays: one alone fills both.)
fabric_scenario(relay_faults_memcap 4 120 --topology ring --env NCCL_MESH_RELAY=auto --env NCCL_MESH_RELAY_MEM=4M
                --env NCCL_MESH_RELAY_TWIN=0 --env NCCL_MESH_CONNECT_TIMEOUT_MS=5000 -- relay-faults --mode memcap)
