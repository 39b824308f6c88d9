// Several hosts through the polychip binary, on emu devices with the tiny trained model:
// `--nnodes 2 --node-rank R --dist-init-addr HOST:PORT`, tp 2 inside each host over shm and pp
// across them over gloo, gives the single rank's greedy tokens; bootstrap failures name the
// node that never came or say that the token was wrong; killing one host's ranks ends the
// other's within seconds naming rank, pid and host.
//
// Two kinds of "host": processes on this machine told apart by POLYCHIP_HOST_ID (no privileges
// needed), and — as root — real separate network stacks: node 0 in this namespace, node 1 in a
// network namespace joined by a veth pair, each with its own hostname (UTS namespace) and a
// private /tmp (mount namespace), so nothing but TCP connects them.
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/command.h"

namespace {

using polychip::testing::ChildProcess;
using polychip::testing::CommandResult;
using polychip::testing::RunCommand;
using Clock = std::chrono::steady_clock;

const std::string kModel = std::string(POLYCHIP_SOURCE_DIR) + "/models/polychip-tiny.gguf";
const std::string kGloo =
    std::string(POLYCHIP_BUILD_DIR) + "/lib/polychip/libpolychip_comm_gloo.so";
const std::string kPrompt = "And God said, Let there be light";

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

std::vector<int> Tokens(const std::string& err) {
  std::vector<int> ids;
  std::istringstream in(err);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("token ", 0) == 0) ids.push_back(std::atoi(line.c_str() + 6));
  }
  return ids;
}

std::vector<std::string> RunArgs(int n) {
  return {POLYCHIP_BINARY,   "run",           "-m", kModel, "-p", kPrompt, "-n",
          std::to_string(n), "--print-tokens"};
}

// The flags of node `rank` of a 2-node tp 2 x pp 2 job.
std::vector<std::string> NodeFlags(int rank, const std::string& addr, const std::string& token) {
  return {"--tp-size",        "2",  "--pp-size",    "2",
          "--nnodes",         "2",  "--node-rank",  std::to_string(rank),
          "--dist-init-addr", addr, "--dist-token", token,
          "--dist-timeout",   "30", "--device",     rank == 0 ? "emu:0,1" : "emu:2,3"};
}

std::vector<std::string> Concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// The full path of a program on PATH (ChildProcess executes a path, not a name).
std::string Which(const std::string& name) {
  const CommandResult r = RunCommand("command -v " + name);
  std::string path = r.out.substr(0, r.out.find('\n'));
  return path.empty() ? name : path;
}

std::vector<std::string> WithHostId(const std::string& id, std::vector<std::string> argv) {
  argv.insert(argv.begin(), {Which("env"), "POLYCHIP_HOST_ID=" + id});
  return argv;
}

std::string Shell(const std::vector<std::string>& argv) {
  std::string s;
  for (const std::string& a : argv) s += polychip::testing::ShellQuote(a) + " ";
  return s;
}

// Waits for a ChildProcess, failing the test if it does not end in time.
int Finish(ChildProcess& p, double seconds, const char* what) {
  const std::optional<int> code = p.Wait(seconds);
  if (!code) {
    ADD_FAILURE() << what << " still running after " << seconds << " s\n" << p.Log();
    return -1;
  }
  return *code;
}

bool HaveGloo() { return access(kGloo.c_str(), R_OK) == 0; }

