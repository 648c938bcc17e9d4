// test/emu/nccl_p2p_checks.h - the point-to-point checks and the refusals of
// test/emu/test_nccl.cpp, each posting its sends and receives the way parallel/comm_nccl.cu does
// (inside ncclGroupStart/End). Included once, inside test_nccl.cpp's anonymous namespace.
#pragma once

// fp32 exact values of world rank w for check `tag`, element i.
std::vector<float> message(const Ctx& ctx, int w, int tag, size_t n) {
  std::vector<float> v(n + 2, NAN);
  for (size_t i = 0; i < n; i++) v[i] = value(ctx, w, tag, i, ncclFloat32, true);
  return v;
}

bool same(const std::vector<float>& got, const std::vector<float>& want, size_t n) {
  if (std::memcmp(got.data(), want.data(), n * sizeof(float)) != 0) return false;
  return std::isnan(got[n]) && std::isnan(got[n + 1]);  // nothing past the message
}

// One group: send to the next rank, receive from the previous, in both directions at once (a
// send to the previous rank and a receive from the next too): four transfers per rank, two per
// neighbour, matched in posting order.
void test_both_neighbours(Ctx& ctx, Group& g, size_t n) {
  const int tag_fwd = next_tag(g), tag_back = next_tag(g);
  const int next = (g.rank + 1) % g.size, prev = (g.rank + g.size - 1) % g.size;
  std::vector<float> fwd = message(ctx, ctx.world_rank, tag_fwd, n);
  std::vector<float> back = message(ctx, ctx.world_rank, tag_back, n);
  std::vector<float> from_prev(n + 2, NAN), from_next(n + 2, NAN);
  ncclGroupStart();
  ncclSend(fwd.data(), n, ncclFloat32, next, g.nccl, nullptr);
  ncclSend(back.data(), n, ncclFloat32, prev, g.nccl, nullptr);
  ncclRecv(from_prev.data(), n, ncclFloat32, prev, g.nccl, nullptr);
  ncclRecv(from_next.data(), n, ncclFloat32, next, g.nccl, nullptr);
  check(ctx, ncclGroupEnd() == ncclSuccess, "ncclGroupEnd of the exchange with both neighbours");
  check(ctx, same(from_prev, message(ctx, g.members[prev], tag_fwd, n), n) &&
                 same(from_next, message(ctx, g.members[next], tag_back, n), n),
        "exchange with both neighbours, n=" + std::to_string(n));
}

// One direction of a ring: a send and a receive in one group (a pipeline stage's send_recv).
void test_ring(Ctx& ctx, Group& g, size_t n) {
  const int tag = next_tag(g);
  const int next = (g.rank + 1) % g.size, prev = (g.rank + g.size - 1) % g.size;
  std::vector<float> out = message(ctx, ctx.world_rank, tag, n), in(n + 2, NAN);
  ncclGroupStart();
  ncclSend(out.data(), n, ncclFloat32, next, g.nccl, nullptr);
  ncclRecv(in.data(), n, ncclFloat32, prev, g.nccl, nullptr);
  check(ctx, ncclGroupEnd() == ncclSuccess, "ncclGroupEnd of the ring");
  check(ctx, same(in, message(ctx, g.members[prev], tag, n), n), "ring, n=" + std::to_string(n));
}

// comm_nccl.cu's all_to_all: per peer (oneself included) a send and a receive in one group.
void test_all_to_all(Ctx& ctx, Group& g, size_t n) {
  const int tag = next_tag(g);
  std::vector<float> out = message(ctx, ctx.world_rank, tag, n * g.size), in(n * g.size + 2, NAN);
  ncclGroupStart();
  for (int peer = 0; peer < g.size; peer++) {
    ncclSend(out.data() + peer * n, n, ncclFloat32, peer, g.nccl, nullptr);
    ncclRecv(in.data() + peer * n, n, ncclFloat32, peer, g.nccl, nullptr);
  }
  check(ctx, ncclGroupEnd() == ncclSuccess, "ncclGroupEnd of the all-to-all");
  size_t bad = 0;
  for (int j = 0; j < g.size; j++) {
    const std::vector<float> theirs = message(ctx, g.members[j], tag, n * g.size);
    bad += std::memcmp(&in[j * n], &theirs[g.rank * n], n * sizeof(float)) != 0;
  }
  check(ctx, bad == 0 && std::isnan(in[n * g.size]), "all-to-all including oneself");
}

