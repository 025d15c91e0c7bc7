// SPDX-License-Identifier: Apache-2.0
// NCCL's non-ring patterns (tree, PAT, all-to-all) as exact collectives on a comm table that
// holds one send and one recv comm to every other rank: the `patterns` scenario, and the
// relay scenario's --patterns (the lab runs them on the relay's comms, in the same boot).
#pragma once

#include <string>
#include <vector>

#include "comm_setup.h"

namespace e2e {

// One rank's links in one of NCCL's trees. Children are listed in NCCL's order (down0, down1).
struct TreeNode {
  int up = -1;
  std::vector<int> down;
};
// NCCL's binary tree over ranks 0..n-1 (tree 0 of the double binary tree) and tree 1 (its
// mirror for even n, its shift by one for odd n), as NCCL 2.28's src/graph/trees.cc builds them.
TreeNode binaryTree(int n, int r);
TreeNode secondTree(int n, int r);

struct PatternOptions {
  size_t count = 0;     // --count floats in the reduced vector
  size_t a2aBytes = 0;  // --alltoall-bytes per ordered pair
  int iters = 0;        // --iters
  bool tree = false, pat = false, alltoall = false;  // --patterns tree,pat,alltoall
};

// Reads and checks the options above (defaults: all three patterns).
PatternOptions patternOptions(const Context& ctx);
// Runs the chosen patterns --iters times on `table` (comms stay open); the PASS figures.
std::string runPatternsOn(Context& ctx, CommTable& table, const PatternOptions& o);

}  // namespace e2e
