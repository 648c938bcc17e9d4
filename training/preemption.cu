// training/preemption.cu - the signal handlers and the per-step agreement of
// training/preemption.h.
//
// A handler may only do async-signal-safe things: it stores the signal number in a
// sig_atomic_t (the one piece of process-wide state here: a signal handler has no other way to
// reach the program) and, for a second signal, writes a fixed message with write(2) and leaves
// with _exit. Everything else - agreeing, saving, printing - happens in the training loop.
#include "training/preemption.h"

#include <signal.h>
#include <unistd.h>

#include <cstring>

namespace {

volatile sig_atomic_t g_signal = 0;  // the first SIGTERM / SIGINT / SIGUSR1 received (0: none)

void on_signal(int sig) {
  if (g_signal != 0) {
    static const char msg[] = "second signal: stopping at once, without a checkpoint\n";
    ssize_t ignored = write(STDERR_FILENO, msg, sizeof(msg) - 1);
    (void)ignored;
    _exit(128 + sig);
  }
  g_signal = sig;
}

}  // namespace

void preemption_install() {
  struct sigaction sa;
  std::memset(&sa, 0, sizeof(sa));
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // a read or write the signal interrupts carries on
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGUSR1, &sa, nullptr);
}

int preemption_signal() { return g_signal; }

int preemption_agreed(Comm& world) {
  return (int)all_reduce_host_max(world, (double)preemption_signal());
}

const char* signal_name(int sig) {
  switch (sig) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGUSR1: return "SIGUSR1";
    default: return "a signal";
  }
}