TEST(MultiNode, TwoNodesGiveTheSingleRankTokensWithShmInsideAndGlooAcross) {
  if (!HaveGloo()) GTEST_SKIP() << "gloo comm plugin not built (libgloo-dev missing)";
  const CommandResult one = RunCommand("timeout 120 " + Shell(RunArgs(16)) + "--device emu:0");
  ASSERT_EQ(one.exit_code, 0) << one.err;
  const std::string addr = "127.0.0.1:" + std::to_string(FreePort());
  ChildProcess node1(WithHostId("hostB", Concat(RunArgs(16), NodeFlags(1, addr, "t0k"))),
                     {.stdout_to_log = true, .alarm_seconds = 120});
  const CommandResult node0 = RunCommand(
      "timeout 120 " + Shell(WithHostId("hostA", Concat(RunArgs(16), NodeFlags(0, addr, "t0k")))));
  EXPECT_EQ(Finish(node1, 30, "node 1"), 0) << node1.Log();
  ASSERT_EQ(node0.exit_code, 0) << node0.err << "\nnode 1:\n" << node1.Log();
  EXPECT_EQ(Tokens(node0.err).size(), 16u);
  EXPECT_EQ(Tokens(node0.err), Tokens(one.err));
  EXPECT_EQ(node0.out, one.out);
  // Only node 0 prints results.
  EXPECT_TRUE(Tokens(node1.Log()).empty()) << node1.Log();
  // The per-group choice, logged by rank 0.
  for (const char* line :
       {"dist: tp group 0 (ranks 0,1 on host hostA): comm 'shm', default: every rank on host hostA",
        "dist: tp group 1 (ranks 2,3 on host hostB): comm 'shm', default: every rank on host hostB",
        "dist: pp group 0 (ranks 0,2 on hosts hostA, hostB): comm 'gloo', default: ranks on 2 "
        "hosts, launched with --nnodes",
        "dist: world (ranks 0,1,2,3 on hosts hostA, hostB): comm 'gloo'"}) {
    EXPECT_NE(node0.err.find(line), std::string::npos) << line << "\n" << node0.err;
  }
}

double Ppl(const std::string& text) {
  const size_t at = text.find("PPL = ");
  return at == std::string::npos ? -1 : std::atof(text.c_str() + at + 6);
}

TEST(MultiNode, TwoNodesGiveTheSingleRankPerplexity) {
  if (!HaveGloo()) GTEST_SKIP() << "gloo comm plugin not built (libgloo-dev missing)";
  const std::vector<std::string> ppl = {
      POLYCHIP_BINARY,
      "perplexity",
      "-m",
      kModel,
      "-f",
      std::string(POLYCHIP_SOURCE_DIR) + "/models/polychip-tiny.heldout.txt",
      "-c",
      "128",
      "--chunks",
      "2"};
  const CommandResult one = RunCommand("timeout 120 " + Shell(ppl) + "--device emu:0");
  const std::string addr = "127.0.0.1:" + std::to_string(FreePort());
  ChildProcess node1(WithHostId("hostB", Concat(ppl, NodeFlags(1, addr, "p"))),
                     {.stdout_to_log = true, .alarm_seconds = 120});
  const CommandResult node0 =
      RunCommand("timeout 120 " + Shell(WithHostId("hostA", Concat(ppl, NodeFlags(0, addr, "p")))));
  EXPECT_EQ(Finish(node1, 30, "node 1"), 0) << node1.Log();
  ASSERT_EQ(one.exit_code, 0) << one.err;
  ASSERT_EQ(node0.exit_code, 0) << node0.err;
  const double p1 = Ppl(one.out + one.err), p2 = Ppl(node0.out + node0.err);
  ASSERT_GT(p1, 1.0) << one.out << one.err;
  EXPECT_NEAR(p2, p1, p1 * 1e-3);
}

