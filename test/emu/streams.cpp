// test/emu/streams.cpp - streams, events and the schedule of the emulated runtime: each stream's
// work (kernels, copies, memsets, the stand-ins' GEMMs, sorts and NCCL calls) is queued and runs
// only when something forces it, in an order the declared dependencies allow, chosen by
// EMU_STREAMS.
//
// A stream is a queue. Work on it runs in the order it was queued; an event records a position
// in a queue (the work queued before cudaEventRecord), and cudaStreamWaitEvent queues a wait that
// holds the stream until the recording queue has run up to that position. The legacy default
// stream (nullptr, cudaStreamLegacy) follows CUDA's rules: its work waits for all work queued
// before it on the blocking streams, and work queued on a blocking stream waits for the legacy
// stream's earlier work; a stream created with cudaStreamNonBlocking (all of the trainer's) is
// ordered with nothing but its own events.
//
// What forces work to run - the host waits, and the queues run until what it waits for is done:
// cudaStreamSynchronize, cudaEventSynchronize, cudaDeviceSynchronize, cudaMemcpy (on the legacy
// stream), cudaMemcpyAsync to pageable host memory, cudaMalloc, cudaMallocHost, cudaFree and
// cudaFreeHost (which also separate the work of all streams), cudaStreamDestroy. cudaStreamQuery
// and cudaEventQuery advance the queues by one piece of work (a GPU keeps running on its own)
// and report cudaErrorNotReady until the work is done.
//
// The schedule (EMU_STREAMS) picks which queue runs next while the host waits:
//   sync          every piece of work runs when it is queued: the old synchronous streams;
//   late          only what the host waits for, as late as possible: the waited-for queue runs,
//                 and a wait at its head runs the recording queue up to the event, nothing else;
//   others-first  every other queue that can run runs before the waited-for one;
//   random:SEED   a queue that can run, drawn at random, and at each enqueue one piece of work
//                 of a random queue may run early.
// Every schedule respects every declared dependency, so a program whose dependencies are
// complete computes bitwise the same under all of them; a missing event wait shows as a
// difference (test/emu/README.md). An NCCL call that waits for other ranks lets the device's
// other queues run beside it (one step each), as a GPU's streams run concurrently; otherwise a
// rank blocked in one communicator's collective could stop the rank it waits for.
// EMU_HOST_SYNCS=1 prints, at exit, how often the host waited, in all and by the call that
// waited (test/test_stream_schedules.py counts a training step's).
// A capturing stream's work, events and waits go to graphs.cpp instead (CUDA graphs); the calls
// CUDA prohibits during a capture are refused there.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "test/emu/emu_internal.h"
#include "test/emu/include/emu_streams.h"

