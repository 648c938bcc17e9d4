// test/fuzz/fuzz_schedule_file.cpp - a user's pipeline schedule file ([parallel] pp_schedule =
// "file:PATH", parallel/pipeline_file.cu): read, checked line by line, run by the simulator and
// its messages placed, for a few (pp, grad_accum, pp_virtual) combinations.
//
// The input's first three bytes choose the combination (an ASCII digit '1'..'4' is pp 1..4,
// '1'..'8' is 1..8 micro-batches, '1'..'3' is 1..3 chunks per rank; any other byte wraps into
// those ranges), the rest is the file. The reader then runs on the file for that combination,
// one more rank, one more micro-batch and the other chunk count, so a schedule written for one
// combination is also checked against the others.
//
// A refusal (a message, or FATAL from the builder) is a pass. A schedule the reader accepts must
// be one the trainer can run: each rank computes every (micro-batch, chunk) once per pass, and
// the simulator, buffered and under rendezvous, finds no error and each rank busy for exactly
// m*v*(F+B+W) at the nominal costs. Anything else aborts: the reader accepted a broken schedule.
#include <cstdlib>

#include "parallel/pipeline_schedule.h"
#include "test/fuzz/fuzz_support.h"

namespace {

[[noreturn]] void accepted_broken(const char* what, int p, int m, int v) {
  std::fprintf(stderr, "fuzz_schedule_file: accepted for p=%d m=%d v=%d, but %s\n", p, m, v,
               what);
  std::abort();
}

// What an accepted schedule must be.
void check_accepted(const PipelineSchedule& s, int p, int m, int v) {
  if (s.p != p || s.m != m || s.v != v || (int)s.ranks.size() != p)
    accepted_broken("its shape differs", p, m, v);
  for (int r = 0; r < p; ++r) {
    int computes[3] = {0, 0, 0};
    for (const PipeAction& a : s.ranks[r])
      if (!pipe_op_is_comm(a.op)) ++computes[(int)a.op];
    if (computes[0] != m * v || computes[1] != m * v || computes[2] != (s.split ? m * v : 0))
      accepted_broken("a rank's computes are not one per (micro-batch, chunk) and pass", p, m, v);
  }
  for (PipeComm mode : {PipeComm::Buffered, PipeComm::Rendezvous}) {
    const PipelineSimulation sim = pipeline_simulate(s, PipeCosts{}, mode);
    if (!sim.error.empty()) accepted_broken("the simulator refuses it", p, m, v);
    for (double busy : sim.busy)
      if (busy != 3.0 * m * v) accepted_broken("a rank is not busy m*v*(F+B+W)", p, m, v);
  }
  pipeline_timeline(s, pipeline_simulate(s, PipeCosts{}));
}

void read_one(const std::string& path, int p, int m, int v) {
  PipelineSchedule s;
  try {
    if (pipeline_read_file(path, p, m, v, &s).empty()) check_accepted(s, p, m, v);
  } catch (const FuzzStop&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  fuzz_catch_stops();
  const int p = 1 + (uint8_t)(data[0] - '1') % 4;
  const int m = 1 + (uint8_t)(data[1] - '1') % 8;
  const int v = 1 + (uint8_t)(data[2] - '1') % 3;
  const std::string path = fuzz_file("schedule.csv", data + 3, size - 3);
  read_one(path, p, m, v);
  read_one(path, p % 4 + 1, m, v);
  read_one(path, p, m % 8 + 1, v);
  read_one(path, p, m, v == 1 ? 2 : 1);
  try {
    pipeline_stage_order("file:" + path);
  } catch (const FuzzStop&) {
  }
  return 0;
}
