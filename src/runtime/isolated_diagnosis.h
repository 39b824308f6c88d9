// `doctor`'s look at a plugin file from a child process (issue 16): a plugin whose constructor,
// probe or get_api crashes or never returns must not take the diagnosis down with it. The child
// runs DiagnosePlugin and sends the report back; the parent turns a death by signal
// into "crashed in <stage>: SIGSEGV" and a child still running after the timeout (killed) into
// "<stage> did not return in N s", where <stage> is the step the child had reached (dlopen,
// probe or get_api).
#pragma once

#include <string>
#include <vector>

#include "runtime/plugin_loader.h"

namespace polychip::runtime {

// Seconds a plugin's inspection may take: POLYCHIP_PROBE_TIMEOUT_S, default 5.
double ProbeTimeoutSeconds();

LoadReport DiagnosePluginInChild(const std::string& path, PluginKind kind, double timeout_s);

// DiagnosePluginInChild for each file, the children running at once (one deadline for all).
std::vector<LoadReport> DiagnosePluginsInChildren(const std::vector<PluginFile>& files,
                                                  double timeout_s);

}  // namespace polychip::runtime
