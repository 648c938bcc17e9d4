// parallel/host_threads.h - how many OpenMP threads a rank runs: the cores of its affinity mask,
// each shared among the ranks of its node whose masks hold it, unless OMP_NUM_THREADS says.
//
// Why: a launcher that binds (mpirun's default, srun with task/affinity) gives each rank its own
// cores and OpenMP's default (one thread per core of the mask) is right. A launcher that does not
// bind (srun with task/none or task/cgroup alone, `mpirun --bind-to none`, ranks started by hand)
// gives every rank of a node the same mask: with OpenMP's default, 2 ranks on 2 cores run 2
// spinning threads each, 4 on 2 cores, and each parallel region's barrier waits for a thread the
// other rank's threads have pushed off its core (measured: 10 to 20 times slower). Counting a
// core shared by k ranks as 1/k of a core gives each rank its fair part whatever the launcher.
//
// runtime_init (parallel/comm_mpi_runtime.cu) gathers the masks of the node's ranks (one
// cpu_set_t each, over the node's communicator), calls host_threads_choose and applies the
// answer with omp_set_num_threads; the banner prints host_threads().why.
#pragma once
#include <string>
#include <vector>

struct HostThreads {
  int threads = 1;
  std::string why;  // "2 cores in its affinity mask, shared with 1 other rank of its node"
};

// masks[i]: the CPUs node rank i may run on; mine: this rank's index; omp_env: the value of
// OMP_NUM_THREADS (null when unset). Threads = floor(sum over my CPUs of 1/(ranks holding it)),
// at least 1, so that the node's ranks together never run more threads than they have cores.
HostThreads host_threads_choose(const std::vector<std::vector<int>>& masks, int mine,
                                const char* omp_env);

// What runtime_init chose for this rank (threads = omp_get_max_threads() before it ran).
const HostThreads& host_threads();
void host_threads_set(const HostThreads& chosen);
