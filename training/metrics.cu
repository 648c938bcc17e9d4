// training/metrics.cu - step lines, JSONL metrics, the FLOP counts behind MFU and a step's
// throughput and FP8 snapshot (training/metrics.h).
#include "training/metrics.h"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "config/device_peaks.h"
#include "parallel/param_store.h"

FlopsPerToken flops_per_token(const GPTLayout& g, Recompute r) {
  const double C = g.C, Vp = g.Vp, LTd = (double)g.L * g.T * g.C;
  const bool tied = g.tied;
  FlopsPerToken f;
  f.matmul_parameters = (double)g.active_parameters - (tied ? 0.0 : Vp * C);
  f.causal = 6.0 * f.matmul_parameters + 6.0 * LTd;
  f.full = 6.0 * f.matmul_parameters + 12.0 * LTd;
  f.hardware = f.causal;
  f.attention = f.hardware_attention = 6.0 * LTd;
  if (r == Recompute::Block) {  // the blocks' forward again: N but the root's parameters
    const double root = g.llama ? Vp * C + C : (Vp + g.maxT) * C + 2.0 * C;  // head, ln_f, wpe
    f.hardware += 2.0 * (f.matmul_parameters - root) + 2.0 * LTd;
    f.hardware_attention += 2.0 * LTd;
  }
  return f;
}

double run_peak_tflops(const std::string& device_name, const std::string& compute,
                       double override_tflops, std::string* source) {
  if (override_tflops > 0) {
    *source = "[log] peak_tflops";
    return override_tflops;
  }
  const DevicePeak* d = device_peak_by_driver_name(device_name);
  if (!d) {
    *source = "unknown device";
    return 0;
  }
  *source = std::string(d->name) + (compute == "fp8" ? " dense FP8" : " dense BF16") + " (" +
            d->source + ")";
  return device_peak_tflops(*d, compute);
}

// The kind of a metrics line: a run record (its first step in *step, 1 when it does not say), a
// step or validation record (its step), or anything else (a line cut short by a kill).
enum class Line { Run, Step, Other };
static Line parse_line(const std::string& line, int* step) {
  if (line.empty() || line.back() != '}') return Line::Other;
  if (line.compare(0, 7, "{\"run\":") == 0) {
    const size_t at = line.find("\"first_step\":");
    *step = at == std::string::npos ? 1 : std::atoi(line.c_str() + at + 13);
    return Line::Run;
  }
  return std::sscanf(line.c_str(), "{\"step\":%d", step) == 1 ? Line::Step : Line::Other;
}

static void drop_steps_after(const std::string& path, int resumed_step) {
  std::vector<std::string> lines;
  {
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) lines.push_back(line);
  }
  size_t continued = lines.size();  // the run record of the run being continued
  for (size_t i = 0; i < lines.size(); i++) {
    int first = 0;
    if (parse_line(lines[i], &first) == Line::Run && first <= resumed_step + 1) continued = i;
  }
  if (continued == lines.size()) return;
  std::string kept;
  size_t dropped = 0;
  for (size_t i = 0; i < lines.size(); i++) {
    int step = 0;
    const Line kind = parse_line(lines[i], &step);
    const bool keep = i <= continued || (kind == Line::Step && step <= resumed_step);
    if (keep) kept += lines[i] + "\n";
    else dropped++;
  }
  if (dropped == 0) return;
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "w");
  CHECK(f && std::fwrite(kept.data(), 1, kept.size(), f) == kept.size() && std::fclose(f) == 0 &&
            std::rename(tmp.c_str(), path.c_str()) == 0,
        "[log] metrics: cannot rewrite %s: %s", path.c_str(), std::strerror(errno));
  std::printf("metrics  %s: dropped %zu record(s) past step %d, written before the run resumed "
              "here stopped\n", path.c_str(), dropped, resumed_step);
}

void metrics_open(MetricsLog& log, const std::string& path, bool is_rank0, int resumed_step) {
  if (!is_rank0 || path.empty()) return;
  if (resumed_step > 0 && access(path.c_str(), F_OK) == 0) drop_steps_after(path, resumed_step);
  log.path = path;
  log.jsonl = std::fopen(path.c_str(), "a");
  CHECK(log.jsonl, "[log] metrics: cannot open %s for appending: %s", path.c_str(),
        std::strerror(errno));
}

// Flushes a record and stops the job if any part of it could not be written.
static void flush_checked(MetricsLog& log) {
  errno = 0;
  if (std::fflush(log.jsonl) == 0 && !std::ferror(log.jsonl)) return;
  FATAL("[log] metrics: cannot write %s: %s", log.path.c_str(),
        errno ? std::strerror(errno) : "write error");
}