// Pins win over the topology and say so; a group across hosts pinned to shm gets a warning
// (these "hosts" share one machine, so shm still works here).
TEST(MultiNode, PinnedGroupsAreLoggedAndShmAcrossHostsWarns) {
  if (!HaveGloo()) GTEST_SKIP() << "gloo comm plugin not built (libgloo-dev missing)";
  const std::string addr = "127.0.0.1:" + std::to_string(FreePort());
  const std::vector<std::string> pins = {"--comm-pp", "shm", "--comm-tp", "gloo"};
  ChildProcess node1(WithHostId("hostB", Concat(Concat(RunArgs(4), NodeFlags(1, addr, "p")), pins)),
                     {.stdout_to_log = true, .alarm_seconds = 120});
  const CommandResult node0 = RunCommand(
      "timeout 120 " +
      Shell(WithHostId("hostA", Concat(Concat(RunArgs(4), NodeFlags(0, addr, "p")), pins))));
  EXPECT_EQ(Finish(node1, 30, "node 1"), 0) << node1.Log();
  ASSERT_EQ(node0.exit_code, 0) << node0.err;
  EXPECT_EQ(Tokens(node0.err).size(), 4u);
  for (const char* line :
       {"dist: tp group 0 (ranks 0,1 on host hostA): comm 'gloo', pinned by --comm-tp",
        "dist: pp group 0 (ranks 0,2 on hosts hostA, hostB): comm 'shm', pinned by --comm-pp",
        "dist: pp group of ranks 0,2 spans 2 hosts but its comm 'shm' (pinned by --comm-pp) "
        "reaches only the ranks of one host"}) {
    EXPECT_NE(node0.err.find(line), std::string::npos) << line << "\n" << node0.err;
  }
}

// The mpirun form: two "hosts" (POLYCHIP_HOST_ID) of two ranks each, TCP only between MPI's
// processes; the store's address travels over MPI, tp stays on shm, pp and the world take mpi.
TEST(MultiNode, MpirunTwoHostsOverTcp) {
  const std::string mpi = std::string(POLYCHIP_BUILD_DIR) + "/lib/polychip/libpolychip_comm_mpi.so";
  if (access(mpi.c_str(), R_OK) != 0) GTEST_SKIP() << "mpi comm plugin not built (no MPI)";
  if (std::system("command -v mpirun >/dev/null 2>&1") != 0) GTEST_SKIP() << "no mpirun";
  const std::string run = Shell(RunArgs(16)) + "--tp-size 2 --pp-size 2 --device emu:0,1,2,3";
  const CommandResult one = RunCommand("timeout 120 " + Shell(RunArgs(16)) + "--device emu:0");
  const CommandResult r = RunCommand(
      "timeout 120 mpirun --allow-run-as-root --oversubscribe --mca btl tcp,self -np 2 env "
      "POLYCHIP_HOST_ID=hostA " +
      run + " : -np 2 env POLYCHIP_HOST_ID=hostB " + run);
  ASSERT_EQ(one.exit_code, 0) << one.err;
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(Tokens(r.err), Tokens(one.err));
  EXPECT_EQ(r.out, one.out);
  for (const char* line :
       {"dist: tp group 1 (ranks 2,3 on host hostB): comm 'shm', default: every rank on host hostB",
        "dist: pp group 0 (ranks 0,2 on hosts hostA, hostB): comm 'mpi', default: ranks on 2 "
        "hosts, launched by mpirun"}) {
    EXPECT_NE(r.err.find(line), std::string::npos) << line << "\n" << r.err;
  }
}

TEST(MultiNode, ANodeThatNeverComesIsNamed) {
  const std::string addr = "127.0.0.1:" + std::to_string(FreePort());
  std::vector<std::string> flags = NodeFlags(0, addr, "x");
  flags[flags.size() - 3] = "2";  // --dist-timeout 2
  const CommandResult r = RunCommand("timeout 60 " + Shell(Concat(RunArgs(2), flags)));
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("node 0: node(s) 1 of 2 never arrived at the store at " + addr +
                       " within 2000 ms"),
            std::string::npos)
      << r.err;
  EXPECT_LT(r.seconds, 20);
}

TEST(MultiNode, AStrangerWithAnotherTokenIsRefused) {
  const std::string addr = "127.0.0.1:" + std::to_string(FreePort());
  std::vector<std::string> flags0 = NodeFlags(0, addr, "right");
  flags0[flags0.size() - 3] = "4";
  ChildProcess node0(Concat(RunArgs(2), flags0), {.stdout_to_log = true, .alarm_seconds = 60});
  const CommandResult stranger =
      RunCommand("timeout 60 " + Shell(Concat(RunArgs(2), NodeFlags(1, addr, "wrong"))));
  EXPECT_EQ(stranger.exit_code, 1) << stranger.err;
  EXPECT_NE(stranger.err.find("refused us: wrong token"), std::string::npos) << stranger.err;
  EXPECT_EQ(Finish(node0, 30, "node 0"), 1);
  EXPECT_NE(node0.Log().find("node(s) 1 of 2 never arrived"), std::string::npos) << node0.Log();
}

