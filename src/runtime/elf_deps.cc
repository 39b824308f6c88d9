// ldd-like dependency check without running the dynamic loader: read DT_NEEDED, DT_RPATH and
// DT_RUNPATH from the ELF dynamic section and look each needed library up the way ld.so does
// (RPATH unless RUNPATH, LD_LIBRARY_PATH, RUNPATH, ld.so.conf directories, default dirs).
// dlerror() names only the first missing library; this names all of them, transitively.
#include <elf.h>
#include <glob.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/plugin_loader.h"

namespace polychip::runtime {
namespace {

struct DynamicInfo {
  std::vector<std::string> needed;
  std::vector<std::string> rpath;
  std::vector<std::string> runpath;
  bool ok = false;
};

std::vector<std::string> SplitPath(const std::string& s, const std::string& origin) {
  std::vector<std::string> out;
  std::string item;
  std::istringstream in(s);
  while (std::getline(in, item, ':')) {
    if (item.empty()) continue;
    for (const char* tok : {"$ORIGIN", "${ORIGIN}"}) {
      size_t pos;
      while ((pos = item.find(tok)) != std::string::npos) item.replace(pos, strlen(tok), origin);
    }
    out.push_back(item);
  }
  return out;
}

std::string DirName(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

template <typename Ehdr, typename Shdr, typename Dyn>
bool ParseElf(const std::string& data, const std::string& origin, DynamicInfo* info) {
  if (data.size() < sizeof(Ehdr)) return false;
  Ehdr eh;
  std::memcpy(&eh, data.data(), sizeof(eh));
  if (eh.e_shoff == 0 || eh.e_shentsize != sizeof(Shdr) ||
      eh.e_shoff + uint64_t{eh.e_shnum} * sizeof(Shdr) > data.size()) {
    return false;
  }
  auto section = [&](size_t i) {
    Shdr sh;
    std::memcpy(&sh, data.data() + eh.e_shoff + i * sizeof(Shdr), sizeof(sh));
    return sh;
  };
  for (size_t i = 0; i < eh.e_shnum; ++i) {
    Shdr dyn = section(i);
    if (dyn.sh_type != SHT_DYNAMIC || dyn.sh_link >= eh.e_shnum) continue;
    Shdr str = section(dyn.sh_link);
    if (dyn.sh_offset + dyn.sh_size > data.size() || str.sh_offset + str.sh_size > data.size()) {
      return false;
    }
    auto string_at = [&](uint64_t off) -> std::string {
      if (off >= str.sh_size) return {};
      const char* p = data.data() + str.sh_offset + off;
      return std::string(p, strnlen(p, str.sh_size - off));
    };
    for (uint64_t off = 0; off + sizeof(Dyn) <= dyn.sh_size; off += sizeof(Dyn)) {
      Dyn d;
      std::memcpy(&d, data.data() + dyn.sh_offset + off, sizeof(d));
      if (d.d_tag == DT_NULL) break;
      if (d.d_tag == DT_NEEDED) info->needed.push_back(string_at(d.d_un.d_val));
      if (d.d_tag == DT_RPATH) info->rpath = SplitPath(string_at(d.d_un.d_val), origin);
      if (d.d_tag == DT_RUNPATH) info->runpath = SplitPath(string_at(d.d_un.d_val), origin);
    }
    info->ok = true;
    return true;
  }
  info->ok = true;  // a static file: no dynamic section, nothing needed
  return true;
}

DynamicInfo ReadDynamic(const std::string& path) {
  DynamicInfo info;
  std::ifstream in(path, std::ios::binary);
  if (!in) return info;
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string data = ss.str();
  if (data.size() < EI_NIDENT || std::memcmp(data.data(), ELFMAG, SELFMAG) != 0) return info;
  const std::string origin = DirName(path);
  if (data[EI_CLASS] == ELFCLASS64) {
    ParseElf<Elf64_Ehdr, Elf64_Shdr, Elf64_Dyn>(data, origin, &info);
  } else if (data[EI_CLASS] == ELFCLASS32) {
    ParseElf<Elf32_Ehdr, Elf32_Shdr, Elf32_Dyn>(data, origin, &info);
  }
  return info;
}

void ReadLdSoConf(const std::string& file, std::vector<std::string>* dirs, int depth) {
  if (depth > 4) return;
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    line = line.substr(0, line.find('#'));
    size_t b = line.find_first_not_of(" \t");
    if (b == std::string::npos) continue;
    line = line.substr(b, line.find_last_not_of(" \t\r") - b + 1);
    if (line.rfind("include", 0) == 0) {
      std::string pattern = line.substr(7);
      pattern = pattern.substr(pattern.find_first_not_of(" \t"));
      if (pattern[0] != '/') pattern = DirName(file) + "/" + pattern;
      glob_t g{};
      if (glob(pattern.c_str(), 0, nullptr, &g) == 0) {
        for (size_t i = 0; i < g.gl_pathc; ++i) ReadLdSoConf(g.gl_pathv[i], dirs, depth + 1);
      }
      globfree(&g);
    } else {
      dirs->push_back(line);
    }
  }
}

const std::vector<std::string>& SystemDirs() {
  static const std::vector<std::string> dirs = [] {
    std::vector<std::string> d;
    ReadLdSoConf("/etc/ld.so.conf", &d, 0);
    for (const char* s : {"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu",
                          "/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/lib64",
                          "/usr/lib64", "/lib", "/usr/lib"}) {
      d.push_back(s);
    }
    return d;
  }();
  return dirs;
}

// Returns the path where `soname` is found for an object with `info`, or "".
std::string Resolve(const std::string& soname, const DynamicInfo& info) {
  auto exists = [](const std::string& p) { return access(p.c_str(), R_OK) == 0; };
  if (soname.find('/') != std::string::npos) return exists(soname) ? soname : "";
  std::vector<std::string> dirs;
  if (info.runpath.empty()) dirs.insert(dirs.end(), info.rpath.begin(), info.rpath.end());
  if (const char* ld = std::getenv("LD_LIBRARY_PATH")) {
    for (auto& d : SplitPath(ld, ".")) dirs.push_back(d);
  }
  dirs.insert(dirs.end(), info.runpath.begin(), info.runpath.end());
  dirs.insert(dirs.end(), SystemDirs().begin(), SystemDirs().end());
  for (const auto& d : dirs) {
    std::string p = d + "/" + soname;
    if (exists(p)) return p;
  }
  return "";
}

}  // namespace

std::vector<std::string> NeededLibraries(const std::string& path) {
  return ReadDynamic(path).needed;
}

std::vector<std::string> MissingLibraries(const std::string& path) {
  std::vector<std::string> missing;
  std::set<std::string> visited;
  std::function<void(const std::string&, int)> walk = [&](const std::string& file, int depth) {
    if (depth > 16 || !visited.insert(file).second) return;
    DynamicInfo info = ReadDynamic(file);
    for (const auto& soname : info.needed) {
      std::string found = Resolve(soname, info);
      if (found.empty()) {
        if (std::find(missing.begin(), missing.end(), soname) == missing.end()) {
          missing.push_back(soname);
        }
      } else {
        walk(found, depth + 1);
      }
    }
  };
  walk(path, 0);
  return missing;
}

}  // namespace polychip::runtime
