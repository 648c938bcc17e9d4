// kernels/trace.cpp - the trace recorder of kernels/trace.h: spans kept in memory during a traced
// step, their times read after it, every traced step so far written to DIR/rank_<r>.json.
//
// Chrome's trace-event format: {"traceEvents": [...]} with one complete event ("ph": "X") per
// span: name, cat, ts and dur in microseconds, pid (the rank), tid (the lane), args; and
// metadata events ("ph": "M") naming the process and its threads. Spans of one lane nest,
// because a span closes before the one around it (C++ scopes); ts is rounded to the nanosecond
// and dur is taken between the rounded ends, so nesting survives the rounding. ts counts from
// midnight UTC (a step across midnight is drawn a day apart: rare, and only cosmetic).
#include "kernels/trace.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <vector>

namespace trace {
namespace {

struct Record {
  Lane lane;
  const char* category;
  std::string name, args;  // args: the body of a JSON object ("" = none)
  ops::Stream stream = nullptr;
  ops::Event begin = nullptr, end = nullptr;  // stream spans
  double begin_us = 0, end_us = 0;            // host spans (wall clock), and after the step all
  bool host = false;
};

struct Recorder {
  std::string dir, path;
  int first = 0, last = -1, rank = 0, step = 0;
  ops::Stream compute = nullptr;
  ops::Event origin = nullptr;  // recorded on compute at the step's start
  double origin_us = 0;         // its wall-clock time
  std::vector<ops::Event> pool;
  size_t used = 0;
  std::vector<Record> open;     // this step's spans
  int op_index = -1;            // the op span open now (ops do not nest: kernels/trace.h)
  std::vector<std::string> written;  // the events of the traced steps so far, as JSON
};

Recorder& rec() {
  static Recorder r;
  return r;
}

// Microseconds since midnight UTC (the ranks of a job agree on it as their clocks do); small
// enough that a double keeps the nanoseconds.
double wall_us() {
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  const auto day = std::chrono::duration_cast<std::chrono::hours>(now).count() / 24;
  return std::chrono::duration<double, std::micro>(now - std::chrono::hours(24 * day)).count();
}

ops::Event take_event() {
  Recorder& r = rec();
  if (r.used == r.pool.size()) r.pool.push_back(ops::event_create());
  return r.pool[r.used++];
}

void make_dirs(const std::string& dir) {
  for (size_t i = 1; i <= dir.size(); i++)
    if (i == dir.size() || dir[i] == '/') {
      const std::string part = dir.substr(0, i);
      if (mkdir(part.c_str(), 0755) != 0 && errno != EEXIST)
        FATAL("[log] trace: cannot create %s", part.c_str());
    }
}

std::string quoted(const std::string& s) {
  std::string q = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') q += '\\';
    if ((unsigned char)c >= 0x20) q += c;
  }
  return q + "\"";
}

std::string event_json(const Record& e, int rank, int step) {
  const double ts = std::round(e.begin_us * 1e3) / 1e3, end = std::round(e.end_us * 1e3) / 1e3;
  char head[256];
  std::snprintf(head, sizeof(head), "{\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f,"
                "\"cat\":", rank, (int)e.lane, ts, std::max(0.0, end - ts));
  std::string j = head + quoted(e.category) + ",\"name\":" + quoted(e.name) +
                  ",\"args\":{\"step\":" + std::to_string(step);
  if (!e.args.empty()) j += "," + e.args;
  return j + "}}";
}

std::string metadata(int rank) {
  char text[512];
  std::snprintf(text, sizeof(text),
                "{\"ph\":\"M\",\"pid\":%d,\"name\":\"process_name\",\"args\":{\"name\":\"rank %d\"}},\n"
                "{\"ph\":\"M\",\"pid\":%d,\"name\":\"process_sort_index\",\"args\":{\"sort_index\":%d}},\n"
                "{\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"name\":\"thread_name\",\"args\":{\"name\":\"host\"}},\n"
                "{\"ph\":\"M\",\"pid\":%d,\"tid\":1,\"name\":\"thread_name\",\"args\":{\"name\":\"compute stream\"}},\n"
                "{\"ph\":\"M\",\"pid\":%d,\"tid\":2,\"name\":\"thread_name\",\"args\":{\"name\":\"comm stream\"}}",
                rank, rank, rank, rank, rank, rank, rank);
  return text;
}

void write_file() {
  Recorder& r = rec();
  const std::string tmp = r.path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "w");
  CHECK(f, "[log] trace: cannot write %s", tmp.c_str());
  std::fprintf(f, "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n%s", metadata(r.rank).c_str());
  for (const std::string& e : r.written) std::fprintf(f, ",\n%s", e.c_str());
  std::fprintf(f, "\n]}\n");
  CHECK(std::fclose(f) == 0, "[log] trace: cannot write %s", tmp.c_str());
  CHECK(std::rename(tmp.c_str(), r.path.c_str()) == 0, "[log] trace: cannot rename %s",
        tmp.c_str());
}

