// test/comm_point_to_point.h - test/test_comm.cpp's point-to-point checks: blocking send/recv
// in a ring, send_recv (a ring, a pipeline's steady-state exchange, one-sided warm-up calls,
// messages past every eager limit; these three are test/comm_send_recv.h's forms of p2p_batch)
// and p2p_batch itself (four messages to both neighbours in one call; two tagged messages
// received in the other order). Included once, inside test_comm.cpp's anonymous namespace,
// after test/comm_test_support.h.
#pragma once

// Every rank sends to the next one and receives from the previous one. The calls block, so even
// ranks send first and odd ranks receive first: a ring of large (rendezvous) messages would
// otherwise deadlock.
void test_ring(Ctx& ctx, Comm& c, const std::vector<int>& M, size_t n, DType dt) {
  if (c.size == 1) return;  // no peer: send_to would stop the job
  const int next = (c.rank + 1) % c.size, prev = (c.rank + c.size - 1) % c.size;
  void* out = upload(values(ctx, ctx.world_rank, kRing, n, dt, true), dt);
  void* in = poisoned(n, dt);
  if (c.rank % 2 == 0) {
    send_to(c, out, n, dt, next, nullptr);
    recv_from(c, in, n, dt, prev, nullptr);
  } else {
    recv_from(c, in, n, dt, prev, nullptr);
    send_to(c, out, n, dt, next, nullptr);
  }
  expect_call(ctx, c, CollectiveKind::Send, n * dtype_size(dt));
  expect_call(ctx, c, CollectiveKind::Recv, n * dtype_size(dt));
  check_values(ctx, download(in, n, dt), values(ctx, M[prev], kRing, n, dt, true), "send/recv");
  ops::release(out);
  ops::release(in);
}

// The ring again, but every rank posts its send to the next rank and its receive from the
// previous one in one send_recv: no ordering by parity needed, even for messages far past the
// eager limit. With two ranks both peers are the same rank. On one rank: a call with both sides
// absent is a no-op and counts nothing.
void test_pair_ring(Ctx& ctx, Comm& c, const std::vector<int>& M, size_t n, DType dt) {
  if (c.size == 1) {
    send_recv(c, nullptr, n, -1, nullptr, n, -1, dt, nullptr);
    return;
  }
  const int next = (c.rank + 1) % c.size, prev = (c.rank + c.size - 1) % c.size;
  void* out = upload(values(ctx, ctx.world_rank, kPairRing, n, dt, true), dt);
  void* in = poisoned(n, dt);
  send_recv(c, out, n, next, in, n, prev, dt, nullptr);
  expect_call(ctx, c, CollectiveKind::Send, n * dtype_size(dt));
  expect_call(ctx, c, CollectiveKind::Recv, n * dtype_size(dt));
  check_values(ctx, download(in, n, dt), values(ctx, M[prev], kPairRing, n, dt, true),
               "send_recv ring");
  ops::release(out);
  ops::release(in);
}

// A pipeline's steady state: rank r sends its activation forward to r+1 and receives a gradient
// backward from r+1 in one call, while r+1 makes the mirror call (gradient to r, activation from
// r). Activations have n elements, gradients n+3 (the two sides of a call must not be mixed up).
// Even ranks make the call with their next neighbour first, odd ranks with their previous one.
void test_pipeline_exchange(Ctx& ctx, Comm& c, const std::vector<int>& M, size_t n, DType dt) {
  if (c.size == 1) return;
  const size_t ng = n + 3;
  void* act = upload(values(ctx, ctx.world_rank, kActivation, n, dt, true), dt);
  void* grad = upload(values(ctx, ctx.world_rank, kGradient, ng, dt, true), dt);
  void* act_in = poisoned(n, dt);
  void* grad_in = poisoned(ng, dt);
  for (int step = 0; step < 2; ++step) {
    const bool downstream = (step == 0) == (c.rank % 2 == 0);
    if (downstream && c.rank + 1 < c.size) {
      send_recv(c, act, n, c.rank + 1, grad_in, ng, c.rank + 1, dt, nullptr);
      check_values(ctx, download(grad_in, ng, dt),
                   values(ctx, M[c.rank + 1], kGradient, ng, dt, true), "pipeline: gradient in");
    } else if (!downstream && c.rank > 0) {
      send_recv(c, grad, ng, c.rank - 1, act_in, n, c.rank - 1, dt, nullptr);
      check_values(ctx, download(act_in, n, dt),
                   values(ctx, M[c.rank - 1], kActivation, n, dt, true), "pipeline: activation in");
    } else {
      continue;
    }
    expect_call(ctx, c, CollectiveKind::Send, (downstream ? n : ng) * dtype_size(dt));
    expect_call(ctx, c, CollectiveKind::Recv, (downstream ? ng : n) * dtype_size(dt));
  }
  for (void* p : {act, grad, act_in, grad_in}) ops::release(p);
}

