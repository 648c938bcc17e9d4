// parallel/small_batch_norm.cu - the squared norm of one dp rank's first micro-batch gradient,
// |G_small|^2, for the gradient noise scale ([log] grad_noise_scale, training/noise_scale.h),
// on every layout: dp with any ZeRO stage, tp (with or without sequence parallelism), pp (tied
// or untied embeddings), cp, dense or MoE with ep = 1, inside DiLoCo islands.
//
// What is measured. A dp rank's gradient of its first micro-batch, over the WHOLE model, before
// the dp reduction. Under model parallelism that gradient is spread over the rank's
// model-parallel group (tp x pp x cp) and each piece of it is one of three kinds:
//   (a) an owned block (a column/row-parallel weight's tp block, a pipeline stage's blocks):
//       its squares add - counted where it lives;
//   (b) replicated and already complete on every member (LayerNorms without sequence
//       parallelism, row-parallel biases): counted on one member only, the placement's owner
//       (parallel/placement.h owned_end: the split prefix on every tp rank, the replicated tail
//       on tp rank 0), as the gradient norm counts it;
//   (c) a partial sum the group still has to add: under cp every element (each cp rank saw T/cp
//       of the tokens); under tp with sequence parallelism the unit's tail [partial_begin, numel)
//       (LayerNorms that saw T/tp tokens); under pp the tied root (the embedding lookups'
//       gradient on the first stage, the head's on the last). Squares of partial sums do not
//       add, so the partial VECTOR is summed first.
// The trainer sums (c) late: cp inside the dp x cp reduction, tp and the tied root after the dp
// reduction (grads_wait). Neither gives one dp rank's sum, so the measurement sums them itself:
//   cp and tp, at the unit's first release (the first micro-batch's bucket, before its dp
//     reduction is queued): an in-place all-reduce over cp of the whole bucket, then over tp of
//     its partial tail, on the compute stream (where the model's own cp and tp collectives run,
//     in the same unit order on every member). Then the non-owners zero what they hold of it (cp
//     ranks other than 0 the bucket, tp ranks other than 0 the tail): the owner keeps the sum,
//     so the later reductions (dp x cp, tp) still add up to the same total - only its rounding
//     order changes.
//   the tied root: its two halves live on different pipeline stages, whose schedules differ, so
//     a collective between them mid-step could wait on a pipeline message (a deadlock under
//     NCCL). Instead each end stage copies its root bucket after its first micro-batch and the
//     copies are all-reduced over the embedding group in grads_wait, with the tied sum.
// Then every rank sums the squares of what it owns of each bucket, [0, owned_end) on cp rank 0
// (the tied root's last-stage copy owns nothing), and the trainer adds the ranks' scalars with
// ONE all-reduce of a double over the (island's) world: the sum over dp ranks of their
// |G_small|^2 (training/noise_scale.cu noise_scale_step divides by the dp ranks).
//
// Bytes per step, payload per rank, on top of the step's own traffic (N the rank's local
// parameters, fp32): cp > 1: 4 N over cp (all-reduce); tp > 1 with sequence parallelism: 4 x
// (the partial tails: LayerNorm weights and biases, a few C per block) over tp; pp > 1 with a
// tied root: 4 x root numel over the embedding group (2 ranks), and the root's copy (4 x root
// numel) of device memory on the two end stages; always 8 bytes over the world. With dp and
// plain tp nothing but the scalar. The planner (training/plan.cu) runs this same code dry and
// counts all of it.
//
// Experts with ep > 1 are refused (config/config_checks.cu): an expert's gradient on a rank
// mixes the tokens of the ep group's dp ranks before any reduction, so no piece of it is one dp
// rank's. Under pp every stage must measure its first micro-batch before another one adds to
// the same buffers: 1f1b does (one chunk per rank, backwards in micro-batch order, and on the
// last stage, where the head's weight gradient is added in the forward, model/gpt_head.cu, the
// first backward comes before the second forward). gpipe runs every forward first, so the last
// stage's root would hold the head gradients of all micro-batches (measured: |G_small|^2 off by
// 150%); interleaved and the zero-bubble schedules run chunks or W passes out of that order.
// Those are refused.
#include "parallel/small_batch_norm.h"

#include <algorithm>

