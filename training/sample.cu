// training/sample.cu - generating text from the model (training/sample.h).
#include "training/sample.h"

#include "training/evaluate.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "model/kv_cache.h"
#include "parallel/context_parallel.h"

SampleSettings sample_settings(const Config& cfg, uint64_t seed) {
  SampleSettings st;
  st.tokens = cfg.log.sample_tokens;
  st.seed = seed;
  st.temperature = cfg.log.sample_temperature;
  st.top_k = cfg.log.sample_top_k;
  st.kv_cache = cfg.log.sample_kv_cache;
  st.window = cfg.model.seq_len;
  return st;
}

int choose_token(const std::vector<float>& logits, double u01, double temperature, int top_k) {
  const size_t V = logits.size();
  if (temperature <= 0)  // greedy: the first of the largest
    return (int)(std::max_element(logits.begin(), logits.end()) - logits.begin());
  double floor = -INFINITY;  // logits below it are out (top-k)
  if (top_k > 0 && (size_t)top_k < V) {
    std::vector<float> sorted(logits);
    std::nth_element(sorted.begin(), sorted.begin() + (top_k - 1), sorted.end(),
                     std::greater<float>());
    floor = sorted[top_k - 1];
  }
  double maxv = logits[0];
  for (float x : logits) maxv = std::max(maxv, (double)x);
  std::vector<double> p(V);
  double sum = 0;
  for (size_t j = 0; j < V; j++)
    sum += p[j] = logits[j] < floor ? 0.0 : std::exp((logits[j] - maxv) / temperature);
  double u = u01 * sum;
  for (size_t j = 0; j < V; j++)
    if (p[j] > 0 && (u -= p[j]) <= 0) return (int)j;
  for (size_t j = V; j-- > 0;)  // rounding left u above 0: the last token still in
    if (p[j] > 0) return (int)j;
  return (int)V - 1;
}

// The token the last stage chose (holder: this rank holds the chosen row's logits), sent to
// the last stage's other cp ranks (from cp rank cp_owner, where cp > 1), then to the other
// stages. Control plane: one int over cp and pp.
static int next_token(GPT& m, const Pipeline& pl, Comm& pp, bool holder, double u01,
                      const SampleSettings& st, ops::Stream s, int cp_owner = 0) {
  int next = 0;
  if (holder) next = choose_token(gpt_logits_row(m, s), u01, st.temperature, st.top_k);
  Comm& cp = *m.layout.cp;
  if (cp.size > 1 && gpt_holds_output(m)) broadcast_host(cp, &next, sizeof(next), cp_owner);
  broadcast_host(pp, &next, sizeof(next), pl.schedule.owner(pl.schedule.p * pl.schedule.v - 1));
  return next;
}

// Every new token runs the window of the last T tokens (see sample.h).
static std::vector<int> sample_recompute(GPT& m, ParamStore& store, const Pipeline& pl,
                                         Comm& pp, std::vector<int> generated,
                                         const SampleSettings& st, ops::Stream s) {
  Comm& cp = *m.layout.cp;
  const int T = st.window;
  std::vector<int> local(T / cp.size), window(T);
  std::mt19937_64 rng(st.seed);
  const int eot = generated.front();
  for (int i = 0; i < st.tokens; i++) {
    const int len = std::min((int)generated.size(), T);
    for (int t = 0; t < T; t++) window[t] = t < len ? generated[generated.size() - len + t] : eot;
    cp_select_tokens(local.data(), window.data(), cp.size, cp.rank, 1, T);
    // The last stage's cp rank holding position len-1 samples (its head keeps that row's
    // logits); next_token sends the token on.
    int owner = 0;
    for (int r = 0; r < cp.size; r++)
      if (cp_local_index(cp.size, r, 1, T, 0, len - 1) >= 0) owner = r;
    const int row = cp_local_index(cp.size, cp.rank, 1, T, 0, len - 1);
    m.logits_row = row;
    const DocumentBatch d = documents_of(m, window.data(), 1, T);
    gpt_pipeline_forward(m, store, pl, {local.data(), nullptr, 1, 1, T / cp.size,
                                        docs_or_null(m, d.ids), docs_or_null(m, d.positions)},
                         s);
    m.logits_row = -1;
    const double u01 = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
    generated.push_back(next_token(m, pl, pp, gpt_holds_output(m) && row >= 0, u01, st, s, owner));
  }
  return generated;
}

// Runs `tokens` into the cache in chunks the model's buffers hold (prefill).
static void prefill(GPT& m, ParamStore& store, const Pipeline& pl, KvCache& kv,
                    const std::vector<int>& tokens, ops::Stream s) {
  const int most = kv_cache_chunk(m);
  for (size_t at = 0; at < tokens.size(); at += most) {
    const int n = (int)std::min(tokens.size() - at, (size_t)most);
    kv_cache_forward(m, store, pl, kv, tokens.data() + at, n, s);
  }
}

// Prefill, then one token at a time (see sample.h).
static std::vector<int> sample_cached(GPT& m, ParamStore& store, const Pipeline& pl, Comm& pp,
                                      std::vector<int> generated, const SampleSettings& st,
                                      ops::Stream s) {
  const int T = st.window;
  KvCache kv;
  kv_cache_create(kv, m, T, s);
  std::mt19937_64 rng(st.seed);
  if ((int)generated.size() > T) generated.erase(generated.begin(), generated.end() - T);
  prefill(m, store, pl, kv, generated, s);
  for (int i = 0; i < st.tokens; i++) {
    const double u01 = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
    const int next = next_token(m, pl, pp, gpt_holds_output(m), u01, st, s);
    generated.push_back(next);
    if (i + 1 == st.tokens) break;
    if (kv.pos == T) {  // the window is full: start again from its last half
      kv.pos = 0;
      prefill(m, store, pl, kv, std::vector<int>(generated.end() - T / 2, generated.end()), s);
    } else {
      kv_cache_forward(m, store, pl, kv, &next, 1, s);
    }
  }
  kv_cache_destroy(kv);
  return generated;
}

std::vector<int> sample_tokens(GPT& m, ParamStore& store, const Pipeline& pl, Comm& pp,
                               const std::vector<int>& prompt, const SampleSettings& st,
                               ops::Stream s) {
  CHECK(!prompt.empty() && st.window > 0, "sampling needs a prompt and a window");
  const bool cached = st.kv_cache && m.layout.cp->size == 1;
  std::vector<int> all = cached ? sample_cached(m, store, pl, pp, prompt, st, s)
                                : sample_recompute(m, store, pl, pp, prompt, st, s);
  return std::vector<int>(all.end() - st.tokens, all.end());
}

std::string sample_text(GPT& m, ParamStore& store, const Pipeline& pl, Comm& pp,
                        const Tokenizer& tok, int eot, const SampleSettings& st, ops::Stream s) {
  const std::vector<int> ids = sample_tokens(m, store, pl, pp, {eot}, st, s);
  return tokenizer_decode(tok, ids.data(), (int)ids.size());
}