// A span opens: its record, its begin event on the stream (or the host clock), an NVTX range.
int open_span(Recorder& r, Lane lane, const char* category, const char* name, ops::Stream stream) {
  Record e;
  e.lane = lane;
  e.category = category;
  e.name = name;
  e.stream = stream;
  e.host = stream == nullptr;
  if (e.host) {
    e.begin_us = wall_us();
  } else {
    e.begin = take_event();
    e.end = take_event();
    ops::event_record(e.begin, stream);
  }
  r.open.push_back(std::move(e));
  ops::range_push(name);
  return (int)r.open.size() - 1;
}

void close_span(int index) {
  Recorder& r = rec();
  if (!detail::inside || index >= (int)r.open.size()) return;
  Record& e = r.open[index];
  ops::range_pop();
  if (e.host)
    e.end_us = wall_us();
  else
    ops::event_record(e.end, e.stream);
}

void op_close(int index) {
  rec().op_index = -1;
  close_span(index);
}

// The op hooks of kernels/trace.h: an op's span on its stream's lane, with its shapes and bytes.
int op_open(const char* name, const void* stream, long long bytes,
            std::initializer_list<detail::OpArg> args) {
  Recorder& r = rec();
  ops::Stream s = (ops::Stream)stream;
  if (!detail::inside || ops::is_dry(s) || r.op_index >= 0) return -1;  // an inner op: the outer's
  const int index = open_span(r, s == r.compute || !s ? Lane::Compute : Lane::Comm, "op", name, s);
  r.op_index = index;
  std::string& a = r.open[index].args;
  for (const detail::OpArg& x : args)
    a += "\"" + std::string(x.key) + "\":" + std::to_string(x.value) + ",";
  a += "\"bytes\":" + std::to_string(bytes);
  return index;
}

}  // namespace

void configure(const std::string& dir, int first, int last, int rank, ops::Stream compute) {
  Recorder& r = rec();
  r.dir = dir;
  r.first = first;
  r.last = last;
  r.rank = rank;
  r.compute = compute;
  if (dir.empty()) return;
  make_dirs(dir);
  r.path = dir + "/rank_" + std::to_string(rank) + ".json";
  r.origin = ops::event_create();
  detail::op_open = op_open;
  detail::op_close = op_close;
}

void step_begin(int step) {
  Recorder& r = rec();
  if (r.dir.empty() || step < r.first || step > r.last) return;
  detail::inside = true;
  r.step = step;
  r.used = 0;
  r.op_index = -1;
  r.open.clear();
  ops::stream_sync(r.compute);  // the origin's host time is when the stream reaches it
  r.origin_us = wall_us();
  ops::event_record(r.origin, r.compute);
}

void step_end(int step) {
  Recorder& r = rec();
  if (!detail::inside) return;
  detail::inside = false;
  for (Record& e : r.open) {
    if (e.host) continue;
    ops::event_sync(e.end);
    e.begin_us = r.origin_us + 1e3 * ops::event_elapsed_ms(r.origin, e.begin);
    e.end_us = r.origin_us + 1e3 * ops::event_elapsed_ms(r.origin, e.end);
  }
  for (const Record& e : r.open) r.written.push_back(event_json(e, r.rank, r.step));
  r.open.clear();
  write_file();
}

void shutdown() {
  Recorder& r = rec();
  for (ops::Event e : r.pool) ops::event_destroy(e);
  r.pool.clear();
  if (r.origin) ops::event_destroy(r.origin);
  r.origin = nullptr;
  r.dir.clear();
  detail::op_open = nullptr;
  detail::op_close = nullptr;
}

Span::Span(Lane lane, const char* category, const char* name, ops::Stream stream) {
  Recorder& r = rec();
  if (!detail::inside) return;
  index_ = open_span(r, lane, category, name, stream);
}

Span::~Span() {
  if (index_ >= 0) close_span(index_);
}

void Span::name(const std::string& n) {
  if (index_ >= 0) rec().open[index_].name = n;
}

void Span::arg(const char* key, long long value) {
  if (index_ < 0) return;
  std::string& a = rec().open[index_].args;
  a += (a.empty() ? "\"" : ",\"") + std::string(key) + "\":" + std::to_string(value);
}

void Span::arg(const char* key, const char* value) {
  if (index_ < 0) return;
  std::string& a = rec().open[index_].args;
  a += (a.empty() ? "\"" : ",\"") + std::string(key) + "\":" + quoted(value);
}

void Span::arg_list(const char* key, const std::string& json) {
  if (index_ < 0) return;
  std::string& a = rec().open[index_].args;
  a += (a.empty() ? "\"" : ",\"") + std::string(key) + "\":" + json;
}

}  // namespace trace
