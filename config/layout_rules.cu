// config/layout_rules.cu - the rules that tie the parallel layout ([parallel]) to the model, the
// pipeline schedule and the job, checked once, when the config is read (config/config.h:
// layout_problems), before any rank builds anything. The planner's search asks the same function
// which layouts of n GPUs are valid. Every broken rule is reported, one line each, naming the
// degrees involved and the rule.
//
// The rules, and why:
//   dp*pp*cp*tp = world size    every rank has one place in the mesh (ep lives inside dp*cp)
//   tp | n_head, 4*d_model, Vp  each tensor-parallel rank holds n_head/tp heads, 4C/tp MLP
//                               columns and Vp/tp rows of the vocabulary
//   llama: tp | n_kv_head, d_ff instead of 4*d_model: n_kv_head/tp key/value heads and d_ff/tp
//                               columns of gate, up and down per rank
//   tp | seq_len (with sp)      sequence parallelism gives each tp rank seq_len/tp positions
//   2*cp | seq_len              zigzag context parallelism cuts a sequence into 2*cp chunks
//   tp | seq_len/cp (with sp)   ... and sequence parallelism splits each cp rank's positions
//   cp_comm = "hybrid": cp_a2a | cp   the all-to-all groups are blocks of cp_a2a cp ranks, the
//                               ring runs across the cp/cp_a2a groups; cp_a2a only with "hybrid"
//   A | n_head/tp (A = cp for "all-to-all", cp_a2a for "hybrid")   each rank of an all-to-all
//                               group attends with n_head/tp/A of its tp rank's query heads
//   llama: A | n_kv_head/tp or n_kv_head/tp | A   ... and with n_kv_head/tp/A kv heads, or, with
//                               fewer kv heads than A, a copy of the one its query heads use
//   pp <= n_layer, the schedule's own rules (pipeline_rules): every stage holds whole blocks
//   pp_layers: one entry per stage, each >= 1, summing to n_layer (or pp_balance = "auto")
//   zb-h1, zb-v need recompute = "none": their weight passes read the block's activations
//   ep | dp*cp                  expert groups are blocks of ep ranks inside dp x cp
//   K | dp (diloco_islands = K) DiLoCo islands are blocks of dp/K consecutive dp ranks
//   ep | dp/K*cp (with islands) every expert group lies inside one island (an island trains
//                               alone, so its all-to-all and expert gradients stay inside it)
//   R | dp (dp_replicate = R)   HSDP's replicas are blocks of dp/R consecutive dp ranks
//   R | dp*cp/ep (with experts) ... and the ranks holding the same experts split alike
#include <cstdarg>
#include <cstdio>

#include "config/config.h"

namespace {

std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string format(const char* fmt, ...) {
  char buf[512];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(buf, sizeof(buf), fmt, args);
  va_end(args);
  return buf;
}

// "[parallel] tp = 2": a key as the messages name it when the caller gives no namer.
std::string plain_name(const Config& cfg, const std::string& id) {
  const std::string section = id.substr(0, id.find('.')), key = id.substr(id.find('.') + 1);
  const ParallelConfig& p = cfg.parallel;
  const ModelConfig& m = cfg.model;
  const struct { const char* id; int value; } ints[] = {
      {"parallel.dp", p.dp},       {"parallel.tp", p.tp},          {"parallel.pp", p.pp},
      {"parallel.cp", p.cp},       {"parallel.ep", p.ep},          {"parallel.pp_virtual", p.pp_virtual},
      {"model.n_head", m.n_head},  {"model.seq_len", m.seq_len},   {"model.n_layer", m.n_layer},
      {"model.d_model", m.d_model}, {"train.grad_accum", cfg.train.grad_accum},
      {"model.n_kv_head", m.n_kv_head}, {"model.d_ff", m.d_ff},
      {"parallel.diloco_islands", p.diloco_islands}, {"parallel.cp_a2a", p.cp_a2a},
      {"parallel.dp_replicate", p.dp_replicate}};
  for (const auto& v : ints)
    if (id == v.id) return format("[%s] %s = %d", section.c_str(), key.c_str(), v.value);
  if (id == "parallel.pp_schedule")
    return "[parallel] pp_schedule = \"" + p.pp_schedule + "\"";
  if (id == "parallel.cp_comm") return "[parallel] cp_comm = \"" + p.cp_comm + "\"";
  return "[" + section + "] " + key;
}

}  // namespace

