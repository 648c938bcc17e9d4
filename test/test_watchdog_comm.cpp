// test/test_watchdog_comm.cpp - the watchdog of the communicator (parallel/watchdog.h), one
// operation at a time, driven by test/test_watchdog.py:
//
//   mpirun -np 2 test_watchdog_comm <case> <timeout_s>      (env COMM_TEST_BACKEND=nccl: NCCL)
//
// Both ranks make the mesh (dp = 2) with the deadline, do one all-reduce together (the watchdog
// must not fire on operations that complete), and set the step to 7. Then rank 1 stops itself
// (SIGSTOP) and rank 0 starts the case's operation with it:
//   all-reduce   all_reduce_sum of 1001 floats on the dp axis
//   p2p          send_recv with rank 1 (a pipeline's exchange)
//   host         all_agree (a host helper: checkpoint agreement, the step's health exchange)
// and must never return: the driver checks that the job ends after timeout_s with the message,
// naming rank 0, the operation, the axis and step 7. A return prints "returned" and exits 3.
// Built twice: build/test_watchdog_comm (MPI backend, CPU buffers) and, with the NCCL stand-in,
// build/emu/test_watchdog_comm_nccl (test/emu/libs.mk).
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "parallel/mesh.h"
#include "test/comm_send_recv.h"

int main(int argc, char** argv) {
  int world_rank = 0, world_size = 1, local_rank = 0;
  runtime_init(&argc, &argv, &world_rank, &world_size, &local_rank);
  CHECK(argc == 3 && world_size == 2, "usage: mpirun -np 2 %s all-reduce|p2p|host <timeout_s>",
        argv[0]);
  const std::string what = argv[1];
  const char* backend_env = std::getenv("COMM_TEST_BACKEND");
  const bool nccl = backend_env && std::strcmp(backend_env, "nccl") == 0;
  ops::device_init(local_rank);
  Mesh mesh;
  mesh.watch.timeout_s = std::atof(argv[2]);
  MeshShape shape;
  shape.dp = 2;
  mesh_init(mesh, shape, world_rank, local_rank, nccl ? CommBackend::NCCL : CommBackend::MPI);
  Comm& dp = mesh[Axis::DP];
  const size_t n = 1001;
  float* buf = (float*)ops::alloc(2 * n * sizeof(float));
  std::vector<float> host(2 * n, 1.0f);
  ops::copy_to_device(buf, host.data(), host.size() * sizeof(float));
  all_reduce_sum(dp, buf, n, DType::F32, nullptr);  // completes: no false alarm
  ops::copy_to_host(host.data(), buf, n * sizeof(float));
  CHECK(host[0] == 2.0f && host[n - 1] == 2.0f, "the first all-reduce gave %g", host[0]);
  mesh.watch.step = 7;
  if (world_rank == 1) raise(SIGSTOP);
  if (what == "all-reduce") all_reduce_sum(dp, buf, n, DType::F32, nullptr);
  else if (what == "p2p") send_recv(dp, buf, n, 1, buf + n, n, 1, DType::F32, nullptr);
  else if (what == "host") all_agree(dp, true);
  else FATAL("unknown case %s", what.c_str());
  ops::stream_sync(nullptr);
  std::printf("returned\n");
  std::fflush(stdout);
  return 3;
}
