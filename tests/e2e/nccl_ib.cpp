// SPDX-License-Identifier: Apache-2.0
#include "nccl_ib.h"

#include <dirent.h>
#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "e2e_util.h"
#include "net_v11.h"

namespace e2e {
namespace {

constexpr const char* kTableSymbol = "ncclNetIb";

// st_value and st_size of a symbol in the file's .symtab; false when the file has no
// .symtab (stripped) or no such symbol.
bool findLocalSymbol(const std::string& path, const char* name, uint64_t* value, uint64_t* size, std::string* why) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    *why = format("open(%s): %s", path.c_str(), strerror(errno));
    return false;
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || st.st_size < static_cast<off_t>(sizeof(Elf64_Ehdr))) {
    close(fd);
    *why = path + ": not an ELF file";
    return false;
  }
  size_t len = static_cast<size_t>(st.st_size);
  void* map = mmap(nullptr, len, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (map == MAP_FAILED) {
    *why = format("mmap(%s): %s", path.c_str(), strerror(errno));
    return false;
  }
  const char* base = static_cast<const char*>(map);
  const auto* eh = reinterpret_cast<const Elf64_Ehdr*>(base);
  bool found = false, symtab = false;
  auto inside = [&](uint64_t off, uint64_t n) { return off <= len && n <= len - off; };
  if (memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0 || eh->e_ident[EI_CLASS] != ELFCLASS64 ||
      !inside(eh->e_shoff, static_cast<uint64_t>(eh->e_shnum) * sizeof(Elf64_Shdr))) {
    *why = path + ": not a 64-bit ELF file";
  } else {
    const auto* sh = reinterpret_cast<const Elf64_Shdr*>(base + eh->e_shoff);
    for (int i = 0; i < eh->e_shnum && !found; ++i) {
      if (sh[i].sh_type != SHT_SYMTAB || sh[i].sh_link >= eh->e_shnum) continue;
      const Elf64_Shdr& strs = sh[sh[i].sh_link];
      if (!inside(sh[i].sh_offset, sh[i].sh_size) || !inside(strs.sh_offset, strs.sh_size)) continue;
      symtab = true;
      const auto* syms = reinterpret_cast<const Elf64_Sym*>(base + sh[i].sh_offset);
      size_t n = sh[i].sh_size / sizeof(Elf64_Sym);
      size_t nameLen = strlen(name);
      for (size_t k = 0; k < n; ++k) {
        uint64_t at = syms[k].st_name;
        if (at + nameLen + 1 > strs.sh_size) continue;
        if (memcmp(base + strs.sh_offset + at, name, nameLen + 1) != 0) continue;
        *value = syms[k].st_value;
        *size = syms[k].st_size;
        found = true;
        break;
      }
    }
    if (!found) {
      *why = symtab ? format("%s has no symbol %s (not NCCL 2.19 or later?)", path.c_str(), name)
                    : format("%s has no symbol table (stripped): NCCL's IB transport cannot be found in it", path.c_str());
    }
  }
  munmap(map, len);
  return found;
}

bool writeFile(const std::string& path, const std::string& text) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  bool ok = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  return close(fd) == 0 && ok;
}

void mkdirOrFail(const std::string& path) {
  if (mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) fail("fake sysfs: mkdir %s: %s", path.c_str(), strerror(errno));
}

}  // namespace

bool parseNcclIbPlugin(const std::string& plugin, std::string* lib) {
  if (plugin == "nccl-ib") {
    lib->clear();
    return true;
  }
  if (plugin.rfind("nccl-ib:", 0) == 0) {
    *lib = plugin.substr(8);
    return true;
  }
  return false;
}

NcclIb openNcclIb(const std::string& libName) {
  NcclIb ib;
  std::string name = libName.empty() ? "libnccl.so.2" : libName;
  dlerror();
  ib.lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (ib.lib == nullptr) {
    const char* ld = getenv("LD_LIBRARY_PATH");
    fail("nccl-ib: dlopen(\"%s\") failed: %s (LD_LIBRARY_PATH=%s)", name.c_str(), dlerror(), ld ? ld : "<unset>");
  }
  link_map* lm = nullptr;
  if (dlinfo(ib.lib, RTLD_DI_LINKMAP, &lm) != 0 || lm == nullptr || lm->l_name == nullptr || !*lm->l_name) {
    fail("nccl-ib: no file name for the loaded %s", name.c_str());
  }
  ib.path = lm->l_name;
  uint64_t value = 0, size = 0;
  std::string why;
  if (!findLocalSymbol(ib.path, kTableSymbol, &value, &size, &why)) fail("nccl-ib: %s", why.c_str());
  if (size != sizeof(ncclNet_v11_t)) {
    fail("nccl-ib: %s in %s is %llu bytes, an ncclNet_v11_t is %zu: this NCCL's internal net table is another "
         "version (the reference supports NCCL 2.28's)", kTableSymbol, ib.path.c_str(),
         static_cast<unsigned long long>(size), sizeof(ncclNet_v11_t));
  }
  ib.table = reinterpret_cast<const void*>(lm->l_addr + value);
  const auto* net = static_cast<const ncclNet_v11_t*>(ib.table);
  if (net->name == nullptr || strcmp(net->name, "IB") != 0 || net->init == nullptr) {
    fail("nccl-ib: %s in %s is not NCCL's IB transport (name '%s')", kTableSymbol, ib.path.c_str(),
         net->name ? net->name : "(null)");
  }
  using GetVersion = int (*)(int*);
  auto getVersion = reinterpret_cast<GetVersion>(dlsym(ib.lib, "ncclGetVersion"));
  if (getVersion == nullptr || getVersion(&ib.version) != 0) ib.version = 0;
  setenv("NCCL_IB_GID_INDEX", "1", 0);
  return ib;
}

