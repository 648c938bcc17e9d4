// parallel/host_threads.cu - the OpenMP threads of a rank from the affinity masks of its node's
// ranks (the why and the rule: parallel/host_threads.h). Pure arithmetic on CPU lists; the masks
// are gathered and the answer applied by runtime_init (parallel/comm_mpi_runtime.cu).
#include "parallel/host_threads.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>

namespace {
HostThreads& chosen_threads() {
  static HostThreads h;
  return h;
}
}  // namespace

HostThreads host_threads_choose(const std::vector<std::vector<int>>& masks, int mine,
                                const char* omp_env) {
  HostThreads h;
  const std::vector<int>& cpus = masks[mine];
  if (omp_env && *omp_env) {
    h.threads = std::max(1, std::atoi(omp_env));
    h.why = std::string("OMP_NUM_THREADS=") + omp_env;
    return h;
  }
  std::map<int, int> holders;  // CPU -> ranks of the node whose mask holds it
  for (const std::vector<int>& m : masks)
    for (int cpu : m) holders[cpu]++;
  double share = 0;
  int shared = 0, most = 1;
  for (int cpu : cpus) {
    share += 1.0 / holders[cpu];
    if (holders[cpu] > 1) shared++;
    most = std::max(most, holders[cpu]);
  }
  h.threads = std::max(1, (int)(share + 1e-9));
  char text[160];
  const int n = (int)cpus.size();
  if (shared == 0)
    std::snprintf(text, sizeof(text), "%d core%s in its affinity mask, none shared with "
                  "another rank of its node", n, n == 1 ? "" : "s");
  else
    std::snprintf(text, sizeof(text), "%d core%s in its affinity mask, %d of them shared by up "
                  "to %d ranks of its node", n, n == 1 ? "" : "s", shared, most);
  h.why = text;
  return h;
}

const HostThreads& host_threads() { return chosen_threads(); }
void host_threads_set(const HostThreads& chosen) { chosen_threads() = chosen; }
