// test/rank_coords.h - a world rank's mesh coordinates, written out in the tests' own words (the
// order parallel/mesh.h documents: world_rank = ((dp_rank * pp + pp_rank) * cp + cp_rank) * tp +
// tp_rank), so that tests of the mesh's groups and of the checkpoint writers check the trainer's
// layout code against a formula that is not the trainer's.
#pragma once

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