// ---- two hosts as namespaces (root) -------------------------------------------------------

// Node 1's host: a network namespace joined to this one by a veth pair (10.77.x.1 here,
// 10.77.x.2 there). Torn down by the destructor.
class NetnsHost {
 public:
  NetnsHost() {
    const int x = getpid() % 200 + 20;
    name_ = "pcnode1-" + std::to_string(getpid());
    here_ = "vpc" + std::to_string(getpid()) + "a";
    there_ = "vpc" + std::to_string(getpid()) + "b";
    ip_here_ = "10.77." + std::to_string(x) + ".1";
    ip_there_ = "10.77." + std::to_string(x) + ".2";
    const std::string script = "set -e; ip netns add " + name_ + "; ip link add " + here_ +
                               " type veth peer name " + there_ + "; ip link set " + there_ +
                               " netns " + name_ + "; ip addr add " + ip_here_ + "/24 dev " +
                               here_ + "; ip link set " + here_ + " up; ip -n " + name_ +
                               " addr add " + ip_there_ + "/24 dev " + there_ + "; ip -n " + name_ +
                               " link set " + there_ + " up; ip -n " + name_ + " link set lo up";
    ok_ = std::system(("(" + script + ") >/dev/null 2>&1").c_str()) == 0;
  }
  ~NetnsHost() {
    std::system(
        ("ip link del " + here_ + " >/dev/null 2>&1; ip netns del " + name_ + " >/dev/null 2>&1")
            .c_str());
  }
  bool ok() const { return ok_; }
  const std::string& ip_here() const { return ip_here_; }
  // argv run as host `hostname`: (in the namespace when `remote`), own hostname, private /tmp.
  std::vector<std::string> As(const std::string& hostname, bool remote,
                              const std::vector<std::string>& argv) const {
    std::vector<std::string> out;
    if (remote) out = {Which("ip"), "netns", "exec", name_};
    const std::string inner =
        "hostname " + hostname + " && mount -t tmpfs tmpfs /tmp && exec " + Shell(argv);
    out.insert(out.end(),
               {Which("unshare"), "-m", "-u", "--propagation", "private", "sh", "-c", inner});
    return out;
  }

 private:
  std::string name_, here_, there_, ip_here_, ip_there_;
  bool ok_ = false;
};

std::string NamespaceSkipReason() {
  if (geteuid() != 0) return "needs root (network and mount namespaces)";
  if (std::system("command -v ip >/dev/null 2>&1 && command -v unshare >/dev/null 2>&1") != 0) {
    return "needs ip (iproute2) and unshare";
  }
  if (!HaveGloo()) return "gloo comm plugin not built (libgloo-dev missing)";
  if (std::system("unshare -m -u sh -c 'mount -t tmpfs tmpfs /tmp' >/dev/null 2>&1") != 0) {
    return "cannot make mount and UTS namespaces here (unshare -m -u)";
  }
  return "";
}

std::string Complete(int port, int max_tokens = 24) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(60, 0);
  const nlohmann::json body = {{"prompt", "In the beginning"},
                               {"max_tokens", max_tokens},
                               {"temperature", 0},
                               {"ignore_eos", true}};
  auto r = c.Post("/v1/completions", body.dump(), "application/json");
  if (!r || r->status != 200) return "";
  return nlohmann::json::parse(r->body)["choices"][0]["text"];
}

std::vector<std::string> ServeArgs() {
  return {POLYCHIP_BINARY, "serve", "-m", kModel, "--port", "0", "--max-total-tokens", "4096"};
}