void metrics_close(MetricsLog& log) {
  if (log.jsonl) std::fclose(log.jsonl);
  log.jsonl = nullptr;
}

void metrics_run(MetricsLog& log, const RunInfo& i) {
  if (!log.jsonl) return;
  std::fprintf(log.jsonl,
               "{\"run\":{\"parameters\":%zu,\"state_bytes\":%zu,\"activation_bytes\":%zu,"
               "\"host_bytes\":%zu,\"disk_bytes\":%zu,\"world_size\":%d,"
               "\"flops_per_token\":%.0f,\"flops_per_token_full\":%.0f,"
               "\"hardware_flops_per_token\":%.0f,\"matmul_parameters\":%.0f,"
               "\"peak_tflops\":%.6g,\"first_step\":%d}}\n",
               i.parameters, i.state_bytes, i.activation_bytes, i.host_bytes, i.disk_bytes,
               i.world_size, i.flops.causal, i.flops.full, i.flops.hardware,
               i.flops.matmul_parameters, i.peak_tflops, i.first_step);
  flush_checked(log);
}

void metrics_end(MetricsLog& log, const std::vector<size_t>& mem_peak_bytes) {
  if (!log.jsonl) return;
  std::fprintf(log.jsonl, "{\"end\":{\"mem_peak_bytes\":[");
  for (size_t i = 0; i < mem_peak_bytes.size(); i++)
    std::fprintf(log.jsonl, "%s%zu", i ? "," : "", mem_peak_bytes[i]);
  std::fprintf(log.jsonl, "]}}\n");
  flush_checked(log);
}

static void print_fraction(FILE* f, const char* key, double x) {
  if (x < 0) std::fprintf(f, ",\"%s\":null", key);
  else std::fprintf(f, ",\"%s\":%.6f", key, x);
}

static const char* const kKindNames[] = {"all_reduce", "reduce_scatter", "all_gather",
                                         "broadcast",  "send",           "recv",
                                         "all_to_all", "barrier"};

void print_comm_json(FILE* f, const CommStats& st) {
  std::fprintf(f, ",\"comm\":{");
  bool first_axis = true;
  for (int a = 0; a < (int)Axis::Count; a++) {
    const CommCounters& c = st.axis[a];
    bool used = false;
    for (int k = 0; k < (int)CollectiveKind::Count; k++) used |= c.calls[k] > 0;
    if (!used) continue;
    std::fprintf(f, "%s\"%s\":{", first_axis ? "" : ",", axis_name((Axis)a));
    first_axis = false;
    bool first_kind = true;
    for (int k = 0; k < (int)CollectiveKind::Count; k++) {
      if (!c.calls[k]) continue;
      std::fprintf(f, "%s\"%s\":{\"calls\":%llu,\"bytes\":%llu}", first_kind ? "" : ",",
                   kKindNames[k], (unsigned long long)c.calls[k],
                   (unsigned long long)c.bytes[k]);
      first_kind = false;
    }
    std::fprintf(f, "}");
  }
  std::fprintf(f, "}");
}

