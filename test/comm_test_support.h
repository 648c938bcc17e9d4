// test/comm_test_support.h - the bookkeeping of test/test_comm.cpp: the checks, the layouts,
// the exact expected data every rank can compute for every other, and the counters the calls
// should have produced. Included once, inside test_comm.cpp's anonymous namespace (after its
// fake-device memory functions, when built with COMM_TEST_FAKE_DEVICE).
#pragma once

// ---------------------------------------------------------------------------------------------
// Bookkeeping: checks, layouts, expected data
// ---------------------------------------------------------------------------------------------
struct Layout {
  int dp, tp, pp, cp, ep;
};

struct Ctx {
  uint64_t seed = 0;
  CommBackend backend = CommBackend::MPI;
  int world_rank = 0, world_size = 1;
  std::string where;  // layout, axis and op of the checks running now
  long checks = 0, failures = 0;
  CommStats expected;  // counters the calls so far should have produced
};

void check(Ctx& ctx, bool ok, const std::string& what) {
  ++ctx.checks;
  if (ok) return;
  if (++ctx.failures <= 10)
    std::fprintf(stderr, "[rank %d] FAIL %s: %s\n", ctx.world_rank, ctx.where.c_str(),
                 what.c_str());
}

uint64_t mix(uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The value world rank w sends as element i of collective `tag`. exact: every sum of up to four
// such values is representable in dt; otherwise: a general value of dt (wide exponent range).
float value(const Ctx& ctx, int w, int tag, size_t i, DType dt, bool exact) {
  const uint64_t h = mix(ctx.seed ^ mix((uint64_t)w << 40 ^ (uint64_t)tag << 32 ^ i));
  if (dt == DType::I8) return (float)((int)(h % 255) - 127);  // moved, never summed
  if (dt == DType::I32) return (float)((int64_t)(h % 16777215) - 8388607);  // exact in a float
  if (exact) {
    if (dt == DType::F32) return (float)((int64_t)(h % 65535) - 32767) / 256.0f;
    return (float)((int)(h % 127) - 63) / 4.0f;
  }
  const float unit = (float)((h >> 11) * 0x1.0p-53) * 2.0f - 1.0f;
  const float x = std::ldexp(unit, (int)(h % 9) - 4);
  return dt == DType::F32 ? x : round_bf16(x);
}

std::vector<float> values(const Ctx& ctx, int w, int tag, size_t n, DType dt, bool exact) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = value(ctx, w, tag, i, dt, exact);
  return v;
}

// One element of dtype dt from a host float (representable in dt), into bytes, and back.
void put(uint8_t* bytes, size_t i, float x, DType dt) {
  if (dt == DType::F32) std::memcpy(&bytes[4 * i], &x, 4);
  else if (dt == DType::BF16) { uint16_t h = f32_to_bf16(x); std::memcpy(&bytes[2 * i], &h, 2); }
  else if (dt == DType::I8) bytes[i] = (uint8_t)(int8_t)x;
  else { int32_t k = (int32_t)x; std::memcpy(&bytes[4 * i], &k, 4); }
}

// Device buffers from and to host floats (bf16: stored as bf16, values already representable).
// Extra elements are poisoned: NaN in fp32 and bf16, -1 in the integer types.
void* upload(const std::vector<float>& v, DType dt, size_t extra_elems = 0) {
  const size_t n = v.size() + extra_elems;
  void* p = ops::alloc(n * dtype_size(dt) + 1);
  std::vector<uint8_t> bytes(n * dtype_size(dt), 0xFF);
  for (size_t i = 0; i < v.size(); ++i) put(bytes.data(), i, v[i], dt);
  ops::copy_to_device(p, bytes.data(), bytes.size());
  return p;
}
bool is_float(DType dt) { return dt == DType::F32 || dt == DType::BF16; }
float poison(DType dt) { return is_float(dt) ? NAN : -1.0f; }
bool is_poison(float x, DType dt) { return is_float(dt) ? std::isnan(x) : x == -1.0f; }
void* poisoned(size_t n, DType dt) { return upload({}, dt, n); }
std::vector<float> download(const void* p, size_t n, DType dt) {
  std::vector<uint8_t> bytes(n * dtype_size(dt));
  ops::copy_to_host(bytes.data(), p, bytes.size());
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = element_as_float(bytes.data(), i, dt);
  return v;
}

void check_values(Ctx& ctx, const std::vector<float>& got, const std::vector<float>& want,
                  const char* what) {
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < want.size(); ++i)
    if (!(got[i] == want[i]) && bad++ == 0) first = i;
  char msg[256];
  std::snprintf(msg, sizeof(msg), "%s: %zu of %zu elements wrong, first [%zu] = %.9g, want %.9g",
                what, bad, want.size(), first, bad ? got[first] : 0.0, bad ? want[first] : 0.0);
  check(ctx, bad == 0, msg);
}

void expect_call(Ctx& ctx, const Comm& c, CollectiveKind kind, size_t bytes) {
  if (c.size == 1) return;  // one-rank groups are not counted (comm.cu)
  ctx.expected.axis[(int)c.axis].calls[(int)kind] += 1;
  ctx.expected.axis[(int)c.axis].bytes[(int)kind] += bytes;
}


// The collectives' tags: each keys its own expected values.
enum Tag {
  kAllReduce = 1, kReduceScatter, kAllGather, kBroadcast, kRing, kAllToAll, kPairRing,
  kActivation, kGradient, kChain, kBatchNext, kBatchPrev, kAllToAllV
};
