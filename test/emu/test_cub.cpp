// test/emu/test_cub.cpp - drives the cub stand-in (test/emu/include/cub/cub.cuh) as
// kernels/cuda/encoder.cu does (the size query with null pointers, then the sort in the storage
// it asked for) on random keys, and writes inputs and outputs for test/emu/test_cub.py, which
// compares them with numpy's stable argsort.
//
//   test_cub OUT_DIR SEED      writes OUT_DIR/manifest.json and the arrays; checks the protocol
//                              (too little storage, overlapping buffers, a bad bit range are
//                              refused; nothing past num_items is written); exit 1 on a failure
//
// Cases: int keys with duplicates and negatives at sizes 1, 2 (equal keys, a descending pair) and
// 1000003 (encoder.cu's call:
// bits [0, 32), int values), int keys sorted on bits [3, 17) only, uint64 keys with float values
// on all 64 bits and on bits [13, 40).
#include <cub/cub.cuh>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

namespace {

int failures = 0;
void expect(bool ok, const std::string& what) {
  if (!ok) ++failures;
  std::printf("%s %s\n", ok ? "ok  " : "FAIL", what.c_str());
}

template <typename T>
void write(const std::string& path, const std::vector<T>& v, size_t n) {
  FILE* f = std::fopen(path.c_str(), "wb");
  std::fwrite(v.data(), sizeof(T), n, f);
  std::fclose(f);
}

// Sorts n random pairs with the two-call protocol and writes them; keys drawn by `draw`.
template <typename K, typename V, typename Draw>
std::string run_case(const std::string& dir, const char* name, size_t n, int begin, int end,
                     Draw draw, std::mt19937_64& rng) {
  std::vector<K> keys(n), keys_out(n + 2);
  std::vector<V> values(n), values_out(n + 2);
  for (size_t i = 0; i < n; i++) keys[i] = draw(rng), values[i] = (V)i;
  std::memset(keys_out.data(), 0xA5, keys_out.size() * sizeof(K));
  std::memset(values_out.data(), 0xA5, values_out.size() * sizeof(V));
  size_t bytes = 0;
  cudaError_t st = cub::DeviceRadixSort::SortPairs(nullptr, bytes, (const K*)nullptr, (K*)nullptr,
                                                   (const V*)nullptr, (V*)nullptr, (int)n, begin,
                                                   end, (cudaStream_t)0);
  expect(st == cudaSuccess && bytes > 0, std::string(name) + ": the size query");
  std::vector<char> temp(bytes);
  st = cub::DeviceRadixSort::SortPairs(temp.data(), bytes, keys.data(), keys_out.data(),
                                       values.data(), values_out.data(), (int)n, begin, end,
                                       (cudaStream_t)0);
  expect(st == cudaSuccess, std::string(name) + ": the sort");
  K key_poison;
  V value_poison;
  std::memset(&key_poison, 0xA5, sizeof(K));
  std::memset(&value_poison, 0xA5, sizeof(V));
  expect(std::memcmp(&keys_out[n], &key_poison, sizeof(K)) == 0 &&
             std::memcmp(&values_out[n], &value_poison, sizeof(V)) == 0,
         std::string(name) + ": nothing written past num_items");
  const std::string file = dir + "/" + std::to_string(std::hash<std::string>()(name));
  write(file + ".keys_in", keys, n);
  write(file + ".values_in", values, n);
  write(file + ".keys_out", keys_out, n);
  write(file + ".values_out", values_out, n);
  char entry[512];
  std::snprintf(entry, sizeof(entry),
                "{\"name\": \"%s\", \"file\": \"%s\", \"n\": %zu, \"begin\": %d, \"end\": %d, "
                "\"key\": \"%s\", \"value\": \"%s\"}",
                name, file.c_str(), n, begin, end, sizeof(K) == 4 ? "int32" : "uint64",
                sizeof(V) == 4 && std::is_integral<V>::value ? "int32" : "float32");
  return entry;
}

void protocol_refusals() {
  std::vector<int> keys = {3, 1, 2, 1}, out(4), vals = {0, 1, 2, 3}, vout(4);
  size_t bytes = 0;
  cub::DeviceRadixSort::SortPairs(nullptr, bytes, keys.data(), out.data(), vals.data(), vout.data(), 4);
  std::vector<char> temp(bytes);
  size_t less = bytes - 1;
  expect(cub::DeviceRadixSort::SortPairs(temp.data(), less, keys.data(), out.data(), vals.data(),
                                         vout.data(), 4) == cudaErrorInvalidValue,
         "refuses less storage than it asked for");
  expect(cub::DeviceRadixSort::SortPairs(temp.data(), bytes, keys.data(), keys.data(), vals.data(),
                                         vout.data(), 4) == cudaErrorInvalidValue,
         "refuses keys_out == keys_in");
  expect(cub::DeviceRadixSort::SortPairs(temp.data(), bytes, keys.data(), out.data(), vals.data(),
                                         vout.data(), 4, 0, 33) == cudaErrorInvalidValue,
         "refuses end_bit 33 for int keys");
  expect(cub::DeviceRadixSort::SortPairs((void*)out.data(), bytes, keys.data(), out.data(),
                                         vals.data(), vout.data(), 4) == cudaErrorInvalidValue,
         "refuses storage overlapping keys_out");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: test_cub OUT_DIR SEED\n");
    return 2;
  }
  const std::string dir = argv[1];
  std::mt19937_64 rng(std::strtoull(argv[2], nullptr, 10));
  auto small = [](std::mt19937_64& r) { return (int)(r() % 7) - 3; };  // duplicates, negatives
  auto wide = [](std::mt19937_64& r) { return (int)(r() % 100001) - 50000; };
  auto any_int = [](std::mt19937_64& r) { return (int)(uint32_t)r(); };
  auto any_u64 = [](std::mt19937_64& r) { return (uint64_t)r() >> (r() % 40); };
  std::vector<std::string> entries;
  entries.push_back(run_case<int, int>(dir, "int n=1", 1, 0, 32, small, rng));
  int next = 0;  // n = 2: equal keys (stability), then a descending pair (a swap)
  auto pair_equal = [](std::mt19937_64&) { return -7; };
  auto pair_down = [&next](std::mt19937_64&) { return next++ == 0 ? 5 : -5; };
  entries.push_back(run_case<int, int>(dir, "int n=2 equal", 2, 0, 32, pair_equal, rng));
  entries.push_back(run_case<int, int>(dir, "int n=2 descending", 2, 0, 32, pair_down, rng));
  entries.push_back(run_case<int, int>(dir, "int n=1000003", 1000003, 0, 32, wide, rng));
  entries.push_back(run_case<int, int>(dir, "int n=999 few keys", 999, 0, 32, small, rng));
  entries.push_back(run_case<int, int>(dir, "int bits [3,17)", 1001, 3, 17, any_int, rng));
  entries.push_back(run_case<uint64_t, float>(dir, "uint64 all bits", 777, 0, 64, any_u64, rng));
  entries.push_back(run_case<uint64_t, float>(dir, "uint64 bits [13,40)", 777, 13, 40, any_u64, rng));
  protocol_refusals();
  FILE* f = std::fopen((dir + "/manifest.json").c_str(), "w");
  std::fprintf(f, "[\n");
  for (size_t i = 0; i < entries.size(); i++)
    std::fprintf(f, "%s%s\n", entries[i].c_str(), i + 1 < entries.size() ? "," : "");
  std::fprintf(f, "]\n");
  std::fclose(f);
  std::printf("test_cub: %d failures (the orders are checked by test_cub.py)\n", failures);
  return failures == 0 ? 0 : 1;
}
