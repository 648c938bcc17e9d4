// model/documents.cu - document ids and in-document positions of packed rows (model/documents.h).
#include "model/documents.h"

#include "parallel/context_parallel.h"

// Row-major (B,T): ids restart at 0 in each row, positions count from each document's start.
static void row_documents(const int* tokens, int B, int T, int eot, std::vector<int>& ids,
                          std::vector<int>& positions) {
  ids.assign((size_t)B * T, 0);
  positions.assign((size_t)B * T, 0);
  for (int b = 0; b < B; b++) {
    int doc = 0, start = 0;
    for (int t = 0; t < T; t++) {
      const size_t n = (size_t)b * T + t;
      if (t > 0 && tokens[n] == eot) doc++, start = t;
      ids[n] = doc;
      positions[n] = t - start;
    }
  }
}

DocumentBatch document_batch(const int* tokens, int B, int T, int eot, int cp, int cp_rank) {
  std::vector<int> ids, positions;
  row_documents(tokens, B, T, eot, ids, positions);
  DocumentBatch d;
  d.positions.resize((size_t)B * T / cp);
  cp_select_tokens(d.positions.data(), positions.data(), cp, cp_rank, B, T);
  if (cp == 1) {
    d.ids = std::move(ids);
    return d;
  }
  const int chunks = 2 * cp, Tc = T / chunks;  // chunk g of row b: positions g*Tc .. g*Tc+Tc-1
  d.ids.resize((size_t)B * T);
  for (int g = 0; g < chunks; g++)
    for (int b = 0; b < B; b++)
      for (int t = 0; t < Tc; t++)
        d.ids[((size_t)g * B + b) * Tc + t] = ids[(size_t)b * T + g * Tc + t];
  return d;
}

std::vector<int> document_lengths(const int* tokens, int B, int T, int eot) {
  std::vector<int> lengths;
  for (int b = 0; b < B; b++) {
    int start = 0;
    for (int t = 1; t <= T; t++)
      if (t == T || tokens[(size_t)b * T + t] == eot) {
        lengths.push_back(t - start);
        start = t;
      }
  }
  return lengths;
}