std::string pipeline_rules(const std::string& kind, int p, int m, int v, int n_layer) {
  std::string msg;
  auto add = [&](const std::string& line) { msg += (msg.empty() ? "" : "\n") + line; };
  const bool interleaved = kind == "interleaved", zb_v = kind == "zb-v";
  const bool file = kind.rfind("file:", 0) == 0;
  if (kind != "gpipe" && kind != "1f1b" && !interleaved && kind != "zb-h1" && !zb_v && !file)
    add("pipeline: schedule \"" + kind + "\" is unknown (one of \"gpipe\", \"1f1b\", "
        "\"interleaved\", \"zb-h1\", \"zb-v\", \"file:PATH\")");
  if (p < 1 || m < 1 || v < 1) {
    add(format("pipeline: pp = %d, micro-batches m = %d and virtual chunks v = %d must each be "
               "at least 1", p, m, v));
    return msg;  // the rules below divide by these
  }
  if (v > 1 && !interleaved && !zb_v && !file)
    add(format("pipeline: v = %d chunks per rank needs the \"interleaved\" or \"zb-v\" "
               "schedule (\"", v) + kind + "\" runs one chunk per rank)");
  if (interleaved && v < 2)
    add("pipeline: the \"interleaved\" schedule needs v >= 2 chunks per rank (with one chunk "
        "per rank it is \"1f1b\")");
  if (zb_v && v != 2)
    add(format("pipeline: the \"zb-v\" schedule runs v = 2 chunks per rank in a V (rank r "
               "holds stages r and 2pp-1-r), not %d: set pp_virtual = 2", v));
  if (interleaved && m % p != 0)
    add(format("pipeline: the \"interleaved\" schedule needs the micro-batches m = %d to be a "
               "multiple of pp = %d (they go through each chunk in groups of pp)", m, p));
  if (n_layer > 0 && n_layer % (p * v) != 0)
    add(format("pipeline: n_layer = %d is not a multiple of pp*v = %d*%d = %d (each of the pp*v "
               "stages holds the same number of blocks unless [parallel] pp_layers or pp_balance "
               "says otherwise)", n_layer, p, v, p * v));
  return msg;
}

// [parallel] pp_layers and pp_balance: the blocks of each of the pp*v stages (model order).
static std::string stage_layer_rules(const Config& cfg) {
  const ParallelConfig& p = cfg.parallel;
  const int stages = p.pp * p.pp_virtual;
  std::string msg;
  auto add = [&](const std::string& line) { msg += (msg.empty() ? "" : "\n") + line; };
  if (!p.pp_layers.empty() && p.pp_balance == "auto")
    add("[parallel] pp_layers and pp_balance = \"auto\" both say how many blocks each stage "
        "holds: give one of them");
  if (p.pp_layers.empty()) return msg;
  int sum = 0;
  bool positive = true;
  for (int n : p.pp_layers) sum += n, positive = positive && n >= 1;
  if ((int)p.pp_layers.size() != stages)
    add(format("[parallel] pp_layers has %zu entries, but there are pp*pp_virtual = %d*%d = %d "
               "stages (one entry per stage, in model order)", p.pp_layers.size(), p.pp,
               p.pp_virtual, stages));
  if (!positive) add("[parallel] pp_layers: every stage needs at least one block");
  if (sum != cfg.model.n_layer)
    add(format("[parallel] pp_layers sums to %d blocks, but [model] n_layer = %d", sum,
               cfg.model.n_layer));
  return msg;
}

// A schedule that splits the backward (zb-h1, zb-v) keeps every block's activations until the
// block's weight pass; recompute shares them between the layers.
static std::string split_rules(const Config& cfg) {
  const std::string& kind = cfg.parallel.pp_schedule;
  if ((kind != "zb-h1" && kind != "zb-v") || cfg.train.recompute == "none") return "";
  return "[train] recompute = \"" + cfg.train.recompute + "\" with [parallel] pp_schedule = \"" +
         kind + "\": a schedule that splits each backward into its input-gradient and its "
         "weight-gradient pass keeps the block's activations until the weight pass, which "
         "recompute does not (it shares them between layers): set recompute = \"none\"";
}

int cp_a2a_degree(const ParallelConfig& p) {
  if (p.cp_comm == "all-to-all") return p.cp;
  if (p.cp_comm == "hybrid") return p.cp_a2a >= 1 ? p.cp_a2a : 1;
  return 1;
}