namespace emu {

namespace {

struct Queue;
// "Queue q has run its first `index` pieces of work."
struct Mark {
  Queue* queue = nullptr;
  uint64_t index = 0;
};

struct Work {
  const char* what;
  StreamWork step;  // empty for a wait
  Mark wait;        // a wait: ready once this mark is reached
};

struct Queue {
  std::deque<Work> work;
  uint64_t queued = 0, completed = 0;
  bool blocking = true, legacy = false, live = true;
};

struct EventState {
  Mark mark;
  bool recorded = false;
  std::chrono::steady_clock::time_point time;
};

enum class Schedule { Sync, Late, OthersFirst, Random };

struct Streams {
  std::recursive_mutex mutex;
  Schedule schedule = Schedule::Sync;
  uint64_t seed = 0;
  std::mt19937_64 rng;
  Queue legacy;
  std::vector<Queue*> queues;  // the legacy queue first; destroyed queues stay (events name them)
  std::vector<EventState*> events;
  size_t rotation = 0;
  std::atomic<uint64_t> host_waits{0};
  std::map<std::string, uint64_t> waits_by_call;  // what made the host wait, for EMU_HOST_SYNCS
};

void print_host_waits();

Streams& streams() {
  static Streams* s = [] {
    Streams* st = new Streams;  // never destroyed: work may be forced from static destructors
    st->legacy.legacy = true;
    st->queues.push_back(&st->legacy);
    const char* env = std::getenv("EMU_STREAMS");
    const std::string name = env ? env : "sync";
    if (name == "sync") st->schedule = Schedule::Sync;
    else if (name == "late") st->schedule = Schedule::Late;
    else if (name == "others-first") st->schedule = Schedule::OthersFirst;
    else if (name.rfind("random:", 0) == 0) {
      st->schedule = Schedule::Random;
      st->seed = std::strtoull(name.c_str() + 7, nullptr, 10);
    } else {
      std::fprintf(stderr, "emu: EMU_STREAMS=%s: one of sync, late, others-first, random:SEED\n",
                   name.c_str());
      std::exit(2);
    }
    st->rng.seed(st->seed * 0x9E3779B97F4A7C15ull + 1);
    if (env) std::fprintf(stderr, "emu: stream schedule %s\n", name.c_str());
    const char* count = std::getenv("EMU_HOST_SYNCS");
    if (count && std::strcmp(count, "1") == 0) std::atexit(print_host_waits);
    return st;
  }();
  return *s;
}

void print_host_waits() {
  Streams& s = streams();
  std::string calls;
  for (const auto& [call, n] : s.waits_by_call)
    calls += (calls.empty() ? "" : ", ") + call + " " + std::to_string(n);
  std::fprintf(stderr, "emu: host synchronisations %llu (%s)\n",
               (unsigned long long)s.host_waits.load(), calls.c_str());
}

bool reached(const Mark& m) { return !m.queue || m.queue->completed >= m.index; }

bool ready(const Queue* q) { return !q->work.empty() && reached(q->work.front().wait); }

// The queue whose head must run next for q to advance: q itself, or (q's head waiting) the
// queue its wait names, followed down.
Queue* chain(Queue* q) {
  while (!q->work.empty() && !reached(q->work.front().wait)) q = q->work.front().wait.queue;
  return q;
}

// Advances q's head; true once it has finished (then it leaves the queue).
bool step(Queue* q) {
  Work& w = q->work.front();
  const bool done = !w.step || w.step();
  if (done) {
    q->work.pop_front();
    q->completed++;
  }
  return done;
}

Queue* pick_random(Streams& s) {
  std::vector<Queue*> candidates;
  for (Queue* q : s.queues)
    if (ready(q)) candidates.push_back(q);
  if (candidates.empty()) return nullptr;
  return candidates[s.rng() % candidates.size()];
}

// The queue to advance for `target` (a queue to reach a mark of, or null: every queue).
Queue* pick(Streams& s, Queue* target) {
  if (!target)
    for (Queue* q : s.queues)
      if (!q->work.empty()) {
        target = q;
        break;
      }
  if (!target) return nullptr;
  Queue* needed = chain(target);
  switch (s.schedule) {
    case Schedule::Sync:
    case Schedule::Late: return needed;
    case Schedule::Random: return pick_random(s);
    case Schedule::OthersFirst:
      for (size_t i = 0; i < s.queues.size(); i++) {
        Queue* q = s.queues[(s.rotation + i) % s.queues.size()];
        if (q != target && q != needed && ready(q)) {
          s.rotation++;
          return q;
        }
      }
      return needed;
  }
  return needed;
}

// Work that waits for other ranks did not finish: give every other queue one step, as the
// device's other streams would run meanwhile.
void run_beside(Streams& s, Queue* waiting) {
  for (Queue* q : s.queues)
    if (q != waiting && ready(q)) step(q);
}

bool all_idle(Streams& s) {
  for (Queue* q : s.queues)
    if (!q->work.empty()) return false;
  return true;
}

// Runs queues until `m` is reached (m.queue null: until every queue is empty).
void drive(Streams& s, const Mark& m) {
  for (;;) {
    if (m.queue ? reached(m) : all_idle(s)) return;
    Queue* q = pick(s, m.queue);
    if (!q) fail("stream schedule: nothing can run but the host waits");
    if (!step(q)) run_beside(s, q);
  }
}

void host_wait(Streams& s, const Mark& m, const char* call) {
  s.host_waits++;
  s.waits_by_call[call]++;
  drive(s, m);
}

Mark end_of(Queue* q) { return Mark{q, q->queued}; }

void push(Queue* q, Work w) {
  q->work.push_back(std::move(w));
  q->queued++;
}

// The legacy stream's implicit waits (see the top of the file), queued ahead of new work on q.
void legacy_waits(Streams& s, Queue* q) {
  if (q->legacy) {
    for (Queue* b : s.queues)
      if (!b->legacy && b->live && b->blocking && !reached(end_of(b)))
        push(q, Work{"legacy stream wait", nullptr, end_of(b)});
  } else if (q->blocking && !reached(end_of(&s.legacy))) {
    push(q, Work{"legacy stream wait", nullptr, end_of(&s.legacy)});
  }
}

Queue* queue_of(cudaStream_t stream) {
  if (stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread)
    return &streams().legacy;
  return reinterpret_cast<Queue*>(stream);
}

bool is_queue(cudaStream_t stream) {
  if (stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread) return true;
  Streams& s = streams();
  for (Queue* q : s.queues)
    if (q == reinterpret_cast<Queue*>(stream)) return q->live;
  return false;
}

EventState* event_of(cudaEvent_t e) {
  Streams& s = streams();
  for (EventState* ev : s.events)
    if (ev == reinterpret_cast<EventState*>(e)) return ev;
  return nullptr;
}

}  // namespace

// Queues work on q (no capture), running it at once under sync; q's new end.
uint64_t push_now(Streams& s, Queue* q, const char* what, StreamWork work);

void enqueue_work(cudaStream_t stream, const char* what, StreamWork work) {
  Streams& s = streams();
  std::lock_guard<std::recursive_mutex> lock(s.mutex);
  if (capture_take(stream, what, [work] { return work; })) return;
  push_now(s, queue_of(stream), what, std::move(work));
}

void enqueue_made(cudaStream_t stream, const char* what, WorkMaker make) {
  Streams& s = streams();
  std::lock_guard<std::recursive_mutex> lock(s.mutex);
  if (capture_take(stream, what, make)) return;
  push_now(s, queue_of(stream), what, make());
}

uint64_t queue_push(cudaStream_t stream, const char* what, StreamWork work) {
  Streams& s = streams();
  std::lock_guard<std::recursive_mutex> lock(s.mutex);
  return push_now(s, queue_of(stream), what, std::move(work));
}

void queue_wait_position(cudaStream_t waiter, cudaStream_t on, uint64_t position) {
  Streams& s = streams();
  std::lock_guard<std::recursive_mutex> lock(s.mutex);
  Queue* q = queue_of(waiter);
  const Mark m{queue_of(on), position};
  if (reached(m)) return;
  legacy_waits(s, q);
  push(q, Work{"graph dependency", nullptr, m});
}

void queue_wait(cudaStream_t waiter, cudaStream_t on) {
  Streams& s = streams();
  std::lock_guard<std::recursive_mutex> lock(s.mutex);
  queue_wait_position(waiter, on, queue_of(on)->queued);
}

uint64_t push_now(Streams& s, Queue* q, const char* what, StreamWork work) {
  legacy_waits(s, q);
  push(q, Work{what, std::move(work), Mark{}});
  const uint64_t end = q->queued;
  if (s.schedule == Schedule::Sync) {
    drive(s, end_of(q));
  } else if (s.schedule == Schedule::Random && s.rng() % 4 == 0) {
    if (Queue* r = pick_random(s)) step(r);
  }
  return end;
}

bool valid_stream(cudaStream_t stream) {
  std::lock_guard<std::recursive_mutex> lock(streams().mutex);
  return is_queue(stream);
}

void wait_stream(cudaStream_t stream, const char* call) {
  Streams& s = streams();
  std::lock_guard<std::recursive_mutex> lock(s.mutex);
  host_wait(s, end_of(queue_of(stream)), call);
}

void wait_device(const char* call) {
  Streams& s = streams();
  std::lock_guard<std::recursive_mutex> lock(s.mutex);
  host_wait(s, Mark{}, call);
}

uint64_t host_synchronisations() { return streams().host_waits.load(); }

}  // namespace emu

