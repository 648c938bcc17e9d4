// parallel/nccl_watchdog.cu - the NCCL watchdog thread (parallel/nccl_watchdog.h): operations
// queued on streams, each with the event recorded after it, watched against [parallel]
// timeout_s; communicators aborted and the job stopped when one is overdue or NCCL reports an
// asynchronous error. Compiled into ./train only (and the emulated build's tests).
//
// The queue is oldest first. The main thread appends (begin: an entry without an event; queued:
// its event recorded); the thread drops finished entries from the front, so the front is always
// the oldest operation not known to be done. Events are recycled through a spare list. One
// mutex guards it all; the thread holds it only to look, about every timeout_s / 10 (at most a
// second).
#include "parallel/nccl_watchdog.h"

#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

struct Queued {
  uint64_t ticket;
  ops::Event done = nullptr;  // recorded after the operation; nullptr while the call runs
  const char* op;
  Axis axis;
  int ranks;
  int64_t step;
  Clock::time_point at;
};

struct Watcher {
  double timeout_s = 0;
  std::mutex mutex;
  std::condition_variable wake;
  std::thread thread;
  bool stop = false;
  std::vector<std::pair<ncclComm_t, Axis>> comms;  // every watched communicator
  std::deque<Queued> queued;                       // oldest first
  std::vector<ops::Event> spare;
  uint64_t next_ticket = 0;
};

Watcher* watcher_of(const Comm& c) {
  return c.watch ? static_cast<Watcher*>(c.watch->nccl) : nullptr;
}

// Every communicator aborted, then the job stopped with `message` (called with the lock held).
[[noreturn]] void abort_all(Watcher& w, const std::string& message) {
  for (auto& [comm, axis] : w.comms) ncclCommAbort(comm);
  FATAL("%s", message.c_str());
}

// Drops the finished operations from the front; stops the job if the oldest unfinished one is
// overdue or a communicator reports an error.
void look(Watcher& w) {
  while (!w.queued.empty() && w.queued.front().done && ops::event_done(w.queued.front().done)) {
    w.spare.push_back(w.queued.front().done);
    w.queued.pop_front();
  }
  const double age = w.queued.empty() ? 0 :
      std::chrono::duration<double>(Clock::now() - w.queued.front().at).count();
  if (age > w.timeout_s) {
    const Queued& q = w.queued.front();
    char msg[512];
    std::snprintf(msg, sizeof(msg), "watchdog: NCCL %s on axis %s (%d ranks) queued at step %lld "
                  "has not completed after %.1f s, longer than [parallel] timeout_s = %g: another "
                  "rank of the group stopped, died or is far behind", q.op, axis_name(q.axis),
                  q.ranks, (long long)q.step, age, w.timeout_s);
    abort_all(w, msg);
  }
  for (auto& [comm, axis] : w.comms) {
    ncclResult_t state = ncclSuccess;
    if (ncclCommGetAsyncError(comm, &state) != ncclSuccess || state == ncclSuccess ||
        state == ncclInProgress)
      continue;
    abort_all(w, std::string("watchdog: NCCL reports \"") + ncclGetErrorString(state) +
                     "\" on axis " + axis_name(axis) + ": " + ncclGetLastError(comm));
  }
}

void watch(Watcher* w) {
  const auto poll = std::chrono::duration<double>(std::min(1.0, w->timeout_s / 10));
  std::unique_lock<std::mutex> lock(w->mutex);
  while (!w->stop) {
    w->wake.wait_for(lock, poll);
    if (!w->stop) look(*w);
  }
}

}  // namespace

void nccl_watch_register(Comm& c, void* nccl_comm) {
  if (!c.watch || c.watch->timeout_s <= 0) return;
  Watcher* w = watcher_of(c);
  if (!w) {
    w = new Watcher;
    w->timeout_s = c.watch->timeout_s;
    c.watch->nccl = w;
    w->thread = std::thread(watch, w);
  }
  std::lock_guard<std::mutex> lock(w->mutex);
  w->comms.push_back({static_cast<ncclComm_t>(nccl_comm), c.axis});
}

void nccl_watch_unregister(Comm& c, void* nccl_comm) {
  Watcher* w = watcher_of(c);
  if (!w) return;
  {
    std::lock_guard<std::mutex> lock(w->mutex);
    w->comms.erase(std::remove_if(w->comms.begin(), w->comms.end(), [&](const auto& e) {
      return e.first == static_cast<ncclComm_t>(nccl_comm);
    }), w->comms.end());
    if (!w->comms.empty()) return;
    w->stop = true;
  }
  w->wake.notify_one();
  w->thread.join();
  for (Queued& q : w->queued)
    if (q.done) ops::event_destroy(q.done);
  for (ops::Event e : w->spare) ops::event_destroy(e);
  delete w;
  c.watch->nccl = nullptr;
}

uint64_t nccl_watch_begin(Comm& c, const char* op) {
  Watcher* w = watcher_of(c);
  if (!w) return 0;
  std::lock_guard<std::mutex> lock(w->mutex);
  w->queued.push_back({w->next_ticket, nullptr, op, c.axis, c.size, c.watch->step, Clock::now()});
  return w->next_ticket++;
}

void nccl_watch_queued(Comm& c, uint64_t ticket, ops::Stream s) {
  Watcher* w = watcher_of(c);
  if (!w) return;
  std::lock_guard<std::mutex> lock(w->mutex);
  if (ops::stream_capturing(s)) {  // recorded into a CUDA graph: no event the host could query
    for (auto q = w->queued.begin(); q != w->queued.end(); ++q)
      if (q->ticket == ticket) {
        w->queued.erase(q);
        break;
      }
    return;
  }
  ops::Event e = nullptr;
  if (!w->spare.empty()) {
    e = w->spare.back();
    w->spare.pop_back();
  } else {
    e = ops::event_create();
  }
  ops::event_record(e, s);
  for (auto q = w->queued.rbegin(); q != w->queued.rend(); ++q)
    if (q->ticket == ticket) {
      q->done = e;
      return;
    }
  w->spare.push_back(e);  // its entry is gone: cannot happen, the thread drops recorded ones only
}
