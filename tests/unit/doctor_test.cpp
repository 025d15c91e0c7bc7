// SPDX-License-Identifier: Apache-2.0
// nccl-mesh-info --doctor: the checks of what loads and what is configured, each with a tree
// that passes and one that does not (doctor_fixture.h), bad files, and the report.
#include "doctor_fixture.h"

namespace mesh {
namespace {

TEST_F(DoctorTest, AHealthyTriangleMemberPassesEveryCheck) {
  std::vector<CheckResult> results = run();
  EXPECT_GE(results.size(), 15u);
  for (const CheckResult& r : results) EXPECT_VERDICT(r, Verdict::Ok);
  EXPECT_EQ(doctorExitStatus(worstVerdict(results)), 0);
}

// --- the plugin and the NCCLs ------------------------------------------------------------------

TEST_F(DoctorTest, PluginLoadIsOkWhenTheLibraryLoadsWithItsSymbols) {
  expectCheck("plugin-load", Verdict::Ok, "v8, v9, v10, v11, v12");
  EXPECT_EQ(pluginSpec_, "mesh");
}

TEST_F(DoctorTest, PluginLoadFailsWhenNcclCouldNotOpenIt) {
  pluginMask_ = -1;
  expectCheck("plugin-load", Verdict::Fail, "cannot open shared object");
}

TEST_F(DoctorTest, PluginLoadFailsOnALibraryWithoutTheAbiSymbols) {
  pluginMask_ = 0;
  EXPECT_VERDICT(check("plugin-load"), Verdict::Fail);
}

TEST_F(DoctorTest, PluginLoadProbesTheAbsolutePathNcclNetPluginNames) {
  src_.env["NCCL_NET_PLUGIN"] = "/opt/nccl-mesh/lib/libnccl-net-mesh.so";
  check("plugin-load");
  EXPECT_EQ(pluginSpec_, "/opt/nccl-mesh/lib/libnccl-net-mesh.so");
}

TEST_F(DoctorTest, PyTorchsNcclIsFoundBesideTorchAndItsAbiNamed) {
  CheckResult r = expectCheck("nccl-pytorch", Verdict::Ok);
  ASSERT_FALSE(probed_.empty());
  EXPECT_EQ(probed_[0], root_ + "/py/site-packages/nvidia/nccl/lib/libnccl.so.2");
  EXPECT_MENTIONS(r.found, "NCCL 2.28.9");
  EXPECT_MENTIONS(r.found, "takes ncclNet v11 (tries v11, v10, v9, v8, v7, v6)");
}

// PyTorch 2.15 (October 2026) may bundle NCCL 2.31 or 2.32, released after the newest NCCL
// source this build read (2.30.7-1): still Ok, and the check says the ABI order is assumed.
TEST_F(DoctorTest, PyTorchsNcclNewerThanTheLastReadSaysItsAbiOrderIsAssumed) {
  ncclCode_ = 23203;  // 2.32.3
  CheckResult r = expectCheck("nccl-pytorch", Verdict::Ok, "takes ncclNet v12 (tries v12, v11");
  EXPECT_MENTIONS(r.found, "NCCL 2.32 is newer than 2.30");
}

TEST_F(DoctorTest, PyTorchsNcclOlderThan2_20Fails) {
  ncclCode_ = 21903;  // 2.19.3
  expectCheck("nccl-pytorch", Verdict::Fail, "v7, v6, v5");
}

TEST_F(DoctorTest, PyTorchsNcclThatCrashesWhenLoadedIsAWarnNotTheDoctorsEnd) {
  ncclCode_ = 0;
  expectCheck("nccl-pytorch", Verdict::Warn, "signal 11");
}

TEST_F(DoctorTest, AnNcclWithoutAbsolutePluginPathsFailsWhenThePathIsUsed) {
  ncclCode_ = 22005;  // 2.20.5
  src_.env["NCCL_NET_PLUGIN"] = "/opt/nccl-mesh/lib/libnccl-net-mesh.so";
  expectCheck("nccl-pytorch", Verdict::Fail, "absolute NCCL_NET_PLUGIN path (2.21)");
  src_.env["NCCL_NET_PLUGIN"] = "mesh";
  src_.env["NCCL_MESH_RELAY"] = "auto";  // run-time connect then does not matter
  EXPECT_VERDICT(check("nccl-pytorch"), Verdict::Ok);
}

TEST_F(DoctorTest, NoPyTorchIsOk) {
  sysPath_ = {"/usr/lib/python3/dist-packages"};
  expectCheck("nccl-pytorch", Verdict::Ok, "no PyTorch");
}

TEST_F(DoctorTest, TorchsOwnLibDirectoryComesFirst) {
  put("py/site-packages/torch/lib/libnccl.so.2", "");
  LibProbe p = locateTorchNccl(root_, sysPath_);
  EXPECT_EQ(p.path, "/py/site-packages/torch/lib/libnccl.so.2");
}

TEST_F(DoctorTest, SystemNcclIsFoundThroughLdSoConfIncludes) {
  put("etc/ld.so.conf", "# comment\ninclude /etc/ld.so.conf.d/*.conf\n");
  put("etc/ld.so.conf.d/cuda.conf", "/usr/local/cuda/lib64\n");
  put("usr/local/cuda/lib64/libnccl.so.2", "");
  CheckResult r = check("nccl-system");
  EXPECT_MENTIONS(r.found, "/usr/local/cuda/lib64/libnccl.so.2");
  EXPECT_MENTIONS(r.found, "/etc/ld.so.conf.d/cuda.conf");
  EXPECT_VERDICT(r, Verdict::Ok);  // the same version as PyTorch's
}

TEST_F(DoctorTest, SystemNcclShadowedByPyTorchsOwnIsAWarn) {
  put("usr/lib/libnccl.so.2", "");
  src_.probeNccl = [this](const std::string& path) {
    LibProbe p;
    p.loaded = true;
    p.version = decodeNcclVersionCode(path.find("/usr/lib/") != std::string::npos ? 23007 : 22809);
    return p;
  };
  CheckResult r = expectCheck("nccl-system", Verdict::Warn, "PyTorch jobs load their own NCCL 2.28.9");
  EXPECT_MENTIONS(r.fix, "LD_PRELOAD=/usr/lib/libnccl.so.2");
}

// The warning above tells the user to LD_PRELOAD the system NCCL; once they did, it still
// warned that PyTorch loads its own, and a different NCCL in LD_PRELOAD (which beats both)
// was never looked at.
TEST_F(DoctorTest, AnNcclInLdPreloadIsTheOneEveryJobLoads) {
  put("usr/lib/libnccl.so.2", "");
  put("opt/nccl/lib/libnccl.so.2", "");
  src_.probeNccl = [this](const std::string& path) {
    LibProbe p;
    p.loaded = true;
    p.version = decodeNcclVersionCode(path.find("/usr/lib/") != std::string::npos ? 23007 : 22809);
    probed_.push_back(path);
    return p;
  };
  src_.env["LD_PRELOAD"] = "/usr/lib/libnccl.so.2";
  CheckResult r = expectCheck("nccl-system", Verdict::Ok, "/usr/lib/libnccl.so.2");
  EXPECT_MENTIONS(r.found, "LD_PRELOAD loads it before any other NCCL");
  src_.env["LD_PRELOAD"] = "libfoo.so /opt/nccl/lib/libnccl.so.2";
  r = check("nccl-system");
  EXPECT_MENTIONS(r.found, "/opt/nccl/lib/libnccl.so.2");
  EXPECT_MENTIONS(r.found, "2.28.9");
  EXPECT_MENTIONS(r.found, "LD_PRELOAD");
  src_.env["LD_PRELOAD"] = "libnccl.so.2";  // by name: the loader's search finds /usr/lib's
  r = expectCheck("nccl-system", Verdict::Ok, "/usr/lib/libnccl.so.2");
  EXPECT_MENTIONS(r.found, "LD_PRELOAD names it");
}

TEST_F(DoctorTest, AnNcclInLdLibraryPathIsTheOnePyTorchLoads) {
  put("home/u/nccl/build/lib/libnccl.so.2", "");
  src_.env["LD_LIBRARY_PATH"] = "/home/u/nccl/build/lib";  // NVIDIA's playbook's own NCCL build
  expectCheck("nccl-system", Verdict::Ok, "PyTorch jobs with this LD_LIBRARY_PATH load this one");
}

TEST_F(DoctorTest, LdLibraryPathComesBeforeTheLoadersConfiguration) {
  put("opt/nccl/lib/libnccl.so.2", "");
  put("usr/lib/libnccl.so.2", "");
  LibProbe p = locateSystemNccl(root_, {{"LD_LIBRARY_PATH", "/nowhere:/opt/nccl/lib"}});
  EXPECT_EQ(p.path, "/opt/nccl/lib/libnccl.so.2");
  EXPECT_NE(p.note.find("LD_LIBRARY_PATH"), std::string::npos);
}

// --- NCCL's settings and files -------------------------------------------------------------------

TEST_F(DoctorTest, NetPluginNoneFromEtcNcclConfFails) {
  src_.env.erase("NCCL_NET_PLUGIN");
  put("etc/nccl.conf", "# NVIDIA's playbook\nNCCL_NET_PLUGIN=none\n");
  expectCheck("net-plugin", Verdict::Fail, "NCCL_NET_PLUGIN=none (/etc/nccl.conf)");
}

TEST_F(DoctorTest, TheEnvironmentWinsOverNcclConf) {
  put("etc/nccl.conf", "NCCL_NET_PLUGIN=none\n");
  EXPECT_VERDICT(check("net-plugin"), Verdict::Ok);
}

TEST_F(DoctorTest, NcclConfFileReplacesTheHomeFileButNotEtc) {
  src_.env.erase("NCCL_NET_PLUGIN");
  put("home/u/.nccl.conf", "NCCL_NET_PLUGIN=mesh\n");
  EXPECT_VERDICT(check("net-plugin"), Verdict::Ok);
  put("job.conf", "NCCL_NET=IB\n");
  src_.env["NCCL_CONF_FILE"] = "/job.conf";
  src_.env.erase("NCCL_NET");
  EXPECT_VERDICT(check("net-plugin"), Verdict::Warn);  // ~/.nccl.conf is no longer read
  EXPECT_VERDICT(check("net-select"), Verdict::Fail);
}

TEST_F(DoctorTest, AnotherPluginFailsAndMeshSecondInAListWarns) {
  src_.env["NCCL_NET_PLUGIN"] = "aws-ofi";
  EXPECT_VERDICT(check("net-plugin"), Verdict::Fail);
  src_.env["NCCL_NET_PLUGIN"] = "aws-ofi,mesh";
  EXPECT_VERDICT(check("net-plugin"), Verdict::Warn);
  src_.env["NCCL_NET_PLUGIN"] = "";
  EXPECT_VERDICT(check("net-plugin"), Verdict::Warn);  // set but empty: unset
}

TEST_F(DoctorTest, NcclNetIbOrSocketFails) {
  for (const char* net : {"IB", "Socket"}) {
    src_.env["NCCL_NET"] = net;
    EXPECT_VERDICT(check("net-select"), Verdict::Fail);
  }
  src_.env.erase("NCCL_NET");
  EXPECT_VERDICT(check("net-select"), Verdict::Ok);
}

TEST_F(DoctorTest, NcclIbHcaWithNcclNetMeshWarnsAndNamesTheMeshSetting) {
  src_.env["NCCL_IB_HCA"] = "rocep1s0f1,roceP2p1s0f1";
  CheckResult r = expectCheck("ib-settings", Verdict::Warn);
  EXPECT_MENTIONS(r.fix, "NCCL_IB_HCA -> NCCL_MESH_HCA");
  src_.env.erase("NCCL_NET");  // then they only tune NCCL's own IB transport
  EXPECT_VERDICT(check("ib-settings"), Verdict::Ok);
}

// Each NCCL IB setting a nccl-mesh setting stands in for (its doc names it) is answered with
// that setting, NCCL_IB_PCI_RELAXED_ORDERING included (the check's own list once lacked it).
TEST_F(DoctorTest, EveryNcclIbSettingWithAMeshCounterpartIsAnsweredWithIt) {
  const std::map<std::string, std::string> expected = {
      {"NCCL_IB_HCA", "NCCL_MESH_HCA"},
      {"NCCL_IB_GID_INDEX", "NCCL_MESH_GID_INDEX"},
      {"NCCL_IB_TIMEOUT", "NCCL_MESH_IB_TIMEOUT"},
      {"NCCL_IB_RETRY_CNT", "NCCL_MESH_IB_RETRY_CNT"},
      {"NCCL_IB_TC", "NCCL_MESH_IB_TC"},
      {"NCCL_IB_FIFO_TC", "NCCL_MESH_IB_FIFO_TC"},
      {"NCCL_IB_SL", "NCCL_MESH_IB_SL"},
      {"NCCL_IB_ECE_ENABLE", "NCCL_MESH_IB_ECE_ENABLE"},
      {"NCCL_IB_QPS_PER_CONNECTION", "NCCL_MESH_QPS_PER_CONN"},
      {"NCCL_IB_PCI_RELAXED_ORDERING", "NCCL_MESH_PCI_RELAXED_ORDERING"}};
  EXPECT_EQ(ibSettingEquivalents(), expected);
  for (const auto& [ib, mesh] : expected) src_.env[ib] = "1";
  src_.env["NCCL_IB_SPLIT_DATA_ON_QPS"] = "1";  // no counterpart: named as set, no suggestion
  CheckResult r = expectCheck("ib-settings", Verdict::Warn, "NCCL_IB_SPLIT_DATA_ON_QPS");
  for (const auto& [ib, mesh] : expected) EXPECT_MENTIONS(r.fix, ib + " -> " + mesh);
  EXPECT_EQ(r.fix.find("NCCL_IB_SPLIT_DATA_ON_QPS ->"), std::string::npos) << r.fix;
}

TEST_F(DoctorTest, MalformedNcclConfLinesAreNamedByFileAndLine) {
  put("etc/nccl.conf", "NCCL_DEBUG=INFO\njust words\nNCCL_NET = Mesh\n");
  CheckResult r = expectCheck("nccl-conf", Verdict::Warn, "/etc/nccl.conf: line 2");
  EXPECT_MENTIONS(r.found, "line 3");
}

TEST_F(DoctorTest, AnUnreadableNcclConfIsAWarnNamingIt) {
  mkdir("etc/nccl.conf");  // a directory: opens, does not read (root can read any file)
  CheckResult r = expectCheck("nccl-conf", Verdict::Warn);
  EXPECT_MENTIONS(r.found, root_ + "/etc/nccl.conf");
}

TEST_F(DoctorTest, AMissingNcclConfFileIsAWarn) {
  src_.env["NCCL_CONF_FILE"] = "/nope.conf";
  EXPECT_VERDICT(check("nccl-conf"), Verdict::Warn);
}

TEST_F(DoctorTest, InvalidMeshSettingsWarnWithTheirValues) {
  put("etc/nccl.conf", "NCCL_MESH_RELAY=sometimes\n");
  expectCheck("mesh-settings", Verdict::Warn, "NCCL_MESH_RELAY='sometimes'");
}

// --- memory -----------------------------------------------------------------------------------

TEST_F(DoctorTest, AContainersDefaultMemlockFails) {
  put("proc/self/limits", "Max locked memory         65536                65536                bytes\n");
  CheckResult r = expectCheck("memlock", Verdict::Fail, "64 KiB");
  EXPECT_MENTIONS(r.fix, "--ulimit memlock=-1");
}

TEST_F(DoctorTest, ALargeFiniteMemlockWarnsAndCapIpcLockPasses) {
  put("proc/self/limits", "Max locked memory         8589934592           8589934592           bytes\n");
  EXPECT_VERDICT(check("memlock"), Verdict::Warn);
  put("proc/self/status", "CapEff:\t0000000000004000\n");
  EXPECT_VERDICT(check("memlock"), Verdict::Ok);
}

TEST_F(DoctorTest, MalformedLimitsFileIsAWarnNamingIt) {
  put("proc/self/limits", "garbage");
  CheckResult r = expectCheck("memlock", Verdict::Warn);
  EXPECT_MENTIONS(r.found, root_ + "/proc/self/limits");
}

TEST_F(DoctorTest, CmaFreeAboveCmaTotalFailsAndNamesKhoOff) {
  put("proc/meminfo", "CmaTotal:              0 kB\nCmaFree:          940604 kB\n");
  CheckResult r = expectCheck("cma", Verdict::Fail);
  EXPECT_MENTIONS(r.fix, "kho=off");
  put("proc/meminfo", "CmaTotal:              0 kB\nCmaFree:               0 kB\n");
  EXPECT_VERDICT(check("cma"), Verdict::Ok);  // kho=off's result
}

TEST_F(DoctorTest, MissingMeminfoIsAWarnAndNoCmaLinesIsOk) {
  remove("proc/meminfo");
  CheckResult r = expectCheck("cma", Verdict::Warn);
  EXPECT_MENTIONS(r.found, root_ + "/proc/meminfo");
  put("proc/meminfo", "MemTotal: 1000 kB\n");
  EXPECT_VERDICT(check("cma"), Verdict::Ok);
}

TEST_F(DoctorTest, RdmaCoreThatDoesNotLoadFails) {
  verbsError_ = "cannot load libibverbs.so.1: not found";
  EXPECT_VERDICT(check("rdma-core"), Verdict::Fail);
}

// --- the report ---------------------------------------------------------------------------------

TEST_F(DoctorTest, TextHasOneLinePerCheckAndTheWorstVerdictSetsTheExitStatus) {
  src_.env["NCCL_NET"] = "IB";
  std::vector<CheckResult> results = run();
  std::string text = doctorText(results, "header");
  size_t lines = 0;
  for (char c : text) lines += c == '\n';
  EXPECT_EQ(lines, results.size() + 2);  // header, one per check, the verdict
  EXPECT_MENTIONS(text, "FAIL  net-select");
  EXPECT_MENTIONS(text, "verdict: FAIL");
  EXPECT_EQ(doctorExitStatus(worstVerdict(results)), 2);
  std::string json = doctorJson(results, "v", root_);
  EXPECT_MENTIONS(json, "\"exit_status\": 2");
  EXPECT_MENTIONS(json, "{\"name\": \"net-select\", \"verdict\": \"FAIL\"");
}

TEST_F(DoctorTest, WritesNothingInTheTree) {
  std::string list = root_ + ".list";
  std::string snapshot = "find " + root_ + " -printf '%p %s %T@\\n' | sort";
  ASSERT_EQ(system((snapshot + " > " + list).c_str()), 0);
  run();
  int same = system((snapshot + " | cmp -s - " + list).c_str());
  unlink(list.c_str());
  EXPECT_EQ(same, 0);
}

// --- pure helpers -------------------------------------------------------------------------------

TEST(DoctorHelpers, ConfParsingFollowsNccl) {
  ConfFile f;
  parseConfText("# c\n\nA=1\nB==2\nC\n", &f);
  ASSERT_EQ(f.entries.size(), 2u);
  EXPECT_EQ(f.entries[0], std::make_pair(std::string("A"), std::string("1")));
  EXPECT_EQ(f.entries[1], std::make_pair(std::string("B"), std::string("=2")));
  ASSERT_EQ(f.problems.size(), 1u);
  EXPECT_NE(f.problems[0].find("line 5"), std::string::npos);
}

// A file saved with Windows line endings: NCCL 2.30.3+ drops the '\r', earlier NCCL (2.28,
// what most containers ship) keeps it, so "NCCL_NET_PLUGIN=mesh\r" loads no plugin. The
// doctor said OK; it now names the first such line, once.
TEST(DoctorHelpers, ConfLinesWithCarriageReturnsAreNamed) {
  ConfFile f;
  parseConfText("# a comment\r\nNCCL_NET_PLUGIN=mesh\r\nNCCL_NET=Mesh\r\n", &f);
  ASSERT_EQ(f.entries.size(), 2u);
  EXPECT_EQ(f.entries[0].second, "mesh");
  ASSERT_EQ(f.problems.size(), 1u);
  EXPECT_NE(f.problems[0].find("line 2 ends in a carriage return"), std::string::npos) << f.problems[0];
  EXPECT_NE(f.problems[0].find("NCCL before 2.30.3 keeps it"), std::string::npos) << f.problems[0];
}

TEST(DoctorHelpers, PluginNamesAsNcclOpensThem) {
  EXPECT_EQ(pluginOpenNames("mesh"), (std::vector<std::string>{"mesh", "libnccl-net-mesh.so"}));
  EXPECT_EQ(pluginOpenNames("/opt/x/libnccl-net-mesh.so"), (std::vector<std::string>{"/opt/x/libnccl-net-mesh.so"}));
  EXPECT_EQ(pluginOpenNames("libnccl-net-mesh.so"), (std::vector<std::string>{"libnccl-net-mesh.so"}));
  EXPECT_TRUE(namesMeshPlugin("mesh"));
  EXPECT_TRUE(namesMeshPlugin("/opt/nccl-mesh/lib/libnccl-net-mesh.so"));
  EXPECT_FALSE(namesMeshPlugin("aws-ofi"));
}

TEST(DoctorHelpers, RoceMtuFollowsTheNetdevMtu) {
  EXPECT_EQ(roceMtuForNetdev(9000), 4096);
  EXPECT_EQ(roceMtuForNetdev(4200), 4096);
  EXPECT_EQ(roceMtuForNetdev(1500), 1024);
  EXPECT_EQ(roceMtuForNetdev(300), 0);
}

TEST(DoctorHelpers, ChildProbesReportFailuresInsteadOfDying) {
  LibProbe missing = probeNcclInChild("/nonexistent/libnccl.so.2", 5000);
  EXPECT_FALSE(missing.loaded);
  EXPECT_MENTIONS(missing.error, "dlopen");
  LibProbe notNccl = probeNcclInChild("libm.so.6", 5000);
  EXPECT_FALSE(notNccl.loaded);
  EXPECT_MENTIONS(notNccl.error, "no ncclGetVersion");
  LibProbe plugin = probePluginInChild("libm.so.6", 5000);
  EXPECT_TRUE(plugin.loaded);
  EXPECT_EQ(plugin.abiMask, 0);
}

// The GPUs' side of GPUDirect (issue 32): a GB10 is OK with the reason, never a FAIL; GPUs that
// would allow GPUDirect RDMA without peermem and without DMA-BUF are a WARN; no driver is OK.
TEST_F(DoctorTest, GpuDirectFollowsWhatTheGpusSay) {
  GpuCaps gb10;
  gb10.state = GpuCaps::State::Known;
  gb10.gpus = {{"NVIDIA GB10", false, false, true}};
  src_.gpus = [&](const Config&) { return gb10; };
  CheckResult r = expectCheck("gpudirect", Verdict::Ok, "NVIDIA GB10: GPUDirect RDMA no, DMA-BUF no");
  EXPECT_MENTIONS(r.found, "nvidia-peermem is neither needed nor able to load");
  GpuCaps a100 = gb10;
  a100.gpus = {{"A100", true, false, false}};
  src_.gpus = [&](const Config&) { return a100; };
  r = expectCheck("gpudirect", Verdict::Warn, "no nvidia-peermem module is loaded");
  EXPECT_MENTIONS(r.fix, "modprobe nvidia-peermem");
  put("sys/module/nvidia_peermem/version", "1.0");
  expectCheck("gpudirect", Verdict::Ok, "nvidia-peermem loaded");
  src_.gpus = [](const Config&) {
    GpuCaps none;
    none.why = "cannot load libcuda.so.1";
    return none;
  };
  expectCheck("gpudirect", Verdict::Ok, "unknown (cannot load libcuda.so.1)");
}

TEST(DoctorHelpers, GpuProbeRunsTheDriverInAChild) {
  setenv("MESH_FAKE_CUDA_GPUS", "NVIDIA GB10:gdr=0:dmabuf=0:integrated=1,H100:gdr=1:dmabuf=1", 1);
  GpuCaps c = probeGpusInChild(MESH_CUDA_STANDIN, 5000);
  unsetenv("MESH_FAKE_CUDA_GPUS");
  ASSERT_TRUE(c.known()) << c.why;
  ASSERT_EQ(c.gpus.size(), 2u);
  EXPECT_EQ(c.gpus[0].name, "NVIDIA GB10");
  EXPECT_TRUE(c.gpus[0].integrated);
  EXPECT_TRUE(c.gpus[1].gdr && c.gpus[1].dmabuf);
  GpuCaps missing = probeGpusInChild("/nonexistent/libcuda.so.1", 5000);
  EXPECT_FALSE(missing.known());
  EXPECT_MENTIONS(missing.why, "cannot load /nonexistent/libcuda.so.1");
}

}  // namespace
}  // namespace mesh
