#include "common/command.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <regex>
#include <thread>

namespace polychip::testing {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// A file name no other call, thread or test process uses at the same time.
fs::path UniqueTempPath(const std::string& suffix) {
  static std::atomic<int> counter{0};
  return fs::temp_directory_path() / ("polychip-test-" + std::to_string(getpid()) + "-" +
                                      std::to_string(counter++) + suffix);
}

int ExitCode(int wait_status) {
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return -1;
}

}  // namespace

CommandResult RunCommand(const std::string& shell_command, Stderr stderr_to) {
  CommandResult r;
  const fs::path err_file = UniqueTempPath(".err");
  std::string cmd = shell_command;
  switch (stderr_to) {
    case Stderr::kCaptured: cmd += " 2>" + ShellQuote(err_file.string()); break;
    case Stderr::kMerged: cmd += " 2>&1"; break;
    case Stderr::kDiscarded: cmd += " 2>/dev/null"; break;
  }
  const auto start = Clock::now();
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  r.exit_code = ExitCode(::pclose(p));
  r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (stderr_to == Stderr::kCaptured) {
    r.err = ReadFile(err_file);
    std::error_code ec;
    fs::remove(err_file, ec);
  }
  return r;
}

std::string ShellQuote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string AsanOptionsWithoutSegvHandler() {
  const char* current = std::getenv("ASAN_OPTIONS");
  return std::string("ASAN_OPTIONS=") + (current && *current ? std::string(current) + ":" : "") +
         "handle_segv=0";
}

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

fs::path LlamaCppDir() {
  if (const char* d = std::getenv("POLYCHIP_LLAMA_CPP_DIR"); d && *d) return d;
  const char* home = std::getenv("HOME");
  return fs::path(home ? home : "/root") / ".cache" / "polychip" / "llama.cpp";
}

ChildProcess::ChildProcess(std::vector<std::string> argv)
    : ChildProcess(std::move(argv), Options{}) {}

ChildProcess::ChildProcess(std::vector<std::string> argv, Options options)
    : log_(UniqueTempPath(".log")) {
  // Built before fork: the child of a threaded test may only make async-signal-safe calls.
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  pid_ = fork();
  if (pid_ != 0) return;
  const int log_fd = ::open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  const int null_fd = ::open("/dev/null", O_WRONLY);
  if (log_fd >= 0) dup2(log_fd, STDERR_FILENO);
  const int out_fd = options.stdout_to_log ? log_fd : null_fd;
  if (out_fd >= 0) dup2(out_fd, STDOUT_FILENO);
  if (options.alarm_seconds > 0) alarm(options.alarm_seconds);
  execv(args[0], args.data());
  _exit(127);
}

ChildProcess::~ChildProcess() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  std::error_code ec;
  fs::remove(log_, ec);
}

void ChildProcess::Signal(int signal) const {
  if (pid_ > 0) kill(pid_, signal);
}

std::optional<int> ChildProcess::Wait(double seconds) {
  if (pid_ <= 0) return std::nullopt;
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  int status = 0;
  while (waitpid(pid_, &status, WNOHANG) != pid_) {
    if (Clock::now() >= end) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  pid_ = -1;
  return ExitCode(status);
}

int ChildProcess::WaitForListeningPort(double seconds) {
  static const std::regex listening(R"(listening on http://[^:]+:(\d+))");
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  while (Clock::now() < end) {
    std::smatch m;
    const std::string text = Log();
    if (std::regex_search(text, m, listening)) return std::stoi(m[1]);
    // Reaps it when it has exited, so running() tells the caller why no port came.
    if (Wait(0).has_value() || !running()) return 0;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return 0;
}

}  // namespace polychip::testing