// A batch of four in one p2p_batch: every rank sends one message to its next and another (n+5
// elements) to its previous rank, and receives both of its neighbours' in the same call. With
// two ranks both neighbours are one rank, and messages between a pair match in posting order.
// What a receive of a batch must hold: the values rank M[from] made with `key`.
struct Received {
  int op;  // its index in the batch
  int from, key;
  const char* what;
};

// Posts a batch of four (two sends, two receives), checks the counters and every receive, and
// releases the buffers.
void run_batch(Ctx& ctx, Comm& c, const std::vector<int>& M, const P2POp (&ops)[4], DType dt,
               const Received (&want)[2]) {
  p2p_batch(c, ops, 4, dt, nullptr);
  for (const P2POp& op : ops)
    expect_call(ctx, c, op.is_send ? CollectiveKind::Send : CollectiveKind::Recv,
                op.count * dtype_size(dt));
  for (const Received& w : want) {
    const P2POp& op = ops[w.op];
    check_values(ctx, download(op.buf, op.count, dt),
                 values(ctx, M[w.from], w.key, op.count, dt, true), w.what);
  }
  for (const P2POp& op : ops) ops::release(op.buf);
}

void test_batch_both_ways(Ctx& ctx, Comm& c, const std::vector<int>& M, size_t n, DType dt) {
  if (c.size == 1) return;
  const int next = (c.rank + 1) % c.size, prev = (c.rank + c.size - 1) % c.size;
  const size_t nb = n + 5;
  void* to_next = upload(values(ctx, ctx.world_rank, kBatchNext, n, dt, true), dt);
  void* to_prev = upload(values(ctx, ctx.world_rank, kBatchPrev, nb, dt, true), dt);
  const P2POp ops[4] = {{true, to_next, n, next}, {true, to_prev, nb, prev},
                        {false, poisoned(n, dt), n, prev}, {false, poisoned(nb, dt), nb, next}};
  run_batch(ctx, c, M, ops, dt, {{2, prev, kBatchNext, "p2p_batch: from the previous rank"},
                                 {3, next, kBatchPrev, "p2p_batch: from the next rank"}});
}

// Tags (comm_open_tags): every rank sends its next rank two messages in one batch, tag 0 (n
// elements) then tag 1 (n+3), and posts the receives of its previous rank's in the other order.
// Each lands by its tag; on one tag the first receive (n+3 elements) would take the n-element
// message. A pipeline's activations and gradients travel so (parallel/pipeline_schedule.h).
void test_tags(Ctx& ctx, Comm& c, const std::vector<int>& M, size_t n, DType dt) {
  if (c.size == 1) return;
  comm_open_tags(c, 2);  // collective over the group: every member runs this test
  const int next = (c.rank + 1) % c.size, prev = (c.rank + c.size - 1) % c.size;
  const size_t nb = n + 3;
  void* a = upload(values(ctx, ctx.world_rank, kBatchNext, n, dt, true), dt);
  void* b = upload(values(ctx, ctx.world_rank, kBatchPrev, nb, dt, true), dt);
  const P2POp ops[4] = {{true, a, n, next, 0}, {true, b, nb, next, 1},
                        {false, poisoned(nb, dt), nb, prev, 1}, {false, poisoned(n, dt), n, prev, 0}};
  run_batch(ctx, c, M, ops, dt, {{3, prev, kBatchNext, "p2p_batch tag 0, received second"},
                                 {2, prev, kBatchPrev, "p2p_batch tag 1, received first"}});
}

// One-sided calls, a pipeline's warm-up: every rank sends to r+1 and receives from r-1 in one
// call, so the first rank only sends and the last only receives. The first rank's absent side
// is a count of 0 with a valid peer, the last rank's a peer of -1 (both forms of "absent").
void test_chain(Ctx& ctx, Comm& c, const std::vector<int>& M, size_t n, DType dt) {
  if (c.size == 1) return;
  const bool first = c.rank == 0, last = c.rank == c.size - 1;
  void* out = upload(values(ctx, ctx.world_rank, kChain, n, dt, true), dt);
  void* in = poisoned(n, dt);
  send_recv(c, out, last ? 0 : n, last ? -1 : c.rank + 1, in, first ? 0 : n,
            first ? c.size - 1 : c.rank - 1, dt, nullptr);
  if (!last) expect_call(ctx, c, CollectiveKind::Send, n * dtype_size(dt));
  if (!first) {
    expect_call(ctx, c, CollectiveKind::Recv, n * dtype_size(dt));
    check_values(ctx, download(in, n, dt), values(ctx, M[c.rank - 1], kChain, n, dt, true),
                 "send_recv one-sided");
  } else {
    check(ctx, std::isnan(download(in, 1, dt)[0]), "send_recv: the absent receive wrote");
  }
  ops::release(out);
  ops::release(in);
}
