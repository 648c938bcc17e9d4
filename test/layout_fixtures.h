// test/layout_fixtures.h - what the layout tests (test_diloco_groups, test_checkpoint_writers)
// share: a world rank's mesh coordinates, written out in the tests' own words (the order
// parallel/mesh.h documents: world_rank = ((dp_rank * pp + pp_rank) * cp + cp_rank) * tp +
// tp_rank), so that they check the trainer's layout code against a formula that is not the
// trainer's; and the tiny model they lay out.
#pragma once

#include "config/config.h"

struct RankCoords {
  int dp, pp, cp, tp;
};

inline RankCoords rank_coords(int world_rank, int pp, int cp, int tp) {
  RankCoords c;
  c.tp = world_rank % tp;
  c.cp = world_rank / tp % cp;
  c.pp = world_rank / (tp * cp) % pp;
  c.dp = world_rank / (tp * cp * pp);
  return c;
}

// 4 blocks, 4 heads, 32 wide, vocabulary 50; with n_experts > 0 every second block is MoE (top 2).
inline ModelConfig tiny_model(int n_experts) {
  ModelConfig m;
  m.n_layer = 4, m.n_head = 4, m.d_model = 32, m.seq_len = 16, m.max_seq_len = 16;
  m.vocab_size = 50;
  m.n_experts = n_experts, m.top_k = 2, m.moe_every = 2, m.d_expert = 24;
  return m;
}
