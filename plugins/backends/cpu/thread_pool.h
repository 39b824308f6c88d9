// A fork-join thread pool for short parallel sections (a decode step launches ~200 ops of a
// few microseconds each, so the wake-up latency is what matters). Workers spin on the job word
// for a while after each job, then sleep on a condition variable; the calling thread always
// takes part, so a pool of n threads starts n - 1 workers.
//
// A job completes when all its tasks are done, whoever ran them: the caller never waits for a
// worker that has not woken up yet (on a machine shared with other processes a descheduled
// worker would otherwise stall every op for a whole time slice). Tasks are claimed with a
// compare-and-swap on one 64-bit word holding (job generation, next task), so a worker that
// wakes up late can never claim a task of a job that has already finished.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace polychip::cpu {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // One round of a polite busy-wait (pause, then yield the core after a few thousand rounds):
  // for a task that waits on work another task has claimed and is running.
  static void Backoff(int round);

  // Runs fn(task) for every task in [0, n_tasks) (n_tasks < 2^32), tasks handed out
  // dynamically. Returns when all are done. One Run at a time (the plugin serialises launches).
  void Run(int64_t n_tasks, const std::function<void(int64_t task)>& fn);

  // Runs fn on a worker while the caller goes on (a launch the plugin lets overlap the ones
  // after it); Join waits for it. One at a time, Post and Join serialised with Run (the
  // plugin's launch lock), and fn must not call Run. A job no worker has started by Join runs on the caller, so
  // Join never waits for a sleeping or descheduled worker. With one thread, Post runs fn.
  void Post(std::function<void()> fn);
  // Whether the posted job has not finished (false once Join returned).
  bool Busy() const { return post_.load(std::memory_order_acquire) != kNoPost; }
  void Join();

 private:
  void WorkerLoop();
  // Claims and runs tasks of job `gen` until none are left or the job is no longer current.
  void Work(uint64_t gen);
  // Runs the posted job if no one has started it.
  void TryRunPosted();

  enum : int { kNoPost, kPosted, kPostRunning };

  const int n_threads_;
  std::vector<std::thread> workers_;
  // (generation << 32) | next task index. Written by Run (a new job) and by claims.
  std::atomic<uint64_t> job_{0};
  std::atomic<int64_t> n_tasks_{0};
  std::atomic<const std::function<void(int64_t)>*> fn_{nullptr};
  std::atomic<int64_t> done_{0};  // tasks of the current job finished
  std::atomic<int> sleepers_{0};
  std::atomic<int> post_{kNoPost};
  std::function<void()> post_fn_;  // written by Post while post_ is kNoPost
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::condition_variable wake_;
};

}  // namespace polychip::cpu
