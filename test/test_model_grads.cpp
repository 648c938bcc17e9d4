// test/test_model_grads.cpp - one forward + backward of the trainer's GPT-2 on the CPU backend,
// dumped for test/test_model.py to compare against the float64 PyTorch reference.
//
//   test_model_grads MODEL.bin TOKENS.bin B T DTYPE(fp32|bf16) RECOMPUTE(none|gelu|block) OUT.bin
//                    [HEAD_CHUNK]
//
// TOKENS.bin holds B*T inputs then B*T targets as int32. OUT.bin receives the loss (float64)
// and then every parameter's gradient (fp32) in the order of the names printed on stdout, one
// "name numel" line each. HEAD_CHUNK: the head's chunk in tokens (model/gpt_head.cu; default
// its own choice, a quarter of B*T).
#include <cstdio>
#include <fstream>
#include <vector>

#include "model/gpt.h"
#include "model/init.h"
#include "parallel/param_store.h"
#include "test/gpt_one_stage.h"

static ModelConfig read_shape(const char* path) {
  int32_t h[256];
  FILE* f = std::fopen(path, "rb");
  CHECK(f && std::fread(h, 4, 256, f) == 256, "cannot read %s", path);
  std::fclose(f);
  ModelConfig m;
  m.seq_len = h[2], m.vocab_size = h[3], m.n_layer = h[4], m.n_head = h[5], m.d_model = h[6];
  return m;
}

int main(int argc, char** argv) {
  CHECK(argc == 8 || argc == 9, "usage: %s MODEL TOKENS B T DTYPE RECOMPUTE OUT [HEAD_CHUNK]",
        argv[0]);
  const int B = std::atoi(argv[3]), T = std::atoi(argv[4]);
  const DType dt = std::string(argv[5]) == "bf16" ? DType::BF16 : DType::F32;
  ops::device_init(0);
  Mesh one;  // one rank: a group of one on every axis, the store reduces nothing
  mesh_init(one, MeshShape{}, 0, 0, CommBackend::None);
  GPTLayout layout = gpt_layout(read_shape(argv[1]), one);
  std::vector<int> tokens(2 * (size_t)B * T);
  FILE* tf = std::fopen(argv[2], "rb");
  CHECK(tf && std::fread(tokens.data(), 4, tokens.size(), tf) == tokens.size(), "bad tokens");
  std::fclose(tf);

  ops::Stream s = ops::stream_create(StreamOptions{});
  const CommsByAxis comms = mesh_comms(one);
  ParamStore store;
  LlmcModelFile mf = llmc_open(argv[1], layout);
  param_store_init(store, layout.units, ShardingMode::Replicated, dt, comms, s, s,
                   llmc_fill(mf, layout));
  llmc_close(mf);
  GPT model;
  if (argc == 9) model.head_chunk = std::atoi(argv[8]);
  gpt_create(model, layout, dt, parse_recompute(argv[6]), B, T, s);
  grads_zero(store);
  const float scale = 1.0f / (B * T);
  gpt_forward_backward(model, store, tokens.data(), tokens.data() + (size_t)B * T, B, T, scale,
                       scale, s);
  grads_wait(store);
  float loss = 0;
  ops::stream_sync(s);
  ops::copy_to_host(&loss, model.loss_sum, 4);

  std::ofstream out(argv[7], std::ios::binary);
  double loss64 = loss;
  out.write((const char*)&loss64, 8);
  for (size_t u = 0; u < layout.units.size(); u++) {
    std::vector<float> g(store.units[u].shard_numel);
    ops::copy_to_host(g.data(), store.units[u].grad, g.size() * 4);
    for (const TensorPlacement& t : layout.units[u].tensors) {
      out.write((const char*)(g.data() + t.offset), t.numel() * 4);
      std::printf("%s %zu\n", t.name.c_str(), t.numel());
    }
  }
  return 0;
}