using emu::set_last_error;

namespace {
cudaError_t bad_handle() {
  set_last_error(cudaErrorInvalidResourceHandle);
  return cudaErrorInvalidResourceHandle;
}
}  // namespace

cudaError_t cudaDeviceSynchronize() {
  if (cudaError_t e = emu::capture_refuses_host_wait(nullptr, true, "cudaDeviceSynchronize"))
    return e;
  emu::wait_device("cudaDeviceSynchronize");
  return cudaSuccess;
}

// --- streams -------------------------------------------------------------------------------------
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  emu::Streams& s = emu::streams();
  std::lock_guard<std::recursive_mutex> lock(s.mutex);
  auto* q = new emu::Queue;
  q->blocking = !(flags & cudaStreamNonBlocking);
  s.queues.push_back(q);
  *stream = reinterpret_cast<cudaStream_t>(q);
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, 0); }
cudaError_t cudaStreamCreateWithPriority(cudaStream_t* s, unsigned int flags, int) {
  return cudaStreamCreateWithFlags(s, flags);
}
// CUDA returns at once and lets the queued work finish; here it runs first (a legal order).
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  emu::Streams& s = emu::streams();
  std::lock_guard<std::recursive_mutex> lock(s.mutex);
  if (!stream || !emu::is_queue(stream) || emu::queue_of(stream)->legacy) return bad_handle();
  emu::Queue* q = emu::queue_of(stream);
  emu::drive(s, emu::end_of(q));
  q->live = false;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  emu::Streams& s = emu::streams();
  std::lock_guard<std::recursive_mutex> lock(s.mutex);
  if (!emu::is_queue(stream)) return bad_handle();
  if (cudaError_t e = emu::capture_refuses_host_wait(stream, false, "cudaStreamSynchronize"))
    return e;
  emu::host_wait(s, emu::end_of(emu::queue_of(stream)), "cudaStreamSynchronize");
  return cudaSuccess;
}
cudaError_t cudaStreamQuery(cudaStream_t stream) {
  emu::Streams& s = emu::streams();
  std::lock_guard<std::recursive_mutex> lock(s.mutex);
  if (!emu::is_queue(stream)) return bad_handle();
  if (cudaError_t e = emu::capture_refuses_host_wait(stream, false, "cudaStreamQuery")) return e;
  emu::Queue* q = emu::queue_of(stream);
  if (!q->work.empty()) emu::step(emu::pick(s, q));
  return q->work.empty() ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t e, unsigned int) {
  emu::Streams& s = emu::streams();
  std::lock_guard<std::recursive_mutex> lock(s.mutex);
  emu::EventState* ev = emu::event_of(e);
  if (!emu::is_queue(stream) || !ev) return bad_handle();
  bool captured = false;
  if (cudaError_t err = emu::capture_wait_event(stream, e, &captured)) return err;
  if (captured) return cudaSuccess;
  if (!ev->recorded || emu::reached(ev->mark)) return cudaSuccess;
  emu::Queue* q = emu::queue_of(stream);
  emu::legacy_waits(s, q);
  emu::push(q, emu::Work{"cudaStreamWaitEvent", nullptr, ev->mark});
  return cudaSuccess;
}

