#include "common/fault_guard.h"

#include <setjmp.h>
#include <signal.h>

#include <atomic>
#include <cstring>
#include <mutex>

namespace zckpt {

namespace {

struct Guard {
  sigjmp_buf jump;
  const char* begin;
  const char* end;
};

// Initial-exec TLS: reading it from the signal handler never allocates (general-dynamic TLS of a
// dlopen'ed library, as libzckpt is under Python, may on a thread's first access). One pointer
// to a Guard on the copying thread's stack; null outside GuardedCopy.
__attribute__((tls_model("initial-exec"))) thread_local Guard* volatile t_guard = nullptr;

struct sigaction g_previous;

void Restore(int sig) {
  struct sigaction dfl;
  std::memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(sig, &dfl, nullptr);
}

void OnSigbus(int sig, siginfo_t* info, void* context) {
  Guard* g = t_guard;
  const char* addr = static_cast<const char*>(info->si_addr);
  if (g != nullptr && info->si_code > 0 && addr >= g->begin && addr < g->end) siglongjmp(g->jump, 1);
  // Not ours: behave as if this handler were not there.
  if (g_previous.sa_flags & SA_SIGINFO) {
    if (g_previous.sa_sigaction != nullptr) return g_previous.sa_sigaction(sig, info, context);
  } else if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN) {
    return g_previous.sa_handler(sig);
  }
  // Default action: restore it; a fault re-executes the faulting access and dies of it, a sent
  // signal is sent again.
  Restore(sig);
  if (info->si_code <= 0) raise(sig);
}

void Install() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction action;
    std::memset(&action, 0, sizeof action);
    action.sa_sigaction = OnSigbus;
    // SA_NODEFER: leaving by siglongjmp (sigsetjmp without saving the mask, which costs a system
    // call per copy) must not leave SIGBUS blocked. SA_ONSTACK: a thread with an alternate signal
    // stack keeps using it.
    action.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
    sigemptyset(&action.sa_mask);
    sigaction(SIGBUS, &action, &g_previous);
  });
}

}  // namespace

bool GuardedCall(const void* begin, size_t n, void (*fn)(void*), void* ctx) {
  Install();
  Guard guard;
  guard.begin = static_cast<const char*>(begin);
  guard.end = guard.begin + n;
  Guard* const outer = t_guard;  // a guard inside a guard gives the outer one back after
  if (sigsetjmp(guard.jump, 0) != 0) {
    t_guard = outer;
    // SA_NODEFER kept SIGBUS unblocked in the handler, but a sanitizer's wrapper around it (TSan)
    // may have blocked it: unblock it here, or the next fault of this thread would kill the
    // process. (Only on this path: saving the mask in sigsetjmp costs a system call per call.)
    sigset_t bus;
    sigemptyset(&bus);
    sigaddset(&bus, SIGBUS);
    pthread_sigmask(SIG_UNBLOCK, &bus, nullptr);
    return false;
  }
  t_guard = &guard;
  std::atomic_signal_fence(std::memory_order_seq_cst);  // the guard is up before the first byte is read
  fn(ctx);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  t_guard = outer;
  return true;
}

bool GuardedCopy(void* dst, const void* src, size_t n) {
  if (n == 0) return true;
  auto copy = [&] { std::memcpy(dst, src, n); };
  return Guarded(src, n, copy);
}

}  // namespace zckpt
