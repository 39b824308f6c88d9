#include "thread_pool.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

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

inline uint64_t Gen(uint64_t job) { return job >> 32; }
// Task index of a job being set up: nothing can be claimed, and claims of the previous job fail.
constexpr uint64_t kOpening = 0xFFFFFFFFu;

}  // namespace

// Busy-waits politely: pause for the first few thousand rounds (a few microseconds: the usual
// wait inside a decode step), then yield the core, which matters when the machine is
// oversubscribed and the thread we wait for needs this core to finish.
void ThreadPool::Backoff(int round) {
  if (round < 4096) {
    Pause();
  } else {
    std::this_thread::yield();
  }
}

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads < 1 ? 1 : n_threads) {
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true);
    job_.fetch_add(uint64_t{1} << 32);  // a new generation wakes everyone
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::Work(uint64_t gen) {
  uint64_t job = job_.load(std::memory_order_acquire);
  for (;;) {
    if (Gen(job) != gen) return;  // the job finished (and maybe another began)
    if ((job & 0xFFFFFFFFu) == kOpening) {  // Run is still filling in fn_ and n_tasks_
      Pause();
      job = job_.load(std::memory_order_acquire);
      continue;
    }
    const int64_t task = static_cast<int64_t>(job & 0xFFFFFFFFu);
    if (task >= n_tasks_.load(std::memory_order_relaxed)) return;
    // Success proves the job is still `gen`, hence fn_ and n_tasks_ are its own: a job cannot
    // finish while one of its tasks is claimed and not done.
    if (!job_.compare_exchange_weak(job, job + 1, std::memory_order_acq_rel,
                                    std::memory_order_acquire))
      continue;
    (*fn_.load(std::memory_order_relaxed))(task);
    done_.fetch_add(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::WorkerLoop() {
  // Generation 0 is the constructor's: reading job_ here instead could miss a job (or the
  // destructor's wake-up) published before this thread got to run.
  uint64_t seen = 0;
  for (;;) {
    auto start = std::chrono::steady_clock::now();
    int spins = 0;
    uint64_t gen;
    while ((gen = Gen(job_.load(std::memory_order_acquire))) == seen) {
      if (post_.load(std::memory_order_acquire) == kPosted) {
        TryRunPosted();
        start = std::chrono::steady_clock::now();
        continue;
      }
      Backoff(spins);
      if (++spins % 1024 == 0 && std::chrono::steady_clock::now() - start > kSpin) {
        std::unique_lock<std::mutex> lock(mu_);
        sleepers_.fetch_add(1);
        wake_.wait(lock, [&] {
          return Gen(job_.load(std::memory_order_acquire)) != seen ||
                 post_.load(std::memory_order_acquire) == kPosted;
        });
        sleepers_.fetch_sub(1);
        start = std::chrono::steady_clock::now();
        spins = 0;
      }
    }
    if (stop_.load()) return;
    seen = gen;
    Work(gen);
  }
}

void ThreadPool::Run(int64_t n_tasks, const std::function<void(int64_t)>& fn) {
  if (n_tasks <= 0) return;
  if (n_threads_ == 1 || n_tasks == 1) {
    for (int64_t t = 0; t < n_tasks; ++t) fn(t);
    return;
  }
  // First move to the new generation with nothing claimable: a worker still holding the old
  // job word now fails its claim, so it cannot pair the old word with the new fn_/n_tasks_.
  const uint64_t gen = Gen(job_.load(std::memory_order_relaxed)) + 1;
  job_.store((gen << 32) | kOpening, std::memory_order_seq_cst);
  fn_.store(&fn, std::memory_order_relaxed);
  n_tasks_.store(n_tasks, std::memory_order_relaxed);
  done_.store(0, std::memory_order_relaxed);
  {
    // Publishing under the lock pairs with a sleeper's predicate check, so a wake-up is never
    // lost; the notify (a syscall) is skipped while every worker spins.
    std::lock_guard<std::mutex> lock(mu_);
    job_.store(gen << 32, std::memory_order_release);
  }
  if (sleepers_.load() > 0) wake_.notify_all();
  Work(gen);
  for (int round = 0; done_.load(std::memory_order_acquire) != n_tasks; ++round) Backoff(round);
}

void ThreadPool::TryRunPosted() {
  int posted = kPosted;
  if (!post_.compare_exchange_strong(posted, kPostRunning, std::memory_order_acq_rel)) return;
  post_fn_();
  post_.store(kNoPost, std::memory_order_release);
}

void ThreadPool::Post(std::function<void()> fn) {
  if (n_threads_ == 1) {
    fn();
    return;
  }
  post_fn_ = std::move(fn);
  {
    std::lock_guard<std::mutex> lock(mu_);  // as in Run: a sleeper cannot miss it
    post_.store(kPosted, std::memory_order_release);
  }
  if (sleepers_.load() > 0) wake_.notify_one();
}

void ThreadPool::Join() {
  TryRunPosted();
  for (int round = 0; post_.load(std::memory_order_acquire) != kNoPost; ++round) Backoff(round);
}

}  // namespace polychip::cpu