// "m:ss" or "h:mm:ss".
static std::string duration_text(double seconds) {
  const long s = std::lround(seconds > 0 ? seconds : 0);
  char buf[32];
  if (s >= 3600) std::snprintf(buf, sizeof(buf), "%ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
  else std::snprintf(buf, sizeof(buf), "%ld:%02ld", s / 60, s % 60);
  return buf;
}

// An MoE model's part of the step line: the router losses and the worst layer's load, the
// busiest expert's pairs over the mean (1 = perfectly balanced).
static std::string moe_text(const StepReport& r) {
  if (!r.moe) return "";
  double worst = 0, dropped = 0;
  for (const MoeLayerReport& l : r.moe_report.layers) {
    if (l.mean > 0) worst = std::max(worst, l.max / l.mean);
    dropped = std::max(dropped, l.dropped);
  }
  char buf[128];
  int n = std::snprintf(buf, sizeof(buf), " | aux %.4f z %.4f | expert load max/mean %.2f",
                        r.moe_report.aux_loss, r.moe_report.z_loss, worst);
  if (dropped > 0)  // [train] moe_capacity_factor: the worst layer's dropped fraction
    std::snprintf(buf + n, sizeof(buf) - n, " dropped %.3f", dropped);
  return buf;
}

// `,"offload":{"to_host_bytes":n,...}`: a step's offload traffic, as the planner's JSON has it.
void print_offload_json(FILE* f, const OffloadStats& st) {
  std::fprintf(f, ",\"offload\":{\"to_host_bytes\":%llu,\"to_device_bytes\":%llu,"
               "\"disk_read_bytes\":%llu,\"disk_write_bytes\":%llu}",
               (unsigned long long)st.to_host_bytes, (unsigned long long)st.to_device_bytes,
               (unsigned long long)st.disk_read_bytes, (unsigned long long)st.disk_write_bytes);
}

// " | host 1.20 GiB, optimizer 35.1 ms" under optimizer offload.
static std::string offload_text(const StepReport& r) {
  if (!r.offload) return "";
  char buf[96];
  std::snprintf(buf, sizeof(buf), " | host %.2f GiB, optimizer %.1f ms",
                r.host_bytes / 1073741824.0, r.offload_stats.host_ms);
  return buf;
}

static void print_step_line(const StepReport& r) {
  char mfu[64] = "MFU n/a";
  if (r.mfu >= 0)
    std::snprintf(mfu, sizeof(mfu), "MFU %.1f%% (HFU %.1f%%)", 100 * r.mfu, 100 * r.hfu);
  std::string progress;
  if (r.elapsed_s >= 0)
    progress = " | " + duration_text(r.elapsed_s) + " elapsed, " +
               (r.eta_s >= 0 ? duration_text(r.eta_s) : std::string("?")) + " left";
  char ckpt[48] = "";
  if (r.ckpt_wait_ms >= 0) std::snprintf(ckpt, sizeof(ckpt), " | ckpt copy %.1f ms", r.ckpt_wait_ms);
  char noise[48] = "";
  if (r.noise) std::snprintf(noise, sizeof(noise), " | B_noise %.4g", noise_scale_simple(r.noise_scale));
  std::printf("step %5d/%d | loss %.6f%s | lr %.3e | norm %.4f%s | %.1f ms%s | %.0f tok/s | %s | "
              "mem %.2f GiB (peak %.2f)%s%s%s%s\n",
              r.step, r.steps, r.loss, moe_text(r).c_str(), r.lr, r.grad_norm, noise, r.ms, ckpt,
              r.tokens_per_s, mfu,
              r.mem_bytes / 1073741824.0, r.mem_peak_bytes / 1073741824.0,
              offload_text(r).c_str(), progress.c_str(), r.note.empty() ? "" : " | ",
              r.note.c_str());
  std::fflush(stdout);
}

// `,"aux_loss":x,"z_loss":x,"moe":[{"layer":l,"min":..,"max":..,"mean":..,"tokens":[..],
// "dropped":x}..]` (dropped: the fraction of the layer's pairs the capacity dropped)
static void print_moe_json(FILE* f, const MoeReport& m) {
  std::fprintf(f, ",\"aux_loss\":%.9g,\"z_loss\":%.9g,\"moe\":[", m.aux_loss, m.z_loss);
  for (size_t i = 0; i < m.layers.size(); i++) {
    const MoeLayerReport& l = m.layers[i];
    std::fprintf(f, "%s{\"layer\":%d,\"min\":%.0f,\"max\":%.0f,\"mean\":%.9g,\"tokens\":[",
                 i ? "," : "", l.layer, l.min, l.max, l.mean);
    for (size_t e = 0; e < l.tokens.size(); e++)
      std::fprintf(f, "%s%.0f", e ? "," : "", l.tokens[e]);
    std::fprintf(f, "],\"dropped\":%.9g}", l.dropped);
  }
  std::fprintf(f, "]");
}

void metrics_step(MetricsLog& log, const StepReport& r, const CommStats& comm, bool print_line) {
  if (print_line) print_step_line(r);
  if (!log.jsonl) return;
  std::fprintf(log.jsonl,
               "{\"step\":%d,\"loss\":%.9g,\"lr\":%.9g,\"grad_norm\":%.9g,\"ms\":%.3f,"
               "\"tokens_per_s\":%.1f",
               r.step, r.loss, r.lr, r.grad_norm, r.ms, r.tokens_per_s);
  print_fraction(log.jsonl, "mfu", r.mfu);
  print_fraction(log.jsonl, "mfu_full", r.mfu_full);
  print_fraction(log.jsonl, "hfu", r.hfu);
  std::fprintf(log.jsonl, ",\"model_tflops_per_gpu\":%.6g,\"hardware_tflops_per_gpu\":%.6g",
               r.model_tflops_per_gpu, r.hardware_tflops_per_gpu);
  std::fprintf(log.jsonl, ",\"mem_bytes\":%zu,\"mem_peak_bytes\":%zu", r.mem_bytes,
               r.mem_peak_bytes);
  if (r.offload) {
    std::fprintf(log.jsonl, ",\"host_bytes\":%zu,\"host_optimizer_ms\":%.3f", r.host_bytes,
                 r.offload_stats.host_ms);
    print_offload_json(log.jsonl, r.offload_stats);
  }
  if (r.elapsed_s >= 0) std::fprintf(log.jsonl, ",\"elapsed_s\":%.3f", r.elapsed_s);
  if (r.ckpt_wait_ms >= 0) std::fprintf(log.jsonl, ",\"ckpt_wait_ms\":%.3f", r.ckpt_wait_ms);
  if (r.noise) {  // training/noise_scale.h
    const NoiseScale& n = r.noise_scale;
    std::fprintf(log.jsonl, ",\"noise_scale\":{\"b_simple\":%.9g,\"small_sq\":%.9g,"
                 "\"big_sq\":%.9g,\"b_small\":%g,\"b_big\":%g,\"grad_sq\":%.9g,\"trace\":%.9g}",
                 noise_scale_simple(n), n.small_sq, n.big_sq, n.b_small, n.b_big, n.grad_sq,
                 n.trace);
  }
  if (!r.fp8.empty()) {
    std::fprintf(log.jsonl, ",\"fp8\":{");
    for (size_t i = 0; i < r.fp8.size(); i++)
      std::fprintf(log.jsonl, "%s\"%s\":{\"amax\":%.9g,\"scale\":%.9g}", i ? "," : "",
                   r.fp8[i].name.c_str(), r.fp8[i].amax, r.fp8[i].scale);
    std::fprintf(log.jsonl, "}");
  }
  if (r.moe) print_moe_json(log.jsonl, r.moe_report);
  if (r.attention_fraction >= 0)
    std::fprintf(log.jsonl, ",\"attention_fraction\":%.9g", r.attention_fraction);
  if (!r.data_rows.empty()) {  // several datasets: the step's rows from each (data/data_mix.h)
    std::fprintf(log.jsonl, ",\"data_rows\":[");
    for (size_t k = 0; k < r.data_rows.size(); k++)
      std::fprintf(log.jsonl, "%s%lld", k ? "," : "", (long long)r.data_rows[k]);
    std::fprintf(log.jsonl, "]");
  }
  print_comm_json(log.jsonl, comm);
  std::fprintf(log.jsonl, "}\n");
  flush_checked(log);
}

void metrics_val(MetricsLog& log, int step, double val_loss) {
  if (!log.jsonl) return;
  std::fprintf(log.jsonl, "{\"step\":%d,\"val_loss\":%.9g}\n", step, val_loss);
  flush_checked(log);
}

void metrics_eval(MetricsLog& log, int step, int correct, int examples) {
  if (!log.jsonl) return;
  std::fprintf(log.jsonl, "{\"step\":%d,\"eval_acc\":%.9g,\"eval_correct\":%d,"
               "\"eval_examples\":%d}\n", step, examples ? (double)correct / examples : 0.0,
               correct, examples);
  flush_checked(log);
}

void RunSummary::add(double step_tokens, double step_seconds) {
  if (!have_first) {
    have_first = true;
    first_tokens = step_tokens, first_seconds = step_seconds;
    return;
  }
  steps++;
  tokens += step_tokens;
  seconds += step_seconds;
}

void metrics_summary(MetricsLog& log, const RunSummary& s, const RunInfo& info, bool print) {
  if (!s.have_first) return;
  const bool rest = s.steps > 0;
  const int steps = rest ? s.steps : 1;
  const double tokens_per_s = rest ? s.tokens / s.seconds : s.first_tokens / s.first_seconds;
  const FlopsPerToken& f = info.flops;
  const double per_gpu = tokens_per_s / info.world_size / 1e12;  // tokens/s per GPU, in 1e12
  const double model_tflops = per_gpu * f.causal, full_tflops = per_gpu * f.full,
               hardware_tflops = per_gpu * f.hardware;
  const double peak = info.peak_tflops;
  if (print) {
    std::printf("summary  %d step(s)%s: %.0f tokens/s, %.3g TFLOP/s per GPU of model FLOPs "
                "(%.3g counting attention in full, %.3g executed)\n", steps,
                rest ? " after the first" : "", tokens_per_s, model_tflops, full_tflops,
                hardware_tflops);
    std::printf("summary  FLOPs per token: %.4g with causal attention at half (llm.c, Megatron), "
                "%.4g at full (PaLM, torchtitan), %.4g executed; N = %.4g\n", f.causal, f.full,
                f.hardware, f.matmul_parameters);
    if (peak > 0)
      std::printf("summary  MFU %.2f%% (causal at half), %.2f%% (at full), HFU %.2f%% of %.4g "
                  "TFLOP/s per GPU\n", 100 * model_tflops / peak, 100 * full_tflops / peak,
                  100 * hardware_tflops / peak, peak);
    else
      std::printf("summary  MFU not reported: no peak known for this device ([log] peak_tflops)\n");
    std::fflush(stdout);
  }
  if (!log.jsonl) return;
  std::fprintf(log.jsonl, "{\"summary\":{\"steps\":%d,\"tokens_per_s\":%.6g,"
               "\"flops_per_token\":%.0f,\"flops_per_token_full\":%.0f,"
               "\"hardware_flops_per_token\":%.0f,\"model_tflops_per_gpu\":%.6g,"
               "\"model_tflops_per_gpu_full\":%.6g,\"hardware_tflops_per_gpu\":%.6g,"
               "\"peak_tflops\":%.6g", steps, tokens_per_s, f.causal, f.full, f.hardware,
               model_tflops, full_tflops, hardware_tflops, peak);
  print_fraction(log.jsonl, "mfu", peak > 0 ? model_tflops / peak : -1);
  print_fraction(log.jsonl, "mfu_full", peak > 0 ? full_tflops / peak : -1);
  print_fraction(log.jsonl, "hfu", peak > 0 ? hardware_tflops / peak : -1);
  std::fprintf(log.jsonl, "}}\n");
  flush_checked(log);
}

// ---------------------------------------------------------------------------------------------
// The arithmetic of a step's report
// ---------------------------------------------------------------------------------------------
void step_throughput(StepReport& r, const RunInfo& info, double tokens,
                     double attention_fraction) {
  r.tokens_per_s = tokens / (r.ms / 1000.0);
  FlopsPerToken f = info.flops;  // attention within documents only: its share (Megatron's count)
  const double skipped = 1.0 - attention_fraction;
  f.causal -= skipped * f.attention;
  f.full -= skipped * 2.0 * f.attention;
  f.hardware -= skipped * f.hardware_attention;
  const double per_gpu = r.tokens_per_s / info.world_size / 1e12;
  r.model_tflops_per_gpu = per_gpu * f.causal;
  r.hardware_tflops_per_gpu = per_gpu * f.hardware;
  if (info.peak_tflops > 0) {
    r.mfu = r.model_tflops_per_gpu / info.peak_tflops;
    r.mfu_full = per_gpu * f.full / info.peak_tflops;
    r.hfu = r.hardware_tflops_per_gpu / info.peak_tflops;
  }
}

std::vector<Fp8Snapshot> fp8_step_snapshot(const GPT& model, const GPTLayout& layout) {
  if (!model.fp8) return {};
  const int last_chunk = layout.pp.v - 1;
  const int first = layout.first_block(0),
            last = layout.first_block(last_chunk) + layout.blocks(last_chunk) - 1;
  const int s = kBlockLinears * first;
  return fp8_snapshot(*model.fp8, {s + kQkvLinear, s + kAttnProjLinear, s + kFcLinear,
                                   s + kFcProjLinear, kBlockLinears * (last + 1) - 1});
}

void store_run_info(RunInfo& info, const ParamStore& store) {
  info.state_bytes = store.state_memory.bytes;
  info.host_bytes = store.offload.memory.bytes;
  info.disk_bytes = store.offload.disk_bytes;
}

void store_step_report(StepReport& r, const ParamStore& store) {
  r.offload = store_offloaded(store);
  r.host_bytes = store.offload.memory.bytes;
  r.offload_stats = store.offload.stats;
}

void print_flops_banner(const RunInfo& info) {
  const FlopsPerToken& f = info.flops;
  std::printf("FLOPs    per token 6N + 6LTd = %.4g (N = %.4g matmul parameters, causal attention "
              "at half: llm.c, Megatron); 6N + 12LTd = %.4g (PaLM, torchtitan); executed %.4g\n",
              f.causal, f.matmul_parameters, f.full, f.hardware);
  if (info.documents)
    std::printf("FLOPs    [data] document_mask: attention is counted per document, sum over "
                "documents of len^2 in place of T^2 per row (Megatron's count): each step's "
                "6LTd and 12LTd terms are scaled by its sum len^2 / (rows T^2) (rank 0's rows; "
                "\"attention_fraction\" in the metrics)\n");
  if (info.peak_tflops > 0)
    std::printf("MFU      the step line's MFU = tokens/s x 6N + 6LTd / (%d x %.4g TFLOP/s: %s); "
                "HFU counts recompute\n", info.world_size, info.peak_tflops,
                info.peak_source.c_str());
  else
    std::printf("MFU      not reported: no peak known for this device (set [log] peak_tflops)\n");
}
