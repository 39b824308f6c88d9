#include "thread_pool.h"

#include <immintrin.h>

#include <chrono>

namespace polychip::cpu {
namespace {

// How long an idle worker keeps spinning before it sleeps. A decode step's ops follow each
// other within microseconds, and the gap between two steps (sampling) is well under this, so
// workers stay awake during generation and sleep when the device is idle.
constexpr auto kSpin = std::chrono::microseconds(2000);

inline void Pause() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}

// Busy-waits politely: pause for the first few thousand rounds (a few microseconds: the usual
// wait inside a decode step), then yield the core, which matters when the machine is
// oversubscribed and the thread we wait for needs this core to finish.
inline void Backoff(int round) {
  if (round < 4096) {
    Pause();
  } else {
    std::this_thread::yield();
  }
}

}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads < 1 ? 1 : n_threads) {
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::Work(int index) {
  if (thread_fn_ != nullptr) {
    (*thread_fn_)(index, n_threads_);
    return;
  }
  for (;;) {
    const int64_t t = next_task_.fetch_add(1, std::memory_order_relaxed);
    if (t >= n_tasks_) break;
    (*task_fn_)(t);
  }
}

void ThreadPool::WorkerLoop(int index) {
  uint64_t seen = 0;
  for (;;) {
    // Spin, then sleep, until a new generation is published.
    auto start = std::chrono::steady_clock::now();
    int spins = 0;
    while (generation_.load(std::memory_order_acquire) == seen) {
      Backoff(spins);
      if (++spins % 1024 == 0 && std::chrono::steady_clock::now() - start > kSpin) {
        std::unique_lock<std::mutex> lock(mu_);
        sleepers_.fetch_add(1);
        wake_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
        sleepers_.fetch_sub(1);
        start = std::chrono::steady_clock::now();
        spins = 0;
      }
    }
    seen = generation_.load(std::memory_order_acquire);
    if (stop_) return;
    Work(index);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::Publish() {
  // Bumping the generation under the lock pairs with a sleeper's predicate check, so a
  // wake-up is never lost; the notify (a syscall) is skipped while every worker spins.
  {
    std::lock_guard<std::mutex> lock(mu_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  if (sleepers_.load() > 0) wake_.notify_all();
}

void ThreadPool::Run(int64_t n_tasks, const std::function<void(int64_t)>& fn) {
  if (n_tasks <= 0) return;
  if (n_threads_ == 1 || n_tasks == 1) {
    for (int64_t t = 0; t < n_tasks; ++t) fn(t);
    return;
  }
  task_fn_ = &fn;
  thread_fn_ = nullptr;
  n_tasks_ = n_tasks;
  next_task_.store(0, std::memory_order_relaxed);
  pending_.store(n_threads_ - 1, std::memory_order_relaxed);
  Publish();
  Work(0);
  for (int round = 0; pending_.load(std::memory_order_acquire) != 0; ++round) Backoff(round);
}

void ThreadPool::RunPerThread(const std::function<void(int, int)>& fn) {
  if (n_threads_ == 1) {
    fn(0, 1);
    return;
  }
  thread_fn_ = &fn;
  task_fn_ = nullptr;
  pending_.store(n_threads_ - 1, std::memory_order_relaxed);
  Publish();
  Work(0);
  for (int round = 0; pending_.load(std::memory_order_acquire) != 0; ++round) Backoff(round);
}

}  // namespace polychip::cpu
