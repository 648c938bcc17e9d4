// test/test_moe_grads.cpp - one forward + backward of the trainer's GPT with mixture-of-experts
// blocks on the CPU backend (fp32, one rank), dumped for test/test_moe_grads.py to compare with
// the float64 PyTorch reference (test/moe_reference.py), plus central finite differences of the
// trainer's own loss along given directions.
//
//   test_moe_grads L NH C T V E TOP_K MOE_EVERY D_EXPERT AUX Z SEED B TOKENS OUT
//                  [WEIGHTS [DIRS EPS]]
//
// The model: [model] n_layer = L, n_head = NH, d_model = C, seq_len = T, vocab_size = V,
// n_experts = E (0: the dense model), top_k, moe_every, d_expert; [train] moe_aux_loss = AUX,
// moe_z_loss = Z; GPT-2 random init (model/init.h) with SEED. TOKENS: B*T inputs then B*T
// targets, int32. WEIGHTS ("-" = none): every parameter, fp32, in the order of the names printed
// on stdout, written over the random init. DIRS: K directions, each a vector of every parameter
// in that order (fp32); for each the loss is evaluated at W + EPS*d and W - EPS*d.
//
// The newer MoE options come from the environment (unset: off): MOE_SHARED = [model]
// n_shared_experts, MOE_SCORE = [model] router_score ("sigmoid"), MOE_CAPACITY = [train]
// moe_capacity_factor, MOE_BIAS = a file of L*E fp32 balancing biases (moe_balance = "bias",
// the biases set as if resumed; they change only after an optimizer step, which this never takes).
//
// Stdout: one "name numel" line per tensor. OUT (little-endian):
//   float64 lm, aux, z            the three terms the optimizer sees (lm: the mean LM loss)
//   float64 total_fine            lm summed in float64 over the per-token losses, + aux + z
//   int32 n_moe, then per MoE layer: int32 layer, int32 Nt, int32 top_k, Nt*top_k int32 chosen
//         experts, Nt*E float32 router probabilities
//   float32 weights               every tensor, in the printed order
//   float32 gradients             d(lm + aux + z), the same order
//   int32 K, then per direction: float64 loss(W + EPS d), loss(W - EPS d) (total_fine), the
//         gradient's dot product with the realised step (W+ - W-, after fp32 rounding), and
//         int32 1 if the routing of the + and - evaluations both equal the unperturbed one
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "model/gpt.h"
#include "model/init.h"
#include "model/moe.h"
#include "parallel/param_store.h"
#include "test/gpt_one_stage.h"

namespace {

struct Harness {
  Mesh one;  // the layout's groups (one rank)
  GPTLayout layout;
  ParamStore store;
  GPT model;
  ops::Stream s = nullptr;
  int B = 0, T = 0;
  std::vector<int> tokens;
  size_t total = 0;  // parameters over all tensors

  // Every tensor's (unit, offset, numel), in dump order.
  struct Slot {
    int unit;
    size_t offset, numel;
  };
  std::vector<Slot> slots;

  struct Result {
    double lm = 0, aux = 0, z = 0, fine = 0;
    std::vector<std::vector<int>> chosen;    // per MoE layer
    std::vector<std::vector<float>> probs;   // per MoE layer
  };

  std::vector<float> read_all(bool grads) {
    std::vector<float> out;
    out.reserve(total);
    for (const Slot& sl : slots) {
      const UnitState& us = store.units[sl.unit];
      std::vector<float> buf(sl.numel);
      ops::copy_to_host(buf.data(), (grads ? us.grad : us.master) + sl.offset, sl.numel * 4);
      out.insert(out.end(), buf.begin(), buf.end());
    }
    return out;
  }

  // Overwrites every weight (fp32: the master is the working copy, parallel/ddp.cu).
  void write_all(const std::vector<float>& w) {
    size_t at = 0;
    for (const Slot& sl : slots) {
      ops::copy_to_device(store.units[sl.unit].master + sl.offset, w.data() + at, sl.numel * 4);
      at += sl.numel;
    }
  }