// [parallel] cp_comm and cp_a2a against cp and the heads (the rules at the top).
static std::string cp_comm_rules(const Config& cfg,
                                 const std::function<std::string(const char*)>& name) {
  const ParallelConfig& p = cfg.parallel;
  const ModelConfig& m = cfg.model;
  const std::string comm = name("parallel.cp_comm"), a2a = name("parallel.cp_a2a");
  if (p.cp_comm != "hybrid" && p.cp_a2a != 0)
    return a2a + " is the all-to-all group size of cp_comm = \"hybrid\", but " + comm +
           ": remove cp_a2a or set cp_comm = \"hybrid\"";
  if (p.cp_comm == "hybrid" && (p.cp_a2a < 1 || p.cp % p.cp_a2a != 0))
    return a2a + " does not divide " + name("parallel.cp") + " (" + comm + ": all-to-all "
           "inside groups of cp_a2a consecutive cp ranks, the ring across the cp/cp_a2a groups)";
  const int A = cp_a2a_degree(p);
  if (A <= 1 || p.tp < 1 || m.n_head % p.tp != 0 || m.kv_heads() % p.tp != 0) return "";
  const int nh = m.n_head / p.tp, nkv = m.kv_heads() / p.tp;
  const std::string group = p.cp_comm == "hybrid" ? "cp_a2a" : "cp";
  if (nh % A != 0)
    return comm + ": the all-to-all degree " + group + format(" = %d does not divide n_head/tp = "
           "%d (", A, nh) + name("model.n_head") + ", " + name("parallel.tp") + ", " +
           (p.cp_comm == "hybrid" ? a2a : name("parallel.cp")) + "; each rank of an all-to-all "
           "group attends with n_head/tp/" + group + " query heads)";
  if (nkv % A != 0 && A % nkv != 0)
    return comm + ": the all-to-all degree " + group + format(" = %d and n_kv_head/tp = %d do "
           "not divide one another (", A, nkv) + name("model.n_kv_head") + ", " +
           name("parallel.tp") + ", " + (p.cp_comm == "hybrid" ? a2a : name("parallel.cp")) +
           "; each rank gets n_kv_head/tp/" + group + " kv heads, or with fewer kv heads than "
           "ranks a copy of the one its query heads use)";
  return "";
}

