// parallel/pipeline_file.cu - a user's pipeline schedule, read from a file
// ([parallel] pp_schedule = "file:PATH"), checked line by line and by the simulator before any
// work starts, and built into action lists like the built-in schedules
// (parallel/pipeline_schedule.h).
//
// The format, one action per line:
//
//   # zb-h1 by hand, p = 2, m = 2      ('#' starts a comment; blank lines are skipped)
//   order,loop                         (optional: the stage order, loop or v; loop by default)
//   0,F,0,0                            rank, action (F, B or W), micro-batch, chunk
//   0,F,1,0
//   1,F,0,0
//   ...
//
// A rank's lines, in file order, are the order it runs its computes; the lines of different
// ranks may interleave freely. The sends and receives are not written: each compute gets the
// receive of its input and the send of its output where the neighbouring stage is on another
// rank, and the message placement of the built-in schedules moves them where rendezvous needs
// them. A schedule with W lines splits every backward (each B then needs its W); one without
// runs whole backwards.
//
// The checks, each refusal naming the file, the line and the rule: the syntax and the ranges
// (rank < pp, micro-batch < grad_accum, chunk < pp_virtual); every rank runs F and B of each of
// its (micro-batch, chunk) once, the B after the F, and, when the schedule splits, W once after
// the B (a missing W names the B's line); then the simulator runs the lists buffered, which
// finds a compute whose input never comes, a receive that would get another message first (the
// two ranks of a channel disagree on the order of micro-batches) and a deadlock (with the cycle
// of ranks waiting for each other and the line each waits at), then the placement and the
// rendezvous run.
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include "parallel/pipeline_schedule.h"

namespace {

struct FileLine {
  int number;
  std::vector<std::string> fields;
};

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r"), e = s.find_last_not_of(" \t\r");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

// The file's non-empty lines without comments, split at commas. "" or why it cannot be read.
std::string read_lines(const std::string& path, std::vector<FileLine>* out) {
  std::ifstream in(path);
  if (!in) return "pipeline schedule file " + path + ": cannot read it: " + std::strerror(errno);
  std::string text;
  for (int number = 1; std::getline(in, text); ++number) {
    text = trim(text.substr(0, text.find('#')));
    if (text.empty()) continue;
    FileLine line{number, {}};
    std::istringstream fields(text);
    for (std::string f; std::getline(fields, f, ',');) line.fields.push_back(trim(f));
    out->push_back(line);
  }
  return "";
}

bool parse_int(const std::string& s, int* v) {
  if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos || s.size() > 9)
    return false;
  *v = std::stoi(s);
  return true;
}

// One line into a compute action of a rank, or the rule it breaks.
std::string parse_action(const FileLine& l, int p, int m, int v, int* rank, PipeAction* a) {
  if (l.fields.size() != 4) return "expected rank,action,micro,chunk (4 fields)";
  int micro = 0, chunk = 0;
  if (!parse_int(l.fields[0], rank) || *rank >= p)
    return "rank \"" + l.fields[0] + "\" is not a pipeline rank 0.." + std::to_string(p - 1);
  const std::string& op = l.fields[1];
  if (op != "F" && op != "B" && op != "W") return "action \"" + op + "\" is not F, B or W";
  if (!parse_int(l.fields[2], &micro) || micro >= m)
    return "micro-batch \"" + l.fields[2] + "\" is not one of 0.." + std::to_string(m - 1) +
           " ([train] grad_accum = " + std::to_string(m) + ")";
  if (!parse_int(l.fields[3], &chunk) || chunk >= v)
    return "chunk \"" + l.fields[3] + "\" is not one of 0.." + std::to_string(v - 1) +
           " ([parallel] pp_virtual = " + std::to_string(v) + ")";
  const PipeOp kind = op == "F" ? PipeOp::Forward : op == "B" ? PipeOp::Backward : PipeOp::Weight;
  *a = {kind, micro, chunk, -1, l.number};
  return "";
}

const char* pass_name(PipeOp op) {
  return op == PipeOp::Forward ? "forward" : op == PipeOp::Backward ? "backward" : "weight pass";
}

// Per rank: each (micro, chunk) runs F and B once, B after F, and W once after B when the
// schedule splits. Problems into *err, one per line, prefixed by `where`.
void check_passes(const PipelineSchedule& s, const std::vector<std::vector<PipeAction>>& computes,
                  int first_w_line, const std::string& where, std::string* err) {
  auto add = [&](int line, const std::string& msg) {
    *err += where + (line > 0 ? ":" + std::to_string(line) : "") + ": " + msg + "\n";
  };
  for (int r = 0; r < s.p; ++r) {
    std::map<std::pair<int, int>, int> at[3];  // per op: (micro, chunk) -> its line
    for (const PipeAction& a : computes[r]) {
      const std::pair<int, int> key{a.micro, a.chunk};
      const int op = (int)a.op;
      const std::string what = std::string("the ") + pass_name(a.op) + " of micro-batch " +
                               std::to_string(a.micro) + " chunk " + std::to_string(a.chunk) +
                               " on rank " + std::to_string(r);
      if (at[op].count(key)) {
        add(a.line, what + " runs twice (first at line " + std::to_string(at[op][key]) + ")");
        continue;
      }
      if (op > 0 && !at[op - 1].count(key))
        add(a.line, what + " comes before its " + pass_name((PipeOp)(op - 1)));
      at[op][key] = a.line;
    }
    for (int i = 0; i < s.m; ++i)
      for (int c = 0; c < s.v; ++c) {
        const std::string what = "micro-batch " + std::to_string(i) + " chunk " +
                                 std::to_string(c) + " on rank " + std::to_string(r);
        for (int op = 0; op < 2; ++op)
          if (!at[op].count({i, c})) add(0, std::string("the ") + pass_name((PipeOp)op) + " of " +
                                                what + " is missing");
        if (s.split && at[1].count({i, c}) && !at[2].count({i, c}))
          add(at[1][{i, c}], "the backward of " + what + " has no weight pass W, but the "
              "schedule splits backwards (line " + std::to_string(first_w_line) + " is a W)");
      }
  }
}

