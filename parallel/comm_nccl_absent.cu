// parallel/comm_nccl_absent.cu - what ./train_cpu (and the CPU test programs) link in place of the
// NCCL backend (parallel/comm_nccl.cu): asking for NCCL stops the job with a message that says
// how to fix the config. mesh_init calls nccl_require() whenever backend = nccl (even on one
// rank, where no NCCL communicator would be made); the other functions cannot be reached after
// that and stop the same way if they are.
#include "parallel/comm.h"

namespace nccl_absent {

[[noreturn]] void absent() {
  FATAL("this binary was built without NCCL; use [parallel] backend = \"mpi\"");
}

void all_reduce_sum(Comm&, void*, size_t, DType, ops::Stream) { absent(); }
void all_reduce_max(Comm&, float*, size_t, ops::Stream) { absent(); }
void reduce_scatter_sum(Comm&, const void*, void*, size_t, DType, ops::Stream) { absent(); }
void all_gather(Comm&, const void*, void*, size_t, DType, ops::Stream) { absent(); }
void broadcast(Comm&, void*, size_t, DType, int, ops::Stream) { absent(); }
void p2p_batch(Comm&, const P2POp*, int, DType, ops::Stream) { absent(); }
void all_to_all(Comm&, const void*, void*, size_t, DType, ops::Stream) { absent(); }
void all_to_all_v(Comm&, const void*, const size_t*, void*, const size_t*, DType, ops::Stream) {
  absent();
}

}  // namespace nccl_absent

const CollectiveBackend kNcclCollectives = {
    nccl_absent::all_reduce_sum, nccl_absent::all_reduce_max, nccl_absent::reduce_scatter_sum,
    nccl_absent::all_gather,     nccl_absent::broadcast,      nccl_absent::p2p_batch,
    nccl_absent::all_to_all,     nccl_absent::all_to_all_v};

void nccl_require() { nccl_absent::absent(); }
void* nccl_create(Comm&) { nccl_absent::absent(); }
void nccl_destroy(Comm&, void*) { nccl_absent::absent(); }
