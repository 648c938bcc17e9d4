// test/emu/fiber.cpp - the fibers that emulated GPU threads run on: stacks, a context switch of a
// few instructions, and a fault handler that says which emulated thread crashed.
//
// Switching: emu_fiber_switch pushes the six callee-saved registers of the x86-64 System V ABI
// (rbp, rbx, r12-r15) on the current stack, stores the stack pointer, loads the other context's
// stack pointer and pops its registers; the final `ret` resumes where that context called
// emu_fiber_switch (or enters a new fiber, see fiber_prepare). Everything else is caller-saved,
// so the compiler has already spilled it. glibc's swapcontext does the same plus a sigprocmask
// system call per switch, which made an emulator built on it about ten times slower. The MXCSR
// and x87 control words are not switched: nothing in the emulated kernels changes them.
// Other architectures fall back to ucontext (correct, slower).
//
// Stacks are mmap'ed (EMU_STACK_KB, default 256 KiB: AddressSanitizer builds need the room) with
// a PROT_NONE guard page below, and reused from block to block; the pages a thread never touches
// cost nothing.
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "test/emu/emu_internal.h"

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

namespace emu {

Stack stack_allocate(size_t bytes) {
  const size_t page = (size_t)sysconf(_SC_PAGESIZE);
  bytes = (bytes + page - 1) / page * page;
  void* p = mmap(nullptr, bytes + page, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) fail("cannot map a %zu-byte fiber stack", bytes);
  if (mprotect(p, page, PROT_NONE) != 0) fail("cannot protect a fiber stack's guard page");
  Stack s;
  s.base = static_cast<char*>(p) + page;
  s.size = bytes;
  return s;
}

#if defined(__x86_64__)

asm(R"(
  .text
  .globl emu_fiber_switch
  .type emu_fiber_switch, @function
emu_fiber_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size emu_fiber_switch, .-emu_fiber_switch
)");

// The new stack holds, from the top: a zero return address for entry() (it never returns; the
// slot keeps the ABI's alignment: rsp % 16 == 8 at a function's first instruction), entry's
// address for emu_fiber_switch's `ret`, and six zeros for the registers it pops.
void fiber_prepare(void** sp, const Stack& stack, void (*entry)()) {
  uintptr_t top = (reinterpret_cast<uintptr_t>(stack.base) + stack.size) & ~uintptr_t(15);
  uint64_t* p = reinterpret_cast<uint64_t*>(top);
  *--p = 0;
  *--p = reinterpret_cast<uint64_t>(entry);
  for (int i = 0; i < 6; i++) *--p = 0;
  *sp = p;
}

#else  // ucontext fallback: *sp points at a ucontext_t kept at the top of the stack

extern "C" void emu_fiber_switch(void** save, void* load) {
  ucontext_t here;
  *save = &here;
  swapcontext(&here, static_cast<ucontext_t*>(load));
}

void fiber_prepare(void** sp, const Stack& stack, void (*entry)()) {
  ucontext_t* uc = reinterpret_cast<ucontext_t*>(stack.base + stack.size - sizeof(ucontext_t));
  getcontext(uc);
  uc->uc_stack.ss_sp = stack.base;
  uc->uc_stack.ss_size = stack.size - sizeof(ucontext_t) - 64;
  uc->uc_link = nullptr;
  makecontext(uc, entry, 0);
  *sp = uc;
}

#endif

namespace {

struct sigaction previous_segv, previous_bus;

void on_fault(int sig, siginfo_t* info, void* context) {
  const Block* b = running_block();
  const Fiber* f = running_fiber();
  if (b && f) {
    const char* addr = static_cast<const char*>(info->si_addr);
    const bool overflow = addr < f->stack.base && addr >= f->stack.base - 65536;
    std::fprintf(stderr,
                 "emu: %s in kernel %s (%s:%d), block (%u,%u,%u), thread (%u,%u,%u), address "
                 "%p%s\n",
                 sig == SIGSEGV ? "segmentation fault" : "bus error", b->launch->site.kernel,
                 b->launch->site.file, b->launch->site.line, b->state.block_idx.x,
                 b->state.block_idx.y, b->state.block_idx.z, f->state.thread_idx.x,
                 f->state.thread_idx.y, f->state.thread_idx.z, info->si_addr,
                 overflow ? ": the emulated thread overflowed its stack (raise EMU_STACK_KB)" : "");
  }
  // Hand the fault to whoever handled it before (AddressSanitizer, or the default action): the
  // faulting instruction runs again on return.
  sigaction(sig, sig == SIGSEGV ? &previous_segv : &previous_bus, nullptr);
  (void)context;
}

}  // namespace

void install_fault_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa;
    std::memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &previous_segv);
    sigaction(SIGBUS, &sa, &previous_bus);
  });
  // The handler runs on an alternate stack: a fiber that overflowed its own has none left.
  static thread_local bool have_altstack = false;
  if (have_altstack) return;
  stack_t ss;
  std::memset(&ss, 0, sizeof(ss));
  ss.ss_size = 64 * 1024;
  ss.ss_sp = std::malloc(ss.ss_size);
  if (ss.ss_sp && sigaltstack(&ss, nullptr) == 0) have_altstack = true;
}

}  // namespace emu