TEST(TwoHosts, NnodesServeAnswersAsOneRankAndAKilledHostEndsTheOther) {
  if (const std::string why = NamespaceSkipReason(); !why.empty()) GTEST_SKIP() << why;
  NetnsHost net;
  if (!net.ok()) GTEST_SKIP() << "cannot create a network namespace with a veth pair here";

  // The single rank's answer.
  std::string one;
  {
    ChildProcess serve(Concat(ServeArgs(), {"--device", "emu:0"}),
                       {.stdout_to_log = false, .alarm_seconds = 120});
    const int port = serve.WaitForListeningPort(60);
    ASSERT_NE(port, 0) << serve.Log();
    one = Complete(port);
    serve.Signal(SIGTERM);
    serve.Wait(10);
  }
  ASSERT_FALSE(one.empty());

  const std::string addr = net.ip_here() + ":" + std::to_string(FreePort());
  ChildProcess node1(net.As("hostB", true, Concat(ServeArgs(), NodeFlags(1, addr, "s3cret"))),
                     {.stdout_to_log = true, .alarm_seconds = 120});
  ChildProcess node0(net.As("hostA", false, Concat(ServeArgs(), NodeFlags(0, addr, "s3cret"))),
                     {.stdout_to_log = true, .alarm_seconds = 120});
  const int port = node0.WaitForListeningPort(60);
  ASSERT_NE(port, 0) << node0.Log() << "\nnode 1:\n" << node1.Log();
  EXPECT_EQ(Complete(port), one) << node0.Log();
  const std::string log0 = node0.Log();
  EXPECT_NE(log0.find("dist: tp group 0 (ranks 0,1 on host hostA): comm 'shm'"), std::string::npos)
      << log0;
  EXPECT_NE(log0.find("dist: pp group 1 (ranks 1,3 on hosts hostA, hostB): comm 'gloo', default: "
                      "ranks on 2 hosts, launched with --nnodes"),
            std::string::npos)
      << log0;
  // Node 1 serves nothing.
  EXPECT_EQ(node1.Log().find("listening on"), std::string::npos) << node1.Log();
  // /get_server_info shows each group's comm and why.
  {
    httplib::Client c("127.0.0.1", port);
    auto info = c.Get("/get_server_info");
    ASSERT_TRUE(info && info->status == 200);
    const nlohmann::json j = nlohmann::json::parse(info->body);
    EXPECT_EQ(j.value("nnodes", 0), 2) << info->body;
    ASSERT_TRUE(j.contains("comm_groups")) << info->body;
    EXPECT_NE(j["comm_groups"].dump().find("pp group 0 (ranks 0,2 on hosts hostA, hostB): comm "
                                           "'gloo'"),
              std::string::npos)
        << info->body;
  }

  // Kill host B's ranks in the middle of a request: host A's end within seconds, naming one.
  // A long request (about a second of decoding), so that the kill lands inside it.
  std::thread request([&] { Complete(port, 200); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  node1.Signal(SIGKILL);  // its leader; the leader's own rank dies with it (PDEATHSIG)
  const auto killed = Clock::now();
  const std::optional<int> code = node0.Wait(15);
  const double seconds = std::chrono::duration<double>(Clock::now() - killed).count();
  request.join();
  ASSERT_TRUE(code.has_value()) << "node 0 still running 15 s after host B was killed\n"
                                << node0.Log();
  EXPECT_LT(seconds, 10);
  EXPECT_NE(*code, 0);
  EXPECT_TRUE(
      std::regex_search(node0.Log(), std::regex("rank [23] \\(pid [0-9]+\\) died on host hostB")))
      << node0.Log();
  if (std::getenv("POLYCHIP_TEST_SHOW_LOGS") != nullptr) {
    std::fprintf(stderr, "node 0:\n%s\nnode 1:\n%s\n", node0.Log().c_str(), node1.Log().c_str());
  }
}

}  // namespace
