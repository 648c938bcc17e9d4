// model/init.cu - initial weights: GPT-2's random init from a counter-based RNG, and llm.c model
// files. See model/init.h.
//
// The RNG is a pure function value(seed, tensor, index): SplitMix64 turns (seed, FNV-1a of the
// tensor name) into a stream key, hashes key + 2*index and key + 2*index + 1 into two 53-bit
// uniforms, and Box-Muller turns them into one N(0,1) sample. No state is carried, so any rank
// computes any element of any tensor without generating the ones before it.
#include "model/init.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <vector>

#include "kernels/counter_rng.h"

uint64_t tensor_key(const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

float counter_normal(uint64_t seed, uint64_t key, uint64_t index) {
  const uint64_t stream = splitmix64(seed ^ splitmix64(key));
  const uint64_t h1 = splitmix64(stream + 2 * index), h2 = splitmix64(stream + 2 * index + 1);
  const double u1 = ((h1 >> 11) + 1) * 0x1.0p-53;  // (0, 1]: log is finite
  const double u2 = uniform53(h2);                 // [0, 1)
  return (float)(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
}

ParamFill random_init_fill(uint64_t seed) {
  return [seed](const TensorPlacement& t, const Block& b, float* dst) {
    const uint64_t key = tensor_key(t.name);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < b.rows; i++) {
      const int64_t row = b.row + i;
      for (int64_t j = 0; j < b.cols; j++) {
        const size_t idx = (size_t)(row * t.cols + b.col + j);  // global row-major index
        float& out = dst[i * b.cols + j];
        if (t.init_std > 0)  // rows past init_rows (wte's padding) start at zero
          out = row < t.init_rows ? t.init_std * counter_normal(seed, key, idx) : 0.0f;
        else
          out = t.init_value;
      }
    }
  };
}

// ---------------------------------------------------------------------------------------------
// llm.c model files
// ---------------------------------------------------------------------------------------------
// The file's tensors in llm.c's order: wte (Vp, C), wpe (maxT, C), then each block tensor below
// stacked over the layers, then ln_f weight and bias - all fp32 (version 3) or bf16 (version 5)
// after the 256-int32 header.
static const char* const kLlmcBlockSuffix[] = {
    "ln_1/weight", "ln_1/bias", "attn/qkv/weight", "attn/qkv/bias", "attn/proj/weight",
    "attn/proj/bias", "ln_2/weight", "ln_2/bias", "mlp/fc/weight", "mlp/fc/bias",
    "mlp/proj/weight", "mlp/proj/bias"};

static size_t llmc_block_tensor_size(int i, size_t C) {
  static const size_t per_C2[] = {0, 0, 3, 0, 1, 0, 0, 0, 4, 0, 4, 0};  // matrices: k*C*C
  static const size_t per_C[] = {1, 1, 0, 3, 0, 1, 1, 1, 0, 4, 0, 1};   // vectors: k*C
  return per_C2[i] * C * C + per_C[i] * C;
}

size_t llmc_tensor_offset(const GPTLayout& g, const TensorPlacement& t) {
  const size_t C = g.C, L = g.L;
  if (t.name == "wte") return 0;
  if (t.name == "wpe") return (size_t)g.Vp * C;
  size_t off = (size_t)g.Vp * C + (size_t)g.maxT * C;
  int layer = -1;
  std::string suffix;
  if (t.name.rfind("h.", 0) == 0) {
    size_t slash = t.name.find('/');
    layer = std::stoi(t.name.substr(2, slash - 2));
    suffix = t.name.substr(slash + 1);
  }
  for (int i = 0; i < 12; i++) {
    const size_t sz = llmc_block_tensor_size(i, C);
    if (suffix == kLlmcBlockSuffix[i]) return off + (size_t)layer * sz;
    off += L * sz;
  }
  if (t.name == "ln_f/weight") return off;
  if (t.name == "ln_f/bias") return off + C;
  BUG("tensor %s has no place in an llm.c model file", t.name.c_str());
}

LlmcModelFile llmc_open(const std::string& path, const GPTLayout& g) {
  LlmcModelFile f;
  f.path = path;
  f.fd = open(path.c_str(), O_RDONLY);
  CHECK_ALL(f.fd >= 0, "[init] from: cannot open %s: %s", path.c_str(), strerror(errno));
  int32_t h[256];
  CHECK_ALL(pread(f.fd, h, sizeof(h), 0) == (ssize_t)sizeof(h),
            "[init] from: %s is shorter than the 1024-byte llm.c header", path.c_str());
  CHECK_ALL(h[0] == 20240326, "[init] from: %s has magic %d, expected 20240326 (llm.c model)",
            path.c_str(), h[0]);
  CHECK_ALL(h[1] == 3 || h[1] == 5,
            "[init] from: %s has version %d, expected 3 (fp32) or 5 (bf16)",
            path.c_str(), h[1]);
  f.version = h[1];
  f.maxT = h[2], f.V = h[3], f.L = h[4], f.NH = h[5], f.C = h[6], f.Vp = h[7];
  CHECK_ALL(f.maxT == g.maxT && f.V == g.V && f.L == g.L && f.NH == g.NH && f.C == g.C &&
                f.Vp == g.Vp,
            "[init] from: %s holds a model of shape (n_layer %d, n_head %d, d_model %d, "
            "max_seq_len %d, vocab %d/%d) but the config asks for (n_layer %d, n_head %d, "
            "d_model %d, max_seq_len %d, vocab %d/%d)",
            path.c_str(), f.L, f.NH, f.C, f.maxT, f.V, f.Vp, g.L, g.NH, g.C, g.maxT, g.V, g.Vp);
  CHECK_ALL(g.T <= f.maxT,
            "[init] from: %s has a position table of maxT = %d rows, shorter than [model] "
            "seq_len = %d: seq_len must be <= the file's maxT", path.c_str(), f.maxT, g.T);
  const size_t elem = f.version == 3 ? 4 : 2;
  const off_t expect = 1024 + (off_t)(g.parameters * elem);
  const off_t size = lseek(f.fd, 0, SEEK_END);
  CHECK_ALL(size == expect, "[init] from: %s is %lld bytes, expected %lld for this shape",
            path.c_str(), (long long)size, (long long)expect);
  return f;
}

void llmc_close(LlmcModelFile& f) {
  if (f.fd >= 0) close(f.fd);
  f.fd = -1;
}

// count values starting at element `at` of the file's parameters, as floats.
static void read_llmc_floats(const LlmcModelFile& f, const TensorPlacement& t, size_t at,
                             size_t count, float* dst) {
  const size_t elem = f.version == 3 ? 4 : 2;
  std::vector<uint16_t> half(f.version == 5 ? count : 0);
  void* buf = f.version == 3 ? (void*)dst : (void*)half.data();
  CHECK(pread(f.fd, buf, count * elem, 1024 + (off_t)(at * elem)) == (ssize_t)(count * elem),
        "[init] from: short read of %s in %s", t.name.c_str(), f.path.c_str());
  if (f.version == 5)
    for (size_t i = 0; i < count; i++) dst[i] = bf16_to_f32(half[i]);
}

ParamFill llmc_fill(const LlmcModelFile& f, const GPTLayout& g) {
  return [f, g](const TensorPlacement& t, const Block& b, float* dst) {
    const size_t base = llmc_tensor_offset(g, t);
    // Whole rows are contiguous in the file: one read; a column block is a read per row.
    const bool whole_rows = b.cols == t.cols;
    const int64_t reads = whole_rows ? 1 : b.rows;
    const size_t count = whole_rows ? b.numel() : (size_t)b.cols;
    for (int64_t i = 0; i < reads; i++) {
      const size_t first = (size_t)((b.row + i) * t.cols + b.col);
      read_llmc_floats(f, t, base + first, count, dst + i * count);
    }
  };
}