#include "parallel/param_store.h"

// The model-parallel sums of (c) for one bucket, in place (see the top of the file).
static void sum_partials(ParamStore& st, UnitState& us) {
  Comm* cp = st.small_batch.cp;
  if (cp->size > 1) {
    all_reduce_sum(*cp, us.grad_full, us.numel, DType::F32, st.compute);
    if (cp->rank != 0) ops::fill_zero(us.grad_full, us.numel * sizeof(float), st.compute);
  }
  if (st.tp->size > 1 && us.partial_begin < us.numel) {
    const size_t tail = us.numel - us.partial_begin;
    all_reduce_sum(*st.tp, us.grad_full + us.partial_begin, tail, DType::F32, st.compute);
    if (st.tp->rank != 0)
      ops::fill_zero(us.grad_full + us.partial_begin, tail * sizeof(float), st.compute);
  }
}

static bool tied_over_stages(const ParamStore& st, const UnitState& us) {
  return us.tied && st.embed && st.embed->size > 1;
}

// What this rank owns of one dp rank's summed bucket, squared, into the squares.
static void add_owned_squares(ParamStore& st, const float* bucket, const UnitState& us) {
  if (st.small_batch.cp->rank == 0 && us.owned_end > 0)
    ops::sum_squares_accumulate(st.small_batch.squares, bucket, us.owned_end, st.compute);
}

void small_batch_init(ParamStore& st, const CommsByAxis& comms) {
  SmallBatchNorm& sb = st.small_batch;
  if (!sb.on) return;
  sb.cp = comms[Axis::CP];
  CHECK(sb.cp, "param store: the mesh has no cp group");
  sb.squares = (float*)allocate_zeroed(st.work_memory, sizeof(float), st.compute);
  sb.releases.assign(st.units.size(), 0);
  sb.tied_copy.assign(st.units.size(), nullptr);
  for (size_t u = 0; u < st.units.size(); u++)
    if (tied_over_stages(st, st.units[u]))
      sb.tied_copy[u] = (float*)allocate_zeroed(st.work_memory, st.units[u].numel * sizeof(float),
                                                st.compute);
}

void small_batch_reset(ParamStore& st) {
  SmallBatchNorm& sb = st.small_batch;
  if (sb.on) ops::fill_zero(sb.squares, sizeof(float), st.compute);
  sb.measured = false;
  std::fill(sb.releases.begin(), sb.releases.end(), 0);
}

// One unit's first-micro-batch bucket: summed over the model-parallel partial sums, then its
// owned squares added (the tied root's: kept for grads_wait).
static void measure(ParamStore& st, int unit) {
  UnitState& us = st.units[unit];
  sum_partials(st, us);
  if (tied_over_stages(st, us))  // the other half is on the other end stage: grads_wait
    ops::copy_on_device(st.small_batch.tied_copy[unit], us.grad_full, us.numel * sizeof(float),
                        st.compute);
  else add_owned_squares(st, us.grad_full, us);
}

void small_batch_on_release(ParamStore& st, int unit) {
  SmallBatchNorm& sb = st.small_batch;
  if (sb.on && sb.releases[unit]++ == 0 && !st.units[unit].whole_step) measure(st, unit);
}

void small_batch_micro_batch_done(ParamStore& st) {
  SmallBatchNorm& sb = st.small_batch;
  if (!sb.on || sb.measured) return;
  sb.measured = true;  // the whole-step units hold the first micro-batch's only
  for (size_t u = 0; u < st.units.size(); u++)
    if (st.units[u].whole_step) measure(st, (int)u);
}

void small_batch_tied_sum(ParamStore& st) {
  if (!st.small_batch.on) return;
  for (size_t u = 0; u < st.units.size(); u++)
    if (tied_over_stages(st, st.units[u]))
      all_reduce_sum(*st.embed, st.small_batch.tied_copy[u], st.units[u].numel, DType::F32,
                     st.comm);
}

void small_batch_tied_squares(ParamStore& st) {
  if (!st.small_batch.on) return;
  for (size_t u = 0; u < st.units.size(); u++)
    if (tied_over_stages(st, st.units[u]))
      add_owned_squares(st, st.small_batch.tied_copy[u], st.units[u]);
}
