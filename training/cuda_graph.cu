// training/cuda_graph.cu - the step's forward and backward as one CUDA graph (training/cuda_graph.h):
// which layouts may capture, the step's inputs at fixed device addresses, and the capture and
// replay around the compute and communication streams.
//
// The streams. The graph is captured on the compute stream; the communication stream joins the
// capture when it waits for an event recorded there (the fork) and leaves it when the compute
// stream waits for one recorded on it (the join), so its collectives are nodes of the graph too.
// Around each launch, the compute stream first waits for the communication stream's earlier
// (eager) work, and afterwards the communication stream waits for the graph: the eager work
// before and after is ordered with every lane of the graph, as it was with the eager step.
#include "training/cuda_graph.h"

#include "kernels/common.h"

std::string cuda_graph_refusal(const Config& cfg, const char* backend) {
  if (std::string(backend) != "cuda") return "the CPU backend has no graphs";
  if (cfg.train.optimizer_offload != "none")
    return "optimizer offload: the host waits for each unit's gradient copy down inside the "
           "step (parallel/offload.cu)";
  if (cfg.parallel.backend == "mpi" && cfg.parallel.dp * cfg.parallel.tp * cfg.parallel.pp *
                                               cfg.parallel.cp * cfg.parallel.ep > 1)
    return "the MPI backend stages every collective through the host with a stream "
           "synchronisation (parallel/comm_mpi.cu)";
  if (cfg.model.n_experts > 0)
    return "MoE: the router's token counts come to the host inside the step and size the "
           "dispatch and the all-to-all (model/moe.cu)";
  if (cfg.log.grad_noise_scale)
    return "[log] grad_noise_scale: the small-batch norm's bookkeeping is host state the step "
           "updates (parallel/small_batch_norm.cu)";
  if (!cfg.log.trace.empty())
    return "[log] trace: the trace times each op with events the host reads (kernels/trace.h)";
  if (cfg.precision.compute == "fp8")
    return "FP8: its scaling state is not yet checked under replay";
  return "";
}

std::string step_graph_init(StepGraph& g, const Config& cfg, const char* backend,
                            ops::Stream compute, ops::Stream comm) {
  if (cfg.kernels.cuda_graph == "off") return "";
  g.eager_reason = cuda_graph_refusal(cfg, backend);
  if (!g.eager_reason.empty())
    return "graphs   [kernels] cuda_graph = \"step\" asked, the step runs eagerly: " +
           g.eager_reason + "\n";
  g.on = true;
  g.compute = compute, g.comm = comm;
  g.fork = allocate_event(g.inputs), g.join = allocate_event(g.inputs);
  g.before = allocate_event(g.inputs), g.after = allocate_event(g.inputs);
  const size_t n = (size_t)cfg.train.grad_accum * cfg.train.micro_batch * cfg.model.seq_len;
  const int cp = cfg.parallel.cp;
  g.cp = cp;
  g.tokens = (int*)allocate(g.inputs, n / cp * sizeof(int));
  g.targets = (int*)allocate(g.inputs, n / cp * sizeof(int));
  if (cfg.data.document_mask) {
    g.docs = (int*)allocate(g.inputs, n * sizeof(int));
    g.doc_positions = (int*)allocate(g.inputs, n / cp * sizeof(int));
  }
  return "graphs   the step's forward and backward captured once as a CUDA graph (step 2) and "
         "replayed from step 3; the optimizer step runs eagerly after it\n";
}

void step_graph_destroy(StepGraph& g) {
  if (g.graph) ops::graph_destroy(g.graph);
  g.graph = nullptr;
  allocator_free(g.inputs);
}

MicroBatches step_graph_inputs(StepGraph& g, const MicroBatches& mb) {
  if (!g.on) return mb;
  const size_t n = (size_t)mb.m * mb.B * mb.T;  // this rank's tokens of the step
  MicroBatches d = mb;
  ops::copy_to_device_async(g.tokens, mb.tokens, n * sizeof(int), g.compute);
  ops::copy_to_device_async(g.targets, mb.targets, n * sizeof(int), g.compute);
  d.tokens = g.tokens, d.targets = g.targets;
  if (mb.docs) {  // a micro-batch's document ids cover its full rows (B x T x cp)
    ops::copy_to_device_async(g.docs, mb.docs, n * g.cp * sizeof(int), g.compute);
    d.docs = g.docs;
  }
  if (mb.doc_positions) {
    ops::copy_to_device_async(g.doc_positions, mb.doc_positions, n * sizeof(int), g.compute);
    d.doc_positions = g.doc_positions;
  }
  d.on_device = true;
  return d;
}

// The capture: the communication stream forked in at the start and joined back at the end.
static ops::Graph capture(StepGraph& g, const std::function<void()>& step) {
  ops::graph_capture_begin(g.compute);
  ops::event_record(g.fork, g.compute);
  ops::stream_wait_event(g.comm, g.fork);
  step();
  ops::event_record(g.join, g.comm);
  ops::stream_wait_event(g.compute, g.join);
  return ops::graph_capture_end(g.compute);
}

void step_graph_run(StepGraph& g, const std::function<void()>& step, CommStats& stats) {
  g.steps++;
  if (!g.on || g.steps == 1) {  // step 1 eager: every lazy allocation happens here
    step();
    return;
  }
  const bool capturing = !g.graph;
  if (capturing) g.graph = capture(g, step);
  ops::event_record(g.before, g.comm);  // eager work on comm before the graph
  ops::stream_wait_event(g.compute, g.before);
  ops::graph_launch(g.graph, g.compute);
  ops::event_record(g.after, g.compute);  // eager work on comm after it
  ops::stream_wait_event(g.comm, g.after);
  if (capturing) {
    g.captured_stats = stats;
  } else {
    for (int a = 0; a < (int)Axis::Count; a++) stats.axis[a] = g.captured_stats.axis[a];
  }
}
