// Runs the real `polychip serve` binary as a child process on a free loopback port, over a tiny
// synthesized model (random weights, qwen2's real tokenizer), for tests that drive it over HTTP.
#pragma once

#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <initializer_list>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/command.h"
#include "common/sse.h"

namespace polychip::server::testing {

namespace fs = std::filesystem;
using nlohmann::json;

inline fs::path BuildDir() { return POLYCHIP_BUILD_DIR; }
inline fs::path PolychipBinary() { return BuildDir() / "bin" / "polychip"; }
inline fs::path CpuPlugin() {
  return BuildDir() / "lib" / "polychip" / "libpolychip_backend_cpu.so";
}

using polychip::testing::LlamaCppDir;
using polychip::testing::RunCommand;

// Where tests/setup/setup-test-deps.sh installs the npm test clients (openai, puppeteer-core):
// $POLYCHIP_NPM_DIR, default $HOME/.cache/polychip/npm.
inline fs::path NpmDir() {
  if (const char* d = std::getenv("POLYCHIP_NPM_DIR"); d && *d) return d;
  const char* home = std::getenv("HOME");
  return fs::path(home ? home : "/root") / ".cache" / "polychip" / "npm";
}

// The tiny model (2 layers, 128 wide, qwen2 vocabulary), synthesized once per build directory.
// Empty with `why` set when it cannot be made.
inline fs::path TinyModel(std::string* why) {
  const fs::path vocab = LlamaCppDir() / "models" / "ggml-vocab-qwen2.gguf";
  const fs::path model = BuildDir() / "test-data" / "serve-tiny-qwen2-q8_0.gguf";
  if (fs::exists(model)) return model;
  if (!fs::exists(vocab)) {
    *why = vocab.string() + " not found: run tests/setup/setup-test-deps.sh or set "
           "POLYCHIP_LLAMA_CPP_DIR";
    return {};
  }
  fs::create_directories(model.parent_path());
  // Tests may run in parallel: write aside, then rename into place atomically.
  const fs::path tmp = model.string() + ".tmp" + std::to_string(getpid());
  const std::string cmd = PolychipBinary().string() + " gguf synth --vocab " + vocab.string() +
                          " --shape tiny --type Q8_0 --seed 7 -q --out " + tmp.string();
  if (RunCommand(cmd).exit_code != 0) {
    *why = "model synthesis failed: " + cmd;
    return {};
  }
  fs::rename(tmp, model);
  return model;
}

// Skips the test when the binary, the cpu plugin or the vocabulary is not there.
#define PC_REQUIRE_SERVE_DEPS(model_var)                                                   \
  std::string model_var;                                                                   \
  do {                                                                                     \
    if (!fs::exists(::polychip::server::testing::PolychipBinary())) {                      \
      GTEST_SKIP() << "polychip binary not built";                                         \
    }                                                                                      \
    if (!fs::exists(::polychip::server::testing::CpuPlugin())) {                           \
      GTEST_SKIP() << "cpu plugin not built";                                              \
    }                                                                                      \
    std::string why_;                                                                      \
    model_var = ::polychip::server::testing::TinyModel(&why_).string();                    \
    if (model_var.empty()) GTEST_SKIP() << why_;                                           \
  } while (0)

// Which backend `polychip serve` is started on.
enum class ServeBackend {
  kCpu,         // --device cpu:0
  kDiscovered,  // no --device: the server loads the best plugin it discovers
};

class ServeProcess {
 public:
  // Starts `polychip serve` on port 0 (the server prints the port it got) with `extra` flags.
  ServeProcess(const std::string& model, const std::vector<std::string>& extra,
               ServeBackend backend = ServeBackend::kCpu)
      : process_(ServeCommandLine(model, extra, backend)) {
    // The machine may be busy: allow a minute for the model to load.
    port_ = process_.WaitForListeningPort(60);
    if (port_ != 0) return;
    if (!process_.running()) {
      ADD_FAILURE() << "polychip serve exited at startup:\n" << Log();
    } else {
      ADD_FAILURE() << "polychip serve did not start:\n" << Log();
    }
  }

  bool ok() const { return port_ > 0; }
  int port() const { return port_; }
  pid_t pid() const { return process_.pid(); }

  std::string Log() const { return process_.Log(); }

