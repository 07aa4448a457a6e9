// No partial output: write_file_atomic interrupted (SIGKILL mid-write, a failing stream) leaves the old file intact
// and nothing that could be mistaken for the output; and no lcplan source writes a file any other way.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>

#include "models/json_file.h"
#include "models/user_error.h"

namespace fs = std::filesystem;
using lcplan::UserError;
using lcplan::write_file_atomic;

namespace {

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Scratch {
  fs::path dir;
  Scratch() {
    dir = fs::temp_directory_path() / ("lcplan_atomic_test." + std::to_string(::getpid()) + "." +
                                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~Scratch() { fs::remove_all(dir); }
};

const std::string kOld = "{\"old\": \"complete recipe\"}\n";

// Files in `dir` a user or a tool could take for `target`: the target itself or anything not hidden.
std::vector<std::string> visible_files(const fs::path& dir) {
  std::vector<std::string> v;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().front() != '.') v.push_back(e.path().filename().string());
  return v;
}

TEST(AtomicWrite, ReplacesTheFileAndLeavesNoTemporary) {
  Scratch s;
  const fs::path target = s.dir / "recipe.json";
  write_file_atomic(target.string(), kOld);
  write_file_atomic(target.string(), "new\n");
  EXPECT_EQ(slurp(target), "new\n");
  EXPECT_EQ(std::distance(fs::directory_iterator(s.dir), fs::directory_iterator()), 1) << "a temporary file was left";
}

TEST(AtomicWrite, SigkillMidWriteKeepsTheOldFile) {
  Scratch s;
  const fs::path target = s.dir / "recipe.json";
  write_file_atomic(target.string(), kOld);
  const pid_t child = ::fork();
  if (child == 0) {
    // Large enough that the write takes a while; the parent kills us once the temporary file is growing.
    const std::string big(512u << 20, 'x');
    try {
      write_file_atomic(target.string(), big);
    } catch (...) {
    }
    std::_Exit(0);
  }
  ASSERT_GT(child, 0);
  // Wait until the child's temporary file exists and holds some bytes, then kill it mid-write.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  bool seen = false;
  while (!seen && std::chrono::steady_clock::now() < deadline) {
    for (const auto& e : fs::directory_iterator(s.dir)) {
      std::error_code ec;
      if (e.path() != target && fs::file_size(e.path(), ec) > 0 && !ec) seen = true;
    }
    if (!seen) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  ::kill(child, SIGKILL);
  int st = 0;
  ::waitpid(child, &st, 0);
  ASSERT_TRUE(seen) << "the child never started writing its temporary file";
  ASSERT_TRUE(WIFSIGNALED(st)) << "the child finished the 512 MB write before it could be killed";
  EXPECT_EQ(slurp(target), kOld) << "the old file was damaged by an interrupted write";
  // A leftover temporary may remain (SIGKILL allows no cleanup) but it is hidden and named as a temporary.
  EXPECT_EQ(visible_files(s.dir), std::vector<std::string>{"recipe.json"});
  for (const auto& e : fs::directory_iterator(s.dir))
    if (e.path() != target) EXPECT_NE(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
}

TEST(AtomicWrite, FailingStreamKeepsTheOldFileAndRemovesTheTemporary) {
  Scratch s;
  const fs::path target = s.dir / "calib.json";
  write_file_atomic(target.string(), kOld);
  const pid_t child = ::fork();
  if (child == 0) {
    // A file-size limit makes the stream fail part-way (EFBIG), as a full disk would.
    ::signal(SIGXFSZ, SIG_IGN);
    rlimit lim{4096, 4096};
    ::setrlimit(RLIMIT_FSIZE, &lim);
    try {
      write_file_atomic(target.string(), std::string(1 << 20, 'y'));
    } catch (const UserError& e) {
      std::_Exit(std::string(e.what()).find(target.string()) != std::string::npos ? 10 : 11);
    } catch (...) {
      std::_Exit(12);
    }
    std::_Exit(13);
  }
  int st = 0;
  ::waitpid(child, &st, 0);
  ASSERT_TRUE(WIFEXITED(st)) << "the writer crashed instead of reporting the failure";
  EXPECT_EQ(WEXITSTATUS(st), 10) << "11: message does not name the path, 12: not a UserError, 13: no error at all";
  EXPECT_EQ(slurp(target), kOld);
  EXPECT_EQ(std::distance(fs::directory_iterator(s.dir), fs::directory_iterator()), 1) << "a temporary file was left";
}

TEST(AtomicWrite, MissingDirectoryAndDirectoryTargetAreUserErrors) {
  Scratch s;
  EXPECT_THROW(write_file_atomic((s.dir / "missing" / "x.json").string(), "x"), UserError);
  EXPECT_FALSE(fs::exists(s.dir / "missing"));
  fs::create_directories(s.dir / "d");
  EXPECT_THROW(write_file_atomic((s.dir / "d").string(), "x"), UserError);
  EXPECT_TRUE(fs::is_directory(s.dir / "d"));
  EXPECT_EQ(std::distance(fs::directory_iterator(s.dir / "d"), fs::directory_iterator()), 0);
}

TEST(AtomicWrite, ReadOnlyDirectoryKeepsTheOldFile) {
  if (::geteuid() == 0) GTEST_SKIP() << "root ignores directory permissions";
  Scratch s;
  const fs::path target = s.dir / "r.json";
  write_file_atomic(target.string(), kOld);
  fs::permissions(s.dir, fs::perms::owner_read | fs::perms::owner_exec);
  EXPECT_THROW(write_file_atomic(target.string(), "new"), UserError);
  fs::permissions(s.dir, fs::perms::owner_all);
  EXPECT_EQ(slurp(target), kOld);
}

// Every file lcplan writes must go through write_file_atomic: no other source may open a file for writing.
TEST(AtomicWrite, NoOtherWriterInTheSources) {
  const fs::path root = LCPLAN_SOURCE_DIR;
  const std::regex writer(R"(std::ofstream|std::fstream|\bfopen\s*\(|\bcreat\s*\(|O_WRONLY|O_RDWR|fs::copy_file)");
  std::vector<std::string> offenders;
  for (const char* area : {"cli", "search", "estimator", "models", "executor", "profiler"}) {
    if (!fs::is_directory(root / area)) continue;
    for (const auto& e : fs::recursive_directory_iterator(root / area)) {
      const auto ext = e.path().extension();
      if (ext != ".cpp" && ext != ".h" && ext != ".cu") continue;
      if (e.path() == root / "models" / "json_file.cpp") continue;  // the one atomic writer
      std::ifstream in(e.path());
      std::string line;
      for (int n = 1; std::getline(in, line); ++n)
        if (std::regex_search(line, writer)) offenders.push_back(e.path().string() + ":" + std::to_string(n) + ": " + line);
    }
  }
  std::string all;
  for (const auto& o : offenders) all += o + "\n";
  EXPECT_TRUE(offenders.empty()) << "files opened for writing outside write_file_atomic:\n" << all;
}

}  // namespace