std::vector<std::string> verbsDeviceNames() {
  void* lib = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);  // kept: NCCL opens it again
  if (lib == nullptr) fail("nccl-ib: dlopen(\"libibverbs.so.1\") failed: %s", dlerror());
  using GetList = void** (*)(int*);
  using GetName = const char* (*)(void*);
  using FreeList = void (*)(void**);
  auto getList = reinterpret_cast<GetList>(dlsym(lib, "ibv_get_device_list"));
  auto getName = reinterpret_cast<GetName>(dlsym(lib, "ibv_get_device_name"));
  auto freeList = reinterpret_cast<FreeList>(dlsym(lib, "ibv_free_device_list"));
  if (getList == nullptr || getName == nullptr || freeList == nullptr) fail("nccl-ib: libibverbs.so.1 lacks the device list calls");
  int n = 0;
  void** list = getList(&n);
  std::vector<std::string> names;
  for (int i = 0; list != nullptr && i < n; ++i) names.emplace_back(getName(list[i]));
  if (list != nullptr) freeList(list);
  return names;
}

void fakeIbSysfs(const std::vector<std::string>& devices) {
  // What /sys/class lists now (symlinks into /sys/devices, which stays visible): each entry
  // is recreated on the tmpfs below, so only `infiniband` differs.
  std::vector<std::pair<std::string, std::string>> links;  // "class/entry", target
  std::vector<std::string> classes;
  if (DIR* top = opendir("/sys/class")) {
    while (dirent* c = readdir(top)) {
      std::string cls = c->d_name;
      if (cls == "." || cls == ".." || cls == "infiniband") continue;
      classes.push_back(cls);
      DIR* d = opendir(("/sys/class/" + cls).c_str());
      if (d == nullptr) continue;
      while (dirent* e = readdir(d)) {
        std::string rel = cls + "/" + e->d_name;
        char target[4096];
        ssize_t n = readlink(("/sys/class/" + rel).c_str(), target, sizeof(target) - 1);
        if (n <= 0) continue;  // "." / "..", and the few plain files (net/bonding_masters)
        target[n] = '\0';
        links.emplace_back(rel, target);
      }
      closedir(d);
    }
    closedir(top);
  }
  if (unshare(CLONE_NEWNS) != 0) fail("nccl-ib: unshare(CLONE_NEWNS): %s (needs root)", strerror(errno));
  if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
    fail("nccl-ib: making / private in the new mount namespace: %s", strerror(errno));
  }
  if (mount("tmpfs", "/sys/class", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755") != 0) {
    fail("nccl-ib: tmpfs on /sys/class: %s", strerror(errno));
  }
  for (const std::string& cls : classes) mkdirOrFail("/sys/class/" + cls);
  for (const auto& l : links) {
    std::string at = "/sys/class/" + l.first;
    if (symlink(l.second.c_str(), at.c_str()) != 0) fail("fake sysfs: symlink %s: %s", at.c_str(), strerror(errno));
  }
  mkdirOrFail("/sys/class/infiniband");
  mkdirOrFail("/sys/class/.mesh-e2e-pci");
  for (size_t i = 0; i < devices.size(); ++i) {
    // One PCI bus per device, so NCCL never takes two of them for ports of one NIC.
    std::string pci = format("0000:%02zx:00.0", i + 1);
    std::string dev = "/sys/class/infiniband/" + devices[i];
    mkdirOrFail("/sys/class/.mesh-e2e-pci/" + pci);
    mkdirOrFail(dev);
    if (symlink(("../../.mesh-e2e-pci/" + pci).c_str(), (dev + "/device").c_str()) != 0) {
      fail("fake sysfs: symlink %s/device: %s", dev.c_str(), strerror(errno));
    }
    std::string types = dev;
    for (const char* part : {"/ports", "/1", "/gid_attrs", "/types"}) {
      types += part;
      mkdirOrFail(types);
    }
    for (int g = 0; g < 2; ++g) {
      if (!writeFile(types + "/" + std::to_string(g), "RoCE v2\n")) fail("fake sysfs: writing %s", types.c_str());
    }
  }
  for (const std::string& dev : devices) {
    char real[4096];
    std::string link = "/sys/class/infiniband/" + dev + "/device";
    if (realpath(link.c_str(), real) == nullptr) fail("fake sysfs: %s does not resolve: %s", link.c_str(), strerror(errno));
  }
}

}  // namespace e2e
