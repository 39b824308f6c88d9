// Plugin code run in a forked child with a deadline (issue 16): `doctor`'s diagnosis, the probe of
// the plugins discovered on the search path and each conformance check go through here, so that a
// plugin that crashes or never returns is reported by the parent instead of taking it down. The
// child writes its answer to a pipe; the parent reads it until the child ends or the deadline
// passes (then kills it) and says how the child ended.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <string>
#include <string_view>

namespace polychip::runtime {

// How a child ended, with what it wrote.
struct ChildOutcome {
  std::string output;
  bool started = true;     // false: pipe() or fork() failed (nothing ran)
  bool timed_out = false;  // still running at the deadline, then killed
  int signal = 0;          // the signal that ended it; 0 if it exited (or timed out)
  int exit_status = 0;     // its exit status when it exited
  bool Clean() const { return started && !timed_out && signal == 0 && exit_status == 0; }
};

// "SIGSEGV" (or "signal 70" for one without a name).
std::string SignalName(int sig);
// Writes all of `s` to `fd`, retrying short writes (gives up on an error).
void WriteAll(int fd, std::string_view s);

// A forked child that runs `body(fd)` and then _exit(0)s; `body` writes its answer to `fd`.
// Several may run at once (Start each, then Wait each).
class ChildProcess {
 public:
  explicit ChildProcess(const std::function<void(int fd)>& body);
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // Reads the child's output until it closes the pipe or `deadline` passes (then kills it),
  // reaps it and says how it ended. Call once.
  ChildOutcome Wait(std::chrono::steady_clock::time_point deadline);

 private:
  pid_t pid_ = -1;
  int fd_ = -1;  // the read end
};

// Start and Wait in one, with a timeout in seconds.
ChildOutcome RunInChild(const std::function<void(int fd)>& body, double timeout_s);

// The deadline `seconds` from now.
std::chrono::steady_clock::time_point DeadlineIn(double seconds);

}  // namespace polychip::runtime