// The parsed lines into s: the order, each rank's computes (with messages added). Returns the
// problems found on the lines themselves.
std::string parse(const std::vector<FileLine>& lines, const std::string& where,
                  PipelineSchedule& s, std::vector<std::vector<PipeAction>>& computes,
                  int* first_w_line) {
  std::string err;
  bool order_seen = false;
  for (const FileLine& l : lines) {
    const std::string at = where + ":" + std::to_string(l.number) + ": ";
    if (!l.fields.empty() && l.fields[0] == "order") {
      const bool ok = l.fields.size() == 2 && (l.fields[1] == "loop" || l.fields[1] == "v");
      if (!ok || order_seen) err += at + "expected one line order,loop or order,v\n";
      s.order = ok && l.fields[1] == "v" ? StageOrder::V : StageOrder::Loop;
      order_seen = true;
      continue;
    }
    int rank = 0;
    PipeAction a{};
    const std::string problem = parse_action(l, s.p, s.m, s.v, &rank, &a);
    if (!problem.empty()) {
      err += at + problem + "\n";
      continue;
    }
    if (a.op == PipeOp::Weight && *first_w_line == 0) *first_w_line = l.number;
    computes[rank].push_back(a);
  }
  if (s.order == StageOrder::V && s.v != 2)
    err += where + ": order,v puts two chunks per rank in a V: it needs [parallel] pp_virtual = "
           "2, not " + std::to_string(s.v) + "\n";
  return err;
}

// The simulator's and the placement's findings, named after the file.
std::string run_checks(PipelineSchedule& s, const std::string& where) {
  std::string err = pipeline_simulate(s, PipeCosts{}).error;
  if (err.empty()) err = pipeline_try_place_messages(s);
  if (err.empty()) err = pipeline_simulate(s, PipeCosts{}, PipeComm::Rendezvous).error;
  return err.empty() ? "" : where + ": " + err + "\n";
}

}  // namespace

std::string pipeline_read_file(const std::string& path, int p, int m, int v,
                               PipelineSchedule* out) {
  const std::string where = "pipeline schedule file " + path;
  std::vector<FileLine> lines;
  std::string err = read_lines(path, &lines);
  if (!err.empty()) return err;
  PipelineSchedule s;
  s.kind = "file:" + path, s.p = p, s.m = m, s.v = v;
  std::vector<std::vector<PipeAction>> computes(p);
  int first_w_line = 0;
  err = parse(lines, where, s, computes, &first_w_line);
  s.split = first_w_line > 0;
  if (err.empty()) check_passes(s, computes, first_w_line, where, &err);
  if (!err.empty()) return err.substr(0, err.size() - 1);
  for (int r = 0; r < p; ++r) s.ranks.push_back(pipeline_with_messages(s, r, computes[r]));
  err = run_checks(s, where);
  if (!err.empty()) return err.substr(0, err.size() - 1);
  *out = s;
  return "";
}

StageOrder pipeline_stage_order(const std::string& kind) {
  if (kind == "zb-v") return StageOrder::V;
  if (kind.rfind("file:", 0) != 0) return StageOrder::Loop;
  std::vector<FileLine> lines;
  read_lines(kind.substr(5), &lines);  // a file that cannot be read was refused already
  for (const FileLine& l : lines)
    if (l.fields.size() == 2 && l.fields[0] == "order" && l.fields[1] == "v") return StageOrder::V;
  return StageOrder::Loop;
}

std::string pipeline_config_problems(const Config& cfg) {
  const ParallelConfig& par = cfg.parallel;
  if (par.pp_schedule.rfind("file:", 0) != 0 || (par.pp == 1 && par.pp_virtual == 1)) return "";
  PipelineSchedule s;
  const std::string err = pipeline_read_file(par.pp_schedule.substr(5), par.pp,
                                             cfg.train.grad_accum, par.pp_virtual, &s);
  if (!err.empty()) return err;
  if (s.split && cfg.train.recompute != "none")
    return "[train] recompute = \"" + cfg.train.recompute + "\" with the schedule of " +
           par.pp_schedule.substr(5) + ", which splits each backward into its input-gradient "
           "and its weight-gradient pass: the weight pass needs the block's activations, which "
           "recompute does not keep: set recompute = \"none\"";
  return "";
}
