// test/comm_send_recv.h - point-to-point calls by the message: send_to, recv_from and the paired
// send_recv, the one- and two-message forms of p2p_batch (parallel/comm.h), which the trainer
// itself never needs (its pipeline posts whole runs of messages with p2p_batch). The
// communicator tests use them for rings and a pipeline's exchange: test/comm_point_to_point.h,
// test/test_comm.cpp's Count backend check, test/test_watchdog_comm.cpp.
//
// send_to and recv_from block on the MPI backend: two ranks that both send a large message to
// each other first wait for each other forever. send_recv posts a send and a receive as one
// operation (NCCL: one group; MPI: Isend + Irecv + Waitall), so a pipeline stage can send its
// activation forward and receive a gradient backward in one call, whatever order its neighbours
// reach theirs. All three use tag 0: they match each other in posting order per pair of ranks.
#pragma once
#include "parallel/comm.h"

inline void send_to(Comm& c, const void* buf, size_t count, DType dt, int peer, ops::Stream s) {
  const P2POp op{true, const_cast<void*>(buf), count, peer};
  p2p_batch(c, &op, 1, dt, s);
}

inline void recv_from(Comm& c, void* buf, size_t count, DType dt, int peer, ops::Stream s) {
  const P2POp op{false, buf, count, peer};
  p2p_batch(c, &op, 1, dt, s);
}

// Sends send_count elements to send_peer and receives recv_count elements from recv_peer, both
// posted before either is waited for. The two peers may be one rank or two different ones (never
// this rank). A side whose peer is -1 is absent (its buffer and count are ignored), and a side
// with count 0 posts nothing (its peer is still checked): the matching rank must then skip its
// side too. Both sides absent: a no-op, also on a one-rank group. send and recv must not overlap.
inline void send_recv(Comm& c, const void* send, size_t send_count, int send_peer, void* recv,
                      size_t recv_count, int recv_peer, DType dt, ops::Stream s) {
  P2POp ops[2];
  int n = 0;
  if (send_peer != -1) ops[n++] = {true, const_cast<void*>(send), send_count, send_peer};
  if (recv_peer != -1) ops[n++] = {false, recv, recv_count, recv_peer};
  p2p_batch(c, ops, n, dt, s);
}
