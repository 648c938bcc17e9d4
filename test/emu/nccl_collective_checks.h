// test/emu/nccl_collective_checks.h - the collective checks of test/emu/test_nccl.cpp: each
// fills its buffers with values every rank can recompute (value()), calls the stand-in, and
// compares with the independently computed result. Included once, inside test_nccl.cpp's
// anonymous namespace (after Ctx, Buffer, Group and value()).
#pragma once

// Every member calls the same checks in the same order on a group, so a count of them names
// each call alike everywhere.
int next_tag(Group& g) { return ++g.calls; }

// Tolerance of a general sum: fp32 adds (n-1) roundings of at most 2^-24 sum|x|; bf16 also
// rounds once to bf16 (half an ulp of the result; one ulp allowed).
double sum_tolerance(double exact, double abs_sum, int n, ncclDataType_t dt) {
  const double fp32 = (n - 1) * std::ldexp(abs_sum, -24);
  if (dt == ncclFloat32) return fp32 > 0 ? fp32 : 1e-300;
  int e = 0;
  std::frexp(exact, &e);
  return fp32 + std::ldexp(1.0, std::max(e - 8, -133));
}

void test_all_reduce(Ctx& ctx, Group& g, size_t n, ncclDataType_t dt, ncclRedOp_t op, bool in_place,
                     bool exact) {
  const int tag = next_tag(g);
  Buffer send(dt, n), recv(dt, n);
  for (size_t i = 0; i < n; i++) send.set(i, value(ctx, ctx.world_rank, tag, i, dt, exact));
  Buffer& out = in_place ? send : recv;
  check(ctx, ncclAllReduce(send.at(0), out.at(0), n, dt, op, g.nccl, nullptr) == ncclSuccess,
        "ncclAllReduce status");
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) {
    double want = op == ncclSum ? 0.0 : -INFINITY, abs_sum = 0.0;
    for (int m : g.members) {
      const double x = value(ctx, m, tag, i, dt, exact);
      want = op == ncclSum ? want + x : std::max(want, x);
      abs_sum += std::fabs(x);
    }
    const double err = std::fabs(out.get(i) - want);
    if (op == ncclMax || exact) {
      bad += err != 0.0;
    } else {
      const double ratio = err / sum_tolerance(want, abs_sum, g.size, dt);
      ctx.worst_sum_ratio = std::max(ctx.worst_sum_ratio, ratio);
      bad += !(ratio <= 1.0);
    }
  }
  const std::string what = std::string(op == ncclSum ? "sum" : "max") + (exact ? " exact" : " general") +
                           (in_place ? " in place" : "");
  check(ctx, bad == 0, "all-reduce " + what + ": " + std::to_string(bad) + " wrong elements");
  check(ctx, out.tail_poisoned(n), "all-reduce " + what + " wrote past the buffer");
  check_same_everywhere(ctx, g, out, n, "all-reduce");
}

// in_place: recv is block `rank` of send (NCCL's in-place convention).
void test_reduce_scatter(Ctx& ctx, Group& g, size_t n, ncclDataType_t dt, bool in_place) {
  const int tag = next_tag(g);
  Buffer send(dt, n * g.size), recv(dt, n);
  for (size_t i = 0; i < n * g.size; i++) send.set(i, value(ctx, ctx.world_rank, tag, i, dt, true));
  void* out = in_place ? send.at(g.rank * n) : recv.at(0);
  check(ctx, ncclReduceScatter(send.at(0), out, n, dt, ncclSum, g.nccl, nullptr) == ncclSuccess,
        "ncclReduceScatter status");
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) {
    double want = 0.0;
    for (int m : g.members) want += value(ctx, m, tag, g.rank * n + i, dt, true);
    bad += (in_place ? send.get(g.rank * n + i) : recv.get(i)) != want;
  }
  check(ctx, bad == 0, std::string("reduce-scatter") + (in_place ? " in place" : "") + ": " +
                           std::to_string(bad) + " wrong elements");
  if (!in_place) check(ctx, recv.tail_poisoned(n), "reduce-scatter wrote past its block");
}

// in_place: send is block `rank` of recv.
void test_all_gather(Ctx& ctx, Group& g, size_t n, ncclDataType_t dt, bool in_place) {
  const int tag = next_tag(g);
  Buffer send(dt, n), recv(dt, n * g.size);
  for (size_t i = 0; i < n; i++) {
    send.set(i, value(ctx, ctx.world_rank, tag, i, dt, false));
    if (in_place) recv.set(g.rank * n + i, value(ctx, ctx.world_rank, tag, i, dt, false));
  }
  const void* in = in_place ? recv.at(g.rank * n) : send.at(0);
  check(ctx, ncclAllGather(in, recv.at(0), n, dt, g.nccl, nullptr) == ncclSuccess,
        "ncclAllGather status");
  size_t bad = 0;
  for (int j = 0; j < g.size; j++)
    for (size_t i = 0; i < n; i++) bad += recv.get(j * n + i) != value(ctx, g.members[j], tag, i, dt, false);
  check(ctx, bad == 0, std::string("all-gather") + (in_place ? " in place" : "") + ": " +
                           std::to_string(bad) + " wrong elements");
  check(ctx, recv.tail_poisoned(n * g.size), "all-gather wrote past the buffer");
}

void test_all_gather_bytes(Ctx& ctx, Group& g, size_t n) {
  const int tag = next_tag(g);
  std::vector<unsigned char> send(n), recv(n * g.size + 2, 0xEE);
  for (size_t i = 0; i < n; i++) send[i] = (unsigned char)mix(ctx.seed ^ mix(ctx.world_rank * 1000 + tag * 100 + i));
  check(ctx, ncclAllGather(send.data(), recv.data(), n, ncclUint8, g.nccl, nullptr) == ncclSuccess,
        "ncclAllGather uint8 status");
  size_t bad = 0;
  for (int j = 0; j < g.size; j++)
    for (size_t i = 0; i < n; i++)
      bad += recv[j * n + i] != (unsigned char)mix(ctx.seed ^ mix(g.members[j] * 1000 + tag * 100 + i));
  check(ctx, bad == 0 && recv[n * g.size] == 0xEE, "all-gather of bytes");
}

// root 0: in place; the last rank: from a separate send buffer on the root.
void test_broadcast(Ctx& ctx, Group& g, size_t n, ncclDataType_t dt, int root) {
  const int tag = next_tag(g);
  const bool in_place = root == 0;
  Buffer send(dt, n), buf(dt, n);
  for (size_t i = 0; i < n; i++) {
    send.set(i, value(ctx, ctx.world_rank, tag, i, dt, false));
    if (in_place) buf.set(i, value(ctx, ctx.world_rank, tag, i, dt, false));
  }
  const void* in = in_place ? buf.at(0) : send.at(0);
  check(ctx, ncclBroadcast(in, buf.at(0), n, dt, root, g.nccl, nullptr) == ncclSuccess,
        "ncclBroadcast status");
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) bad += buf.get(i) != value(ctx, g.members[root], tag, i, dt, false);
  check(ctx, bad == 0, "broadcast from rank " + std::to_string(root) + ": " + std::to_string(bad) +
                           " wrong elements");
  check(ctx, buf.tail_poisoned(n), "broadcast wrote past the buffer");
}