// comm_nccl.cu's all_to_all_v: uneven counts, zero counts posting nothing on either side.
size_t a2av_count(int from, int to, size_t n) {
  return (from * 3 + to * 5 + n) % 4 == 0 ? 0 : n + from + 2 * to;
}
void test_all_to_all_v(Ctx& ctx, Group& g, size_t n) {
  const int tag = next_tag(g);
  size_t send_total = 0, recv_total = 0;
  for (int j = 0; j < g.size; j++) send_total += a2av_count(g.rank, j, n), recv_total += a2av_count(j, g.rank, n);
  std::vector<float> out = message(ctx, ctx.world_rank, tag, send_total), in(recv_total + 2, NAN);
  size_t send_at = 0, recv_at = 0;
  ncclGroupStart();
  for (int peer = 0; peer < g.size; peer++) {
    const size_t s = a2av_count(g.rank, peer, n), r = a2av_count(peer, g.rank, n);
    if (s) ncclSend(out.data() + send_at, s, ncclFloat32, peer, g.nccl, nullptr);
    if (r) ncclRecv(in.data() + recv_at, r, ncclFloat32, peer, g.nccl, nullptr);
    send_at += s, recv_at += r;
  }
  check(ctx, ncclGroupEnd() == ncclSuccess, "ncclGroupEnd of the all-to-all-v");
  size_t bad = 0, at = 0;
  for (int j = 0; j < g.size; j++) {
    size_t offset = 0;  // where j's block for me starts in j's send buffer
    for (int k = 0; k < g.rank; k++) offset += a2av_count(j, k, n);
    const size_t count = a2av_count(j, g.rank, n);
    const std::vector<float> theirs = message(ctx, g.members[j], tag, offset + count);
    bad += std::memcmp(&in[at], &theirs[offset], count * sizeof(float)) != 0;
    at += count;
  }
  check(ctx, bad == 0 && std::isnan(in[recv_total]), "all-to-all-v with zero counts");
}

// Outside a group: rank 0 sends, rank 1 receives (blocking), then back.
void test_lone_send_recv(Ctx& ctx, Group& g) {
  const int tag = next_tag(g);
  const size_t n = 7;
  std::vector<float> out = message(ctx, ctx.world_rank, tag, n), in(n + 2, NAN);
  for (int from : {0, 1}) {
    const int to = 1 - from;
    if (g.rank == from)
      check(ctx, ncclSend(out.data(), n, ncclFloat32, to, g.nccl, nullptr) == ncclSuccess, "ncclSend");
    if (g.rank == to) {
      check(ctx, ncclRecv(in.data(), n, ncclFloat32, from, g.nccl, nullptr) == ncclSuccess, "ncclRecv");
      check(ctx, same(in, message(ctx, g.members[from], tag, n), n), "send and receive outside a group");
    }
  }
}

// What the stand-in must refuse (six cases). All but the size mismatch fail before any
// communication.
void test_refusals(Ctx& ctx, Group& g) {
  std::vector<float> buf(64, 1.0f);
  ncclGroupStart();
  check(ctx, ncclAllReduce(buf.data(), buf.data(), 4, ncclFloat32, ncclSum, g.nccl, nullptr) ==
                 ncclInvalidUsage, "refuses a collective inside a group");
  check(ctx, ncclGroupEnd() == ncclSuccess, "an empty group ends");
  check(ctx, ncclAllReduce(buf.data(), buf.data(), 4, ncclFloat32, ncclProd, g.nccl, nullptr) ==
                 ncclInvalidUsage, "refuses ncclProd");
  check(ctx, ncclAllReduce(buf.data(), buf.data() + 1, 4, ncclFloat32, ncclSum, g.nccl, nullptr) ==
                 ncclInvalidArgument, "refuses partly overlapping buffers");
  check(ctx, ncclSend(buf.data(), 4, ncclFloat32, g.rank, g.nccl, nullptr) == ncclInvalidUsage,
        "refuses a send to oneself outside a group");
  check(ctx, ncclGroupEnd() == ncclInvalidUsage, "refuses ncclGroupEnd without ncclGroupStart");
  check(ctx, std::string(ncclGetLastError(nullptr)).find("NCCL stand-in") == 0 &&
                 std::string(ncclGetErrorString(ncclInvalidUsage)).size() > 0,
        "ncclGetLastError and ncclGetErrorString say what happened");
  // Rank 1 posts a receive of 5 elements for rank 0's send of 3: rank 1 must be told.
  if (g.rank > 1) return;
  ncclGroupStart();
  if (g.rank == 0) ncclSend(buf.data(), 3, ncclFloat32, 1, g.nccl, nullptr);
  if (g.rank == 1) ncclRecv(buf.data() + 8, 5, ncclFloat32, 0, g.nccl, nullptr);
  const ncclResult_t r = ncclGroupEnd();
  check(ctx, r == (g.rank == 1 ? ncclInvalidUsage : ncclSuccess),
        "a receive larger than its send is reported");
}
