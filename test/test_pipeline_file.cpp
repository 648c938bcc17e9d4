// test/test_pipeline_file.cpp - checks parallel/pipeline_file.cu: a user's pipeline schedule read
// from a file ([parallel] pp_schedule = "file:PATH"), one process, no model.
//  - zb-h1 (p = 3, m = 4) and zb-v (p = 2, m = 3, order,v) written out as files, with comments
//    and blank lines, read back: the same compute order on every rank, and the same simulated
//    makespan, buffered and under rendezvous, as the built schedules; a file without W lines
//    runs whole backwards (1f1b written out: the same makespan as "1f1b");
//  - every kind of mistake is refused with the file, the line and the rule: a malformed line, a
//    rank, action, micro-batch or chunk out of range, a forward twice, a backward before its
//    forward, a weight pass before its backward, a missing W (naming the B's line), a missing
//    backward, two ranks that disagree on the order of micro-batches on one channel, a deadlock
//    (the cycle of ranks, with the line each waits at), order,v without two chunks, a file that
//    cannot be read;
//  - pipeline_config_problems: a split schedule file with recompute refused, without accepted.
// Exits 1 on any failure.
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "parallel/pipeline_schedule.h"
#include "test/check_results.h"

namespace {

std::string g_dir;

std::string write_file(const std::string& name, const std::string& text) {
  const std::string path = g_dir + "/" + name;
  std::ofstream(path) << text;
  return path;
}

// The compute actions of a built schedule as a file: rank by rank, with a comment and a blank
// line between ranks.
std::string as_file(const PipelineSchedule& s) {
  std::string text = "# " + s.kind + " written out\n";
  if (s.order == StageOrder::V) text += "order,v   # two chunks per rank in a V\n";
  const char* ops = "FBW";
  for (int r = 0; r < s.p; ++r) {
    text += "\n# rank " + std::to_string(r) + "\n";
    for (const PipeAction& a : s.ranks[r])
      if (!pipe_op_is_comm(a.op))
        text += std::to_string(r) + "," + ops[(int)a.op] + "," + std::to_string(a.micro) + "," +
                std::to_string(a.chunk) + "\n";
  }
  return text;
}

std::vector<std::vector<std::string>> compute_order(const PipelineSchedule& s) {
  std::vector<std::vector<std::string>> out(s.p);
  for (int r = 0; r < s.p; ++r)
    for (const PipeAction& a : s.ranks[r])
      if (!pipe_op_is_comm(a.op))
        out[r].push_back(std::string(pipe_op_name(a.op)) + std::to_string(a.micro) + "." +
                         std::to_string(a.chunk));
  return out;
}

void check_round_trip(Results& res, const std::string& kind, int p, int m, int v) {
  const PipelineSchedule built = pipeline_build(kind, p, m, v);
  const std::string path = write_file(kind + ".csv", as_file(built));
  PipelineSchedule read;
  const std::string err = pipeline_read_file(path, p, m, v, &read);
  res.check(err.empty(), "%s p=%d m=%d v=%d written out and read back%s%s", kind.c_str(), p, m,
            v, err.empty() ? "" : ": ", err.c_str());
  if (!err.empty()) return;
  const PipeCosts nominal{};
  const double want = pipeline_simulate(built, nominal).makespan;
  const double buffered = pipeline_simulate(read, nominal).makespan;
  const double rdv = pipeline_simulate(read, nominal, PipeComm::Rendezvous).makespan;
  res.check(compute_order(read) == compute_order(built) && read.split == built.split &&
                read.order == built.order && buffered == want && rdv == want,
            "%s from the file: the same compute order, split %d, makespan %g buffered and %g "
            "under rendezvous (built: %g)", kind.c_str(), read.split, buffered, rdv, want);
}

// The file text must be refused with exactly `want` (the path replaced by FILE).
void check_refused(Results& res, const char* what, const std::string& text, int p, int m, int v,
                   const std::string& want) {
  const std::string path = write_file("bad.csv", text);
  PipelineSchedule s;
  std::string got = pipeline_read_file(path, p, m, v, &s);
  for (size_t at; (at = got.find(path)) != std::string::npos;) got.replace(at, path.size(), "FILE");
  res.check(got == want, "%s: %s%s%s", what, got.c_str(), got == want ? "" : "\n     want: ",
            got == want ? "" : want.c_str());
}

void check_mistakes(Results& res) {
  const std::string h1 = "0,F,0,0\n0,F,1,0\n1,F,0,0\n1,B,0,0\n1,W,0,0\n1,F,1,0\n1,B,1,0\n"
                         "1,W,1,0\n0,B,0,0\n0,W,0,0\n0,B,1,0\n0,W,1,0\n";  // zb-h1, p = 2, m = 2
  check_refused(res, "a correct zb-h1 p=2 m=2", h1, 2, 2, 1, "");
  check_refused(res, "a malformed line", "0,F,0\n", 2, 1, 1,
                "pipeline schedule file FILE:1: expected rank,action,micro,chunk (4 fields)");
  check_refused(res, "rank, action, micro-batch and chunk out of range",
                "# bad\n2,F,0,0\n0,X,0,0\n0,F,2,0\n0,F,0,1\n", 2, 2, 1,
                "pipeline schedule file FILE:2: rank \"2\" is not a pipeline rank 0..1\n"
                "pipeline schedule file FILE:3: action \"X\" is not F, B or W\n"
                "pipeline schedule file FILE:4: micro-batch \"2\" is not one of 0..1 ([train] "
                "grad_accum = 2)\n"
                "pipeline schedule file FILE:5: chunk \"1\" is not one of 0..0 ([parallel] "
                "pp_virtual = 1)");
  check_refused(res, "a forward twice", "0,F,0,0\n0,F,0,0\n0,B,0,0\n", 1, 1, 1,
                "pipeline schedule file FILE:2: the forward of micro-batch 0 chunk 0 on rank 0 "
                "runs twice (first at line 1)");
  check_refused(res, "a backward before its forward", "0,B,0,0\n0,F,0,0\n", 1, 1, 1,
                "pipeline schedule file FILE:1: the backward of micro-batch 0 chunk 0 on rank 0 "
                "comes before its forward");
  check_refused(res, "a weight pass before its backward", "0,F,0,0\n0,W,0,0\n0,B,0,0\n", 1, 1, 1,
                "pipeline schedule file FILE:2: the weight pass of micro-batch 0 chunk 0 on rank "
                "0 comes before its backward");
  std::string missing_w = h1;
  missing_w.replace(missing_w.find("0,W,1,0\n"), 8, "");
  check_refused(res, "a missing W", missing_w, 2, 2, 1,
                "pipeline schedule file FILE:11: the backward of micro-batch 1 chunk 0 on rank 0 "
                "has no weight pass W, but the schedule splits backwards (line 5 is a W)");
  check_refused(res, "a missing backward", "0,F,0,0\n0,F,1,0\n0,B,0,0\n", 1, 2, 1,
                "pipeline schedule file FILE: the backward of micro-batch 1 chunk 0 on rank 0 is "
                "missing");
  check_refused(res, "two ranks disagreeing on the order of micro-batches",
                "0,F,0,0\n0,F,1,0\n0,B,0,0\n0,B,1,0\n1,F,1,0\n1,B,1,0\n1,F,0,0\n1,B,0,0\n", 2, 2, 1,
                "pipeline schedule file FILE: line 5: rank 1 action 0 (recv-fwd micro 1 chunk 0 "
                "stage 1 peer 0): the next message from rank 0 on its channel is activation micro "
                "0 of stage 0");
  // Rank 0 runs B0 before F1 (1f1b's order for a last stage), rank 1, the last stage, F0 F1
  // before B0: rank 0 waits for the gradient of 0, rank 1 for the activation of 1.
  check_refused(res, "a deadlock",
                "0,F,0,0\n0,B,0,0\n0,F,1,0\n0,B,1,0\n1,F,0,0\n1,F,1,0\n1,B,0,0\n1,B,1,0\n", 2, 2, 1,
                "pipeline schedule file FILE: deadlock: a cycle of ranks waiting for each other: "
                "line 2: rank 0 action 2 (recv-bwd micro 0 chunk 0 stage 0 peer 1) waits for rank "
                "1; line 6: rank 1 action 2 (recv-fwd micro 1 chunk 0 stage 1 peer 0) waits for "
                "rank 0");
  check_refused(res, "order,v with one chunk per rank", "order,v\n0,F,0,0\n0,B,0,0\n", 1, 1, 1,
                "pipeline schedule file FILE: order,v puts two chunks per rank in a V: it needs "
                "[parallel] pp_virtual = 2, not 1");
  PipelineSchedule s;
  const std::string got = pipeline_read_file(g_dir + "/absent.csv", 1, 1, 1, &s);
  res.check(got.find("absent.csv: cannot read it: No such file") != std::string::npos,
            "a file that cannot be read: %s", got.c_str());
}

void check_config(Results& res) {
  const std::string path = write_file("zb.csv", as_file(pipeline_build("zb-h1", 2, 2, 1)));
  Config cfg;
  cfg.parallel.pp = 2;
  cfg.train.grad_accum = 2;
  cfg.parallel.pp_schedule = "file:" + path;
  cfg.train.recompute = "gelu";
  const std::string err = pipeline_config_problems(cfg);
  res.check(err.find("[train] recompute = \"gelu\" with the schedule of " + path) == 0,
            "a split schedule file with recompute: %s", err.c_str());
  cfg.train.recompute = "none";
  res.check(pipeline_config_problems(cfg).empty(), "and without recompute: accepted");
  res.check(pipeline_stage_order("file:" + write_file("v.csv", "order,v\n")) == StageOrder::V &&
                pipeline_stage_order("file:" + path) == StageOrder::Loop &&
                pipeline_stage_order("zb-v") == StageOrder::V,
            "the stage order of a file (its order line), of zb-v and of the others");
}

}  // namespace

int main() {
  char dir[] = "/tmp/test_pipeline_file_XXXXXX";
  g_dir = mkdtemp(dir);
  Results res;
  check_round_trip(res, "zb-h1", 3, 4, 1);
  check_round_trip(res, "zb-v", 2, 3, 2);
  check_round_trip(res, "1f1b", 3, 5, 1);
  check_round_trip(res, "interleaved", 2, 4, 2);
  check_mistakes(res);
  check_config(res);
  std::printf("\ntest_pipeline_file: %d of %d checks failed\n", res.failures, res.checks);
  std::system(("rm -rf " + g_dir).c_str());
  return res.exit_status();
}
