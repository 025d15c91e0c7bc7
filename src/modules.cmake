# SPDX-License-Identifier: Apache-2.0
# The modules of the plugin and its tools, lowest first: the one table of what may use what.
#
#   mesh_module(NAME [OBJECT] [USES MODULE...])
#
# A module is a folder, src/NAME/ (sources) and include/mesh/NAME/ (headers, included as
# "mesh/NAME/x.h"). It may include its own headers and those of every module it USES,
# directly or through the modules those use; nothing above it and nothing beside it.
# CMakeLists.txt builds each module as a static library, mesh_NAME, linked to the ones it
# USES (OBJECT: an object library instead, whose objects make up the plugin's .so), and the
# unit test layering_check (tests/layering/) holds every #include under src/ and include/
# to this table. docs/DESIGN-notes.md, "Map", says what each module owns.
mesh_module(platform)                      # logging, errors, text, IPv4, pages, version, the verbs loader
mesh_module(wire      USES platform)       # the bytes between nodes: listen handle, handshake messages
mesh_module(stats     USES platform)       # live counters: published per process, read by nccl-mesh-info --watch
mesh_module(routing   USES wire)           # which cable reaches a peer; the relay's route table
mesh_module(config    USES routing)        # the NCCL_MESH_* settings table
mesh_module(discovery USES config)         # the usable RoCE ports of this node
mesh_module(rdma      USES discovery)      # QPs and memory registration
mesh_module(connect   USES routing)        # the reactor thread and the handshake
mesh_module(datapath  USES connect rdma stats)   # comms: the receiver-driven FIFO, flush, async events
mesh_module(relay     USES datapath)       # route discovery and relayed connections
mesh_module(plugin    USES relay)          # init and shutdown, the devices NCCL sees, the core calls
mesh_module(abi       OBJECT USES plugin)  # ncclNet v8..v12 and the call recorder
mesh_module(tools     USES plugin)         # nccl-mesh-info, nccl-mesh-perf and their helpers