  std::unique_ptr<httplib::Client> Client(std::string api_key = "") const {
    auto c = std::make_unique<httplib::Client>("127.0.0.1", port_);
    c->set_read_timeout(120, 0);
    c->set_connection_timeout(30, 0);
    if (!api_key.empty()) c->set_bearer_token_auth(api_key.c_str());
    return c;
  }

  // POSTs `body` (raw text) and returns the status and parsed JSON body (discarded if not JSON).
  std::pair<int, json> PostRaw(const std::string& path, const std::string& body,
                               const std::string& api_key = "") const {
    auto r = Client(api_key)->Post(path.c_str(), body, "application/json");
    if (!r) return {-1, json()};
    return {r->status, json::parse(r->body, nullptr, false)};
  }
  std::pair<int, json> Post(const std::string& path, const json& body,
                            const std::string& api_key = "") const {
    return PostRaw(path, body.dump(), api_key);
  }

  // The value of an unlabelled Prometheus metric, -1 when absent.
  // `key`: the --api-key the server was started with (every route but /health needs it).
  double Metric(const std::string& name, const std::string& key = "") const {
    httplib::Headers headers;
    if (!key.empty()) headers.emplace("Authorization", "Bearer " + key);
    auto r = Client()->Get("/metrics", headers);
    std::smatch m;
    std::regex re("(^|\n)" + name + " ([0-9.e+-]+)");
    if (!r || !std::regex_search(r->body, m, re)) return -1;
    return std::stod(m[2]);
  }

  // Waits up to `seconds` for `pred`; returns its last value.
  template <typename Pred>
  static bool WaitFor(Pred pred, double seconds) {
    const auto end = std::chrono::steady_clock::now() +
                     std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
    while (!pred()) {
      if (std::chrono::steady_clock::now() > end) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return true;
  }

  // Sends SIGTERM and returns the exit status (-1: it did not exit in time).
  int Terminate(double seconds = 30) {
    if (!process_.running()) return -1;
    process_.Signal(SIGTERM);
    return process_.Wait(seconds).value_or(-1);
  }

 private:
  static std::vector<std::string> ServeCommandLine(const std::string& model,
                                                   const std::vector<std::string>& extra,
                                                   ServeBackend backend) {
    std::vector<std::string> args = {PolychipBinary().string(), "serve", "--model-path", model,
                                      "--threads", "1", "--host", "127.0.0.1", "--port", "0"};
    if (backend == ServeBackend::kCpu) {
      args.insert(args.end(), {"--device", "cpu:0"});
    }
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }

  polychip::testing::ChildProcess process_;
  int port_ = 0;
};

using polychip::testing::SseEvents;

// A streaming POST; returns the status and the raw body.
inline std::pair<int, std::string> PostStream(const ServeProcess& s, const std::string& path,
                                              const json& body) {
  std::string raw;
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
    raw.append(data, len);
    return true;
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  if (!s.Client()->send(req, res, err)) return {-1, httplib::to_string(err)};
  return {res.status, raw.empty() ? res.body : raw};
}

// Whether node and the npm `packages` (in NpmDir()) are installed; a failure saying what is
// missing and how to install it when not.
inline bool HaveNodePackages(std::initializer_list<const char*> packages) {
  if (RunCommand("node --version >/dev/null 2>&1").exit_code != 0) {
    ADD_FAILURE() << "node is not installed";
    return false;
  }
  for (const char* package : packages) {
    if (!fs::exists(NpmDir() / "node_modules" / package / "package.json")) {
      ADD_FAILURE() << "the " << package << " npm package is not installed in " << NpmDir()
                    << ": run tests/setup/setup-test-deps.sh (or set POLYCHIP_NPM_DIR)";
      return false;
    }
  }
  return true;
}

// Runs the node script tests/server/<script> against the server `s` (its URL and `key` are the
// arguments), stdout and stderr together.
inline polychip::testing::CommandResult RunNodeClient(const std::string& script,
                                                      const ServeProcess& s,
                                                      const std::string& key) {
  const std::string cmd = "POLYCHIP_NPM_DIR=" + NpmDir().string() + " node " +
                          (fs::path(POLYCHIP_SOURCE_DIR) / "tests" / "server" / script).string() +
                          " http://127.0.0.1:" + std::to_string(s.port()) + " " + key;
  return RunCommand(cmd, polychip::testing::Stderr::kMerged);
}

}  // namespace polychip::server::testing