  Result step() {
    grads_zero(store);
    const float scale = 1.0f / (B * T);
    gpt_forward_backward(model, store, tokens.data(), tokens.data() + (size_t)B * T, B, T, scale,
                         scale, s);
    grads_wait(store);
    ops::stream_sync(s);
    Result r;
    float lm = 0;
    ops::copy_to_host(&lm, model.loss_sum, 4);
    r.lm = lm;
    std::vector<float> losses((size_t)B * T);
    ops::copy_to_host(losses.data(), model.losses, losses.size() * 4);
    double fine = 0;
    for (float x : losses) fine += x;
    fine /= (double)B * T;
    if (model.moe) {
      Comm single;  // one rank: the report's sums are the stats themselves
      const MoeReport rep = moe_step_report(model, single, 1);
      r.aux = rep.aux_loss;
      r.z = rep.z_loss;
      const int Nt = B * T, k = layout.top_k, E = layout.E;
      for (MoeActs* a : model.moe->owned_acts) {
        std::vector<int> c((size_t)Nt * k);
        std::vector<float> p((size_t)Nt * E);
        ops::copy_to_host(c.data(), a->expert, c.size() * 4);
        ops::copy_to_host(p.data(), a->probs, p.size() * 4);
        r.chosen.push_back(c);
        r.probs.push_back(p);
      }
    }
    r.fine = fine + r.aux + r.z;
    return r;
  }
};

template <typename X>
void put(std::ofstream& f, const X& x) {
  f.write((const char*)&x, sizeof(X));
}

std::vector<float> read_floats(const char* path, size_t n) {
  std::vector<float> v(n);
  FILE* f = std::fopen(path, "rb");
  CHECK(f && std::fread(v.data(), 4, n, f) == n, "cannot read %zu floats from %s", n, path);
  std::fclose(f);
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  CHECK(argc == 16 || argc == 17 || argc == 19,
        "usage: %s L NH C T V E TOP_K MOE_EVERY D_EXPERT AUX Z SEED B TOKENS OUT "
        "[WEIGHTS [DIRS EPS]]", argv[0]);
  ModelConfig mc;
  mc.n_layer = std::atoi(argv[1]);
  mc.n_head = std::atoi(argv[2]);
  mc.d_model = std::atoi(argv[3]);
  mc.seq_len = mc.max_seq_len = std::atoi(argv[4]);
  mc.vocab_size = std::atoi(argv[5]);
  mc.n_experts = std::atoi(argv[6]);
  mc.top_k = std::atoi(argv[7]);
  mc.moe_every = std::atoi(argv[8]);
  mc.d_expert = std::atoi(argv[9]);
  const float aux = (float)std::atof(argv[10]), z = (float)std::atof(argv[11]);
  const uint64_t seed = std::strtoull(argv[12], nullptr, 10);
  const char* shared = std::getenv("MOE_SHARED");
  const char* score = std::getenv("MOE_SCORE");
  const char* capacity = std::getenv("MOE_CAPACITY");
  const char* bias = std::getenv("MOE_BIAS");
  if (shared) mc.n_shared_experts = std::atoi(shared);
  Harness h;
  h.B = std::atoi(argv[13]);
  h.T = mc.seq_len;
  ops::device_init(0);
  mesh_init(h.one, MeshShape{}, 0, 0, CommBackend::None);  // one rank
  h.layout = gpt_layout(mc, h.one);
  h.tokens.resize(2 * (size_t)h.B * h.T);
  FILE* tf = std::fopen(argv[14], "rb");
  CHECK(tf && std::fread(h.tokens.data(), 4, h.tokens.size(), tf) == h.tokens.size(),
        "bad tokens file %s", argv[14]);
  std::fclose(tf);

  h.s = ops::stream_create(StreamOptions{});
  const CommsByAxis comms = mesh_comms(h.one);  // groups of one: the store reduces nothing
  param_store_init(h.store, h.layout.units, ShardingMode::Replicated, DType::F32, comms, h.s, h.s,
                   random_init_fill(seed));
  h.model.moe_aux_loss = aux;
  h.model.moe_z_loss = z;
  if (score && std::string(score) == "sigmoid") h.model.moe_router_score = ops::RouterScore::Sigmoid;
  if (capacity) h.model.moe_capacity_factor = (float)std::atof(capacity);
  h.model.moe_bias_balance = bias != nullptr;
  gpt_create(h.model, h.layout, DType::F32, Recompute::None, h.B, h.T, h.s);
  if (bias) moe_bias_restore(h.model, read_floats(bias, (size_t)mc.n_layer * mc.n_experts), h.s);

  for (size_t u = 0; u < h.layout.units.size(); u++)
    for (const TensorPlacement& t : h.layout.units[u].tensors) {
      CHECK(t.local_numel() == t.numel(), "%s: one rank holds every tensor whole", t.name.c_str());
      h.slots.push_back({(int)u, t.offset, t.numel()});
      h.total += t.numel();
      std::printf("%s %zu\n", t.name.c_str(), t.numel());
    }
  if (argc >= 17 && std::string(argv[16]) != "-") h.write_all(read_floats(argv[16], h.total));

  const Harness::Result base = h.step();
  const std::vector<float> weights = h.read_all(false), grads = h.read_all(true);

  std::ofstream out(argv[15], std::ios::binary);
  put(out, base.lm);
  put(out, base.aux);
  put(out, base.z);
  put(out, base.fine);
  put(out, (int32_t)base.chosen.size());
  int moe_index = 0;
  for (int l = 0; l < h.layout.L; l++) {
    if (!h.layout.moe[l]) continue;
    put(out, (int32_t)l);
    put(out, (int32_t)(h.B * h.T));
    put(out, (int32_t)h.layout.top_k);
    out.write((const char*)base.chosen[moe_index].data(), base.chosen[moe_index].size() * 4);
    out.write((const char*)base.probs[moe_index].data(), base.probs[moe_index].size() * 4);
    moe_index++;
  }
  out.write((const char*)weights.data(), weights.size() * 4);
  out.write((const char*)grads.data(), grads.size() * 4);

  int32_t K = 0;
  std::vector<float> dirs;
  float eps = 0;
  if (argc == 19) {
    eps = (float)std::atof(argv[18]);
    FILE* df = std::fopen(argv[17], "rb");
    CHECK(df, "cannot open %s", argv[17]);
    std::fseek(df, 0, SEEK_END);
    const long bytes = std::ftell(df);
    std::fclose(df);
    K = (int32_t)(bytes / 4 / (long)h.total);
    CHECK((size_t)bytes == (size_t)K * h.total * 4, "%s: not a whole number of directions",
          argv[17]);
    dirs = read_floats(argv[17], (size_t)K * h.total);
  }
  put(out, K);
  for (int d = 0; d < K; d++) {
    double loss[2];
    bool same = true;
    std::vector<float> w[2];
    for (int side = 0; side < 2; side++) {
      const double sign = side == 0 ? 1.0 : -1.0;
      w[side] = weights;
      for (size_t i = 0; i < h.total; i++)
        w[side][i] = (float)((double)weights[i] + sign * eps * dirs[(size_t)d * h.total + i]);
      h.write_all(w[side]);
      const Harness::Result r = h.step();
      loss[side] = r.fine;
      same = same && r.chosen == base.chosen;
    }
    double predicted = 0;
    for (size_t i = 0; i < h.total; i++)
      predicted += (double)grads[i] * ((double)w[0][i] - (double)w[1][i]);
    put(out, loss[0]);
    put(out, loss[1]);
    put(out, predicted);
    put(out, (int32_t)same);
  }
  h.write_all(weights);
  gpt_destroy(h.model);
  param_store_destroy(h.store);
  return 0;
}
