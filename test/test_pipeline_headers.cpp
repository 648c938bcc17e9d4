// test/test_pipeline_headers.cpp - the timelines in the header comments of parallel/pipeline.cu
// and parallel/pipeline_schedule.cu are what the schedule builder (pipeline_build) and the
// simulator (pipeline_simulate, pipeline_timeline) make: this program draws each of them again
// and compares it with the text in the file, so that a header cannot drift from the code.
//
//   build/test_pipeline_headers           compare; on a difference print it ("-" the file, "+"
//                                         the builder) and exit 1. Run from the repository root.
//   build/test_pipeline_headers --print   print every block as the builder draws it
//   build/test_pipeline_headers --write   write the builder's blocks into the files
//
// A block is the indented part of a comment paragraph: the lines "//" and "//   ..." that follow
// the paragraph starting with the block's anchor (its first words), up to the next paragraph or
// the end of the comment. The blocks:
//  - parallel/pipeline.cu: rank 1's action list for 1f1b at p = 4, m = 4, each run of messages
//    in brackets (what the executor posts as one p2p_batch), with each message's peer; then the
//    step at F = B = W = 1 per chunk as the simulator draws it.
//  - parallel/pipeline_schedule.cu: gpipe, 1f1b, zb-h1 at p = 4, m = 8, interleaved at m = 4
//    (v = 2) and zb-v (v = 2), at F = B = W = 1 per chunk: each with its makespan, bubble and
//    peak of chunk activations per rank from the simulation, and for v = 2 "1f1b:" the makespan
//    of 1f1b on the same model (one stage per rank, at a stage's costs F = B = W = v).
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "parallel/pipeline_schedule.h"
#include "test/check_results.h"

