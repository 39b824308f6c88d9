// Running a command line or a background program from a test and reading what it wrote. One
// version for every test folder, so each captures output and reports exit status the same way.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace polychip::testing {

// What a finished command left behind.
struct CommandResult {
  // The status it exited with; 128 + N when signal N ended it (as a shell reports it), so a
  // crash is never mistaken for a clean failure; -1 when it could not be started.
  int exit_code = -1;
  std::string out;     // stdout
  std::string err;     // stderr, when Stderr::kCaptured
  double seconds = 0;  // wall time
};

enum class Stderr {
  kCaptured,   // into CommandResult::err
  kMerged,     // into CommandResult::out, interleaved with stdout (`2>&1`)
  kDiscarded,  // `2>/dev/null`
};

// Runs `shell_command` through /bin/sh and waits for it. The redirection `stderr_to` asks for is
// appended to the command line, so it applies to the command's last stage.
CommandResult RunCommand(const std::string& shell_command, Stderr stderr_to = Stderr::kCaptured);

// `s` as one single-quoted shell word.
std::string ShellQuote(const std::string& s);

// "ASAN_OPTIONS=<this process's options>:handle_segv=0", for a child whose SIGSEGV the test
// expects: a sanitizer build would report it itself, and replacing the options outright would
// drop the ones the test preset set (detect_leaks=0). Harmless without a sanitizer.
std::string AsanOptionsWithoutSegvHandler();

// The whole file, "" when it cannot be read.
std::string ReadFile(const std::filesystem::path& path);

// The folder of the llama.cpp checkout the test setup fetches: $POLYCHIP_LLAMA_CPP_DIR, else
// $HOME/.cache/polychip/llama.cpp.
std::filesystem::path LlamaCppDir();

// A program started in the background (fork + exec, no shell) whose stderr, and its stdout
// unless discarded, go to a log file that the test can read while it runs. The destructor kills
// it if it is still running and removes the log.
class ChildProcess {
 public:
  struct Options {
    bool stdout_to_log = true;  // false: stdout goes to /dev/null
    // > 0: SIGALRM ends the program after this many seconds, in case the test never does.
    unsigned alarm_seconds = 0;
  };

  explicit ChildProcess(std::vector<std::string> argv);
  ChildProcess(std::vector<std::string> argv, Options options);
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // -1 once it has exited and been waited for (or when fork failed).
  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0; }
  std::string Log() const { return ReadFile(log_); }

  void Signal(int signal) const;
  // Waits up to `seconds` for it to exit; its exit status (as in CommandResult::exit_code), or
  // nullopt while it still runs.
  std::optional<int> Wait(double seconds);
  // Waits up to `seconds` for a server to log "listening on http://HOST:PORT"; the port, or 0
  // when the program exits or the time runs out first.
  int WaitForListeningPort(double seconds);

 private:
  std::filesystem::path log_;
  pid_t pid_ = -1;
};

}  // namespace polychip::testing
