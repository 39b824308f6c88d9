#include "runtime/child_process.h"

#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>

namespace polychip::runtime {

std::string SignalName(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev != nullptr ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

void WriteAll(int fd, std::string_view s) {
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = write(fd, s.data() + off, s.size() - off);
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
}

std::chrono::steady_clock::time_point DeadlineIn(double seconds) {
  return std::chrono::steady_clock::now() +
         std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

ChildProcess::ChildProcess(const std::function<void(int fd)>& body) {
  int fds[2];
  if (pipe(fds) != 0) return;
  // Whatever this process has buffered would otherwise be printed twice, once by the child.
  std::fflush(nullptr);
  pid_ = fork();
  if (pid_ < 0) {
    close(fds[0]);
    close(fds[1]);
    return;
  }
  if (pid_ == 0) {
    close(fds[0]);
    body(fds[1]);
    std::fflush(nullptr);
    _exit(0);  // no atexit handlers or destructors of the parent's objects
  }
  close(fds[1]);
  fd_ = fds[0];
}

ChildProcess::~ChildProcess() {
  if (fd_ >= 0) close(fd_);
  if (pid_ > 0) {  // never waited for: do not leave it running or a zombie
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
}

ChildOutcome ChildProcess::Wait(std::chrono::steady_clock::time_point deadline) {
  ChildOutcome outcome;
  if (pid_ <= 0 || fd_ < 0) {
    outcome.started = false;
    return outcome;
  }
  for (;;) {
    // Past the deadline, what the child has already written (and its end) is still taken: with
    // several children waited for in turn, the later ones have usually long finished.
    const auto left = std::max<int64_t>(
        0, std::chrono::duration_cast<std::chrono::milliseconds>(deadline -
                                                                 std::chrono::steady_clock::now())
               .count());
    pollfd p{fd_, POLLIN, 0};
    const int ready = poll(&p, 1, static_cast<int>(left));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) {
      if (left > 0 && ready == 0) continue;
      outcome.timed_out = true;
      break;
    }
    char buf[4096];
    const ssize_t n = read(fd_, buf, sizeof buf);
    if (n <= 0) break;  // the child closed its end: it is ending
    outcome.output.append(buf, static_cast<size_t>(n));
  }
  close(fd_);
  fd_ = -1;
  if (outcome.timed_out) kill(pid_, SIGKILL);
  int status = 0;
  waitpid(pid_, &status, 0);
  pid_ = -1;
  if (!outcome.timed_out) {
    if (WIFSIGNALED(status)) outcome.signal = WTERMSIG(status);
    if (WIFEXITED(status)) outcome.exit_status = WEXITSTATUS(status);
  }
  return outcome;
}

ChildOutcome RunInChild(const std::function<void(int fd)>& body, double timeout_s) {
  ChildProcess child(body);
  return child.Wait(DeadlineIn(timeout_s));
}

}  // namespace polychip::runtime