namespace {

using Lines = std::vector<std::string>;

// A schedule drawn: "<kind>[ (details)], N units, bubble X%, peak a, b, ...", then one timeline
// line per rank.
Lines draw_schedule(const std::string& kind, int p, int m, int v, const std::string& details) {
  const PipelineSchedule s = pipeline_build(kind, p, m, v);
  const PipelineSimulation sim = pipeline_simulate(s, PipeCosts{});
  char head[160];
  std::snprintf(head, sizeof(head), "%s%s, %g units, bubble %.1f%%, peak", kind.c_str(),
                details.c_str(), sim.makespan, 100 * sim.bubble());
  std::string title = head;
  for (int r = 0; r < p; r++) title += (r ? ", " : " ") + std::to_string(sim.peak_live[r]);
  if (v > 1) {  // 1f1b on the same model: one stage per rank, each costing v chunks
    const PipeCosts stage{(double)v, (double)v, (double)v, {}};
    const double one = pipeline_simulate(pipeline_build("1f1b", p, m, 1), stage).makespan;
    title += "; 1f1b: " + std::to_string((int)one) + " units";
  }
  Lines out{title};
  std::istringstream timeline(pipeline_timeline(s, sim));
  for (std::string line; std::getline(timeline, line);) out.push_back(line);
  return out;
}

// One action of a list: "F0" (lower case for chunks after the first), "send-fwd 0 to r2".
std::string action_text(const PipeAction& a) {
  if (!pipe_op_is_comm(a.op))
    return std::string(1, (a.chunk > 0 ? "fbw" : "FBW")[(int)a.op]) + std::to_string(a.micro);
  return std::string(pipe_op_name(a.op)) + " " + std::to_string(a.micro) +
         (pipe_op_is_send(a.op) ? " to r" : " from r") + std::to_string(a.peer);
}

// Rank r's list, each run of messages in brackets, wrapped at `width` columns.
Lines draw_list(const PipelineSchedule& s, int r, size_t width) {
  const std::vector<PipeAction>& list = s.ranks[r];
  std::vector<std::string> words;
  for (size_t i = 0; i < list.size(); i++) {
    if (!pipe_op_is_comm(list[i].op)) {
      words.push_back(action_text(list[i]));
      continue;
    }
    std::string run = "[" + action_text(list[i]);
    while (i + 1 < list.size() && pipe_op_is_comm(list[i + 1].op))
      run += ", " + action_text(list[++i]);
    words.push_back(run + "]");
  }
  const std::string first = "rank " + std::to_string(r) + ":";
  Lines out{first};
  for (const std::string& w : words) {
    if (out.back().size() + 1 + w.size() > width) out.push_back(std::string(first.size(), ' '));
    out.back() += " " + w;
  }
  return out;
}

Lines pipeline_cu_block() {
  const PipelineSchedule s = pipeline_build("1f1b", 4, 4, 1);
  Lines out = draw_list(s, 1, 93);
  out.push_back("");
  for (const std::string& line : draw_schedule("1f1b", 4, 4, 1, ", p = 4, m = 4"))
    out.push_back(line);
  return out;
}

Lines pipeline_schedule_cu_block() {
  Lines out;
  auto add = [&](const Lines& lines) {
    if (!out.empty()) out.push_back("");
    out.insert(out.end(), lines.begin(), lines.end());
  };
  add(draw_schedule("gpipe", 4, 8, 1, ""));
  add(draw_schedule("1f1b", 4, 8, 1, ""));
  add(draw_schedule("zb-h1", 4, 8, 1, ""));
  add(draw_schedule("interleaved", 4, 4, 2, " (v = 2, m = 4)"));
  add(draw_schedule("zb-v", 4, 8, 2, " (v = 2, V order)"));
  return out;
}

// As comment lines: "//" for an empty line, "//   " before the others.
Lines commented(const Lines& lines) {
  Lines out;
  for (const std::string& l : lines) out.push_back(l.empty() ? "//" : "//   " + l);
  return out;
}

struct Block {
  const char* file;
  const char* anchor;  // the start of the paragraph the block follows
  Lines (*draw)();
};

bool read_lines(const std::string& path, Lines* out) {
  std::ifstream f(path);
  if (!f) return false;
  for (std::string line; std::getline(f, line);) out->push_back(line);
  return true;
}

// Where the block after `anchor` lies in the file: [begin, end) lines, or begin = npos.
std::pair<size_t, size_t> find_block(const Lines& file, const std::string& anchor) {
  size_t i = 0;
  while (i < file.size() && file[i].rfind(anchor, 0) != 0) i++;
  if (i == file.size()) return {std::string::npos, 0};
  auto text = [&](size_t j) { return file[j].size() > 3 && file[j].rfind("// ", 0) == 0 &&
                                     file[j][3] != ' '; };
  auto indented = [&](size_t j) { return file[j] == "//" || file[j].rfind("//   ", 0) == 0; };
  for (i++; i < file.size() && text(i);) i++;              // the rest of the paragraph
  while (i < file.size() && file[i] == "//") i++;          // the empty lines before the block
  size_t end = i;
  while (end < file.size() && indented(end)) end++;
  while (end > i && file[end - 1] == "//") end--;          // the empty lines after it
  return {i, end};
}

// The lines of a and b with what differs marked: "-" only in a (the file), "+" only in b (the
// builder), " " in both (a longest common subsequence).
std::string diff(const Lines& a, const Lines& b) {
  const size_t n = a.size(), m = b.size();
  std::vector<std::vector<int>> lcs(n + 1, std::vector<int>(m + 1, 0));
  for (size_t i = n; i-- > 0;)
    for (size_t j = m; j-- > 0;)
      lcs[i][j] = a[i] == b[j] ? lcs[i + 1][j + 1] + 1 : std::max(lcs[i + 1][j], lcs[i][j + 1]);
  std::string out;
  size_t i = 0, j = 0;
  while (i < n || j < m) {
    if (i < n && j < m && a[i] == b[j]) out += "  " + a[i++] + "\n", j++;
    else if (i < n && (j == m || lcs[i + 1][j] >= lcs[i][j + 1])) out += "- " + a[i++] + "\n";
    else out += "+ " + b[j++] + "\n";
  }
  return out;
}

// Compares (or, with `write`, replaces) one block of a file.
void check_block(Results& res, const Block& b, bool write) {
  Lines file;
  if (!read_lines(b.file, &file)) {
    res.check(false, "%s: cannot read it (run from the repository root)", b.file);
    return;
  }
  const auto [begin, end] = find_block(file, b.anchor);
  if (begin == std::string::npos) {
    res.check(false, "%s: no paragraph starting \"%s\"", b.file, b.anchor);
    return;
  }
  const Lines want = commented(b.draw());
  const Lines got(file.begin() + begin, file.begin() + end);
  if (write && got != want) {
    file.erase(file.begin() + begin, file.begin() + end);
    file.insert(file.begin() + begin, want.begin(), want.end());
    std::ofstream f(b.file);
    for (const std::string& line : file) f << line << "\n";
    std::printf("wrote %s lines %zu-%zu\n", b.file, begin + 1, begin + want.size());
    return;
  }
  res.check(got == want, "%s lines %zu-%zu: the timelines after \"%s\" as the builder draws them",
            b.file, begin + 1, end, b.anchor);
  if (got != want) std::printf("%s", diff(got, want).c_str());
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode != "" && mode != "--print" && mode != "--write") {
    std::fprintf(stderr, "usage: %s [--print | --write]\n", argv[0]);
    return 2;
  }
  const Block blocks[] = {
      {"parallel/pipeline.cu", "// derives the bubbles. This file runs the list.",
       pipeline_cu_block},
      {"parallel/pipeline_schedule.cu", "// Timelines, p = 4", pipeline_schedule_cu_block},
  };
  Results res;
  for (const Block& b : blocks) {
    if (mode == "--print") {
      std::printf("%s, after \"%s\":\n", b.file, b.anchor);
      for (const std::string& line : commented(b.draw())) std::printf("%s\n", line.c_str());
      continue;
    }
    check_block(res, b, mode == "--write");
  }
  std::printf("test_pipeline_headers: %d of %d checks failed\n", res.failures, res.checks);
  return res.failures ? 1 : 0;
}