// --- events --------------------------------------------------------------------------------------
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int) {
  emu::Streams& s = emu::streams();
  std::lock_guard<std::recursive_mutex> lock(s.mutex);
  auto* ev = new emu::EventState;
  s.events.push_back(ev);
  *e = reinterpret_cast<cudaEvent_t>(ev);
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, 0); }
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  emu::Streams& s = emu::streams();
  std::lock_guard<std::recursive_mutex> lock(s.mutex);
  for (size_t i = 0; i < s.events.size(); i++)
    if (s.events[i] == reinterpret_cast<emu::EventState*>(e)) {
      delete s.events[i];
      s.events.erase(s.events.begin() + i);
      return cudaSuccess;
    }
  return bad_handle();
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t stream) {
  emu::Streams& s = emu::streams();
  std::lock_guard<std::recursive_mutex> lock(s.mutex);
  emu::EventState* ev = emu::event_of(e);
  if (!ev || !emu::is_queue(stream)) return bad_handle();
  if (emu::capture_event_record(e, stream)) return cudaSuccess;
  emu::Queue* q = emu::queue_of(stream);
  emu::legacy_waits(s, q);
  ev->recorded = true;
  emu::push(q, emu::Work{"cudaEventRecord", [ev] {
                           ev->time = std::chrono::steady_clock::now();
                           return true;
                         }, emu::Mark{}});
  ev->mark = emu::end_of(q);
  if (s.schedule == emu::Schedule::Sync) emu::drive(s, ev->mark);
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  emu::Streams& s = emu::streams();
  std::lock_guard<std::recursive_mutex> lock(s.mutex);
  emu::EventState* ev = emu::event_of(e);
  if (!ev) return bad_handle();
  if (cudaError_t err = emu::capture_refuses_event_use(e, "cudaEventSynchronize")) return err;
  emu::host_wait(s, ev->mark, "cudaEventSynchronize");
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
  emu::Streams& s = emu::streams();
  std::lock_guard<std::recursive_mutex> lock(s.mutex);
  emu::EventState* ev = emu::event_of(e);
  if (!ev) return bad_handle();
  if (cudaError_t err = emu::capture_refuses_event_use(e, "cudaEventQuery")) return err;
  if (!emu::reached(ev->mark)) emu::step(emu::pick(s, ev->mark.queue));
  return emu::reached(ev->mark) ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  emu::Streams& s = emu::streams();
  std::lock_guard<std::recursive_mutex> lock(s.mutex);
  emu::EventState* a = emu::event_of(start);
  emu::EventState* b = emu::event_of(end);
  if (!a || !b || !a->recorded || !b->recorded) return bad_handle();
  if (!emu::reached(a->mark) || !emu::reached(b->mark)) {
    set_last_error(cudaErrorNotReady);
    return cudaErrorNotReady;
  }
  *ms = std::chrono::duration<float, std::milli>(b->time - a->time).count();
  return cudaSuccess;
}
