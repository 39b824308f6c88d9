// A fork-join thread pool for short parallel sections (a decode step launches ~200 ops of a
// few microseconds each, so the wake-up latency is what matters). Workers spin on a generation
// counter for a while after each job, then sleep on a condition variable; the calling thread
// always takes part, so a pool of n threads starts n - 1 workers.
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

  // Runs fn(task) for every task in [0, n_tasks), tasks handed out dynamically (so a thread
  // slowed by another process on its core takes fewer). Returns when all are done. Not
  // reentrant: one Run at a time (the plugin serialises launches per device).
  void Run(int64_t n_tasks, const std::function<void(int64_t task)>& fn);

  // Like Run with one task per thread: fn(thread_index, n_threads).
  void RunPerThread(const std::function<void(int thread, int n_threads)>& fn);

 private:
  void Publish();
  void WorkerLoop(int index);
  void Work(int index);

  const int n_threads_;
  std::vector<std::thread> workers_;
  // The current job. Published by bumping generation_ (release), read by workers (acquire).
  const std::function<void(int64_t)>* task_fn_ = nullptr;
  const std::function<void(int, int)>* thread_fn_ = nullptr;
  int64_t n_tasks_ = 0;
  std::atomic<int64_t> next_task_{0};
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};  // workers that have not finished the current generation
  std::atomic<int> sleepers_{0};
  bool stop_ = false;
  std::mutex mu_;
  std::condition_variable wake_;
};

}  // namespace polychip::cpu