std::string layout_problems(const Config& cfg, int world_size, const KeyNamer& namer) {
  const ParallelConfig& p = cfg.parallel;
  const ModelConfig& m = cfg.model;
  auto name = [&](const char* id) { return namer ? namer(id) : plain_name(cfg, id); };
  const struct { const char* id; int value; } degrees[] = {
      {"parallel.dp", p.dp}, {"parallel.tp", p.tp}, {"parallel.pp", p.pp},
      {"parallel.cp", p.cp}, {"parallel.ep", p.ep}, {"parallel.pp_virtual", p.pp_virtual},
      {"parallel.dp_replicate", p.dp_replicate}};
  for (const auto& d : degrees)
    if (d.value < 1) return name(d.id) + " must be at least 1";  // the rules below divide by it

  std::string errors;
  auto fail = [&](const std::string& msg) { errors += (errors.empty() ? "" : "\n") + msg; };
  const std::string tp = name("parallel.tp"), cp = name("parallel.cp");
  const long product = (long)p.dp * p.pp * p.cp * p.tp;
  if (world_size > 0 && product != world_size)
    fail(format("the parallel degrees multiply to dp*pp*cp*tp = %d*%d*%d*%d = %ld, but the job has "
                "world size %d (", p.dp, p.pp, p.cp, p.tp, product, world_size) +
         name("parallel.dp") + ", " + name("parallel.pp") + ", " + cp + ", " + tp +
         format("; ep is not a factor of the world: it lives inside dp*cp): launch with mpirun -np "
                "%ld or change the degrees", product));
  if (m.n_head % p.tp != 0)
    fail(tp + " does not divide " + name("model.n_head") +
         " (each tensor-parallel rank holds n_head/tp heads)");
  if (!m.is_llama() && (4L * m.d_model) % p.tp != 0)
    fail(tp + format(" does not divide 4*d_model = %d (", 4 * m.d_model) + name("model.d_model") +
         "; each tensor-parallel rank holds 4*d_model/tp columns of the MLP)");
  if (m.is_llama() && m.kv_heads() % p.tp != 0)
    fail(tp + " does not divide " + name("model.n_kv_head") + format(" = %d key/value heads (each "
         "tensor-parallel rank holds n_kv_head/tp of them with their n_head/tp query heads)",
         m.kv_heads()));
  if (m.is_llama() && m.ffn_hidden() % p.tp != 0)
    fail(tp + " does not divide " + name("model.d_ff") + format(" = %d (each tensor-parallel rank "
         "holds d_ff/tp columns of the gate, up and down projections)", m.ffn_hidden()));
  if (m.padded_vocab() % p.tp != 0)
    fail(tp + format(" does not divide the padded vocabulary %d (vocab_size %d rounded up to a "
                     "multiple of 128; each tensor-parallel rank holds padded/tp rows of wte)",
                     m.padded_vocab(), m.vocab_size));
  if (p.tp > 1 && p.sp && m.seq_len % p.tp != 0)
    fail(tp + " does not divide " + name("model.seq_len") + " (sequence parallelism gives each "
         "tensor-parallel rank seq_len/tp positions; or set sp = false)");
  if (p.cp > 1 && m.seq_len % (2 * p.cp) != 0)
    fail(cp + format(": 2*cp = %d does not divide ", 2 * p.cp) + name("model.seq_len") +
         " (zigzag context parallelism cuts each sequence into 2*cp chunks, two per rank)");
  else if (p.cp > 1 && p.sp && (m.seq_len / p.cp) % p.tp != 0)
    fail(tp + format(" does not divide seq_len/cp = %d/%d = %d (sequence parallelism splits each "
                     "context-parallel rank's positions over tp)",
                     m.seq_len, p.cp, m.seq_len / p.cp));
  const std::string heads = cp_comm_rules(cfg, name);
  if (!heads.empty()) fail(heads);
  if (p.pp > 1 || p.pp_virtual > 1) {
    const bool equal = p.pp_layers.empty() && p.pp_balance != "auto";
    const std::string rules = pipeline_rules(p.pp_schedule, p.pp, cfg.train.grad_accum,
                                             p.pp_virtual, equal ? m.n_layer : 0);
    if (!rules.empty())
      fail(name("parallel.pp") + ", " + name("parallel.pp_schedule") + ", " +
           name("parallel.pp_virtual") + ", " + name("train.grad_accum") +
           " (the micro-batches of a step): " + rules);
    for (const std::string& more : {stage_layer_rules(cfg), split_rules(cfg)})
      if (!more.empty()) fail(more);
  }
  if (m.n_layer < p.pp * p.pp_virtual && m.n_layer >= p.pp)
    fail(name("parallel.pp") + ", " + name("parallel.pp_virtual") +
         format(": the pp*v = %d stages need at least one layer each, but ", p.pp * p.pp_virtual) +
         name("model.n_layer"));
  if (m.n_layer < p.pp)
    fail(name("parallel.pp") + " exceeds " + name("model.n_layer") +
         " (each pipeline stage needs at least one layer)");
  if ((p.dp * p.cp) % p.ep != 0)
    fail(name("parallel.ep") + format(" does not divide dp*cp = %d*%d = %d (", p.dp, p.cp,
                                      p.dp * p.cp) +
         name("parallel.dp") + ", " + cp + "; expert parallelism shards the experts over blocks "
         "of ep ranks inside dp x cp)");
  if (p.diloco_islands > 1 && p.dp % p.diloco_islands != 0)
    fail(name("parallel.diloco_islands") + " does not divide " + name("parallel.dp") +
         " (DiLoCo islands are blocks of dp/K consecutive dp ranks)");
  else if (p.diloco_islands > 1 && (p.dp * p.cp) % p.ep == 0 &&
           (p.dp / p.diloco_islands * p.cp) % p.ep != 0)
    fail(name("parallel.ep") + format(" does not divide dp/K*cp = %d/%d*%d = %d (", p.dp,
                                      p.diloco_islands, p.cp, p.dp / p.diloco_islands * p.cp) +
         name("parallel.dp") + ", " + name("parallel.diloco_islands") + ", " + cp +
         ": each DiLoCo island trains alone, so its expert groups must lie inside it)");
  if (p.dp % p.dp_replicate != 0)
    fail(name("parallel.dp_replicate") + " does not divide " + name("parallel.dp") +
         " (HSDP: dp = dp_replicate x S, each replica a block of S consecutive dp ranks)");
  else if (p.dp_replicate > 1 && m.n_experts > 0 && (p.dp * p.cp) % p.ep == 0 &&
           (p.dp * p.cp / p.ep) % p.dp_replicate != 0)
    fail(name("parallel.dp_replicate") + format(" does not divide dp*cp/ep = %d*%d/%d = %d (",
                                                p.dp, p.cp, p.ep, p.dp * p.cp / p.ep) +
         name("parallel.dp") + ", " + cp + ", " + name("parallel.ep") +
         ": HSDP cuts the ranks holding the same experts into replicas too)");
  return errors;
}
