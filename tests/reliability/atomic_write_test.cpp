// No partial output: write_file_atomic interrupted (SIGKILL mid-write, a failing write) leaves the old file intact
// and nothing that could be mistaken for the output; it refuses targets that are not regular files (device, FIFO,
// directory), replaces the file behind a symlink, keeps modes; read_text_file refuses devices, FIFOs and oversized
// files; and no lcplan source writes a file any other way.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>

#include "common/json_file.h"
#include "common/user_error.h"

namespace fs = std::filesystem;
using lcplan::read_json_file;
using lcplan::read_text_file;
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
  for (const auto& e : fs::directory_iterator(s.dir)) {
    if (e.path() != target) {
      EXPECT_NE(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
    }
  }
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

// Runs `body` in a child process without root's power to ignore permissions (CI runs as root): as root the child
// becomes nobody (65534) first. Returns the child's exit code, or -1 when it could not drop privileges.
template <typename F>
int without_root(F body) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (::geteuid() == 0 && (::setgroups(0, nullptr) != 0 || ::setgid(65534) != 0 || ::setuid(65534) != 0)) std::_Exit(99);
    std::_Exit(body());
  }
  int st = 0;
  ::waitpid(pid, &st, 0);
  if (!WIFEXITED(st) || WEXITSTATUS(st) == 99) return -1;
  return WEXITSTATUS(st);
}

// 0: UserError naming `path`; 1: it names something else; 2: another exception; 3: no error at all.
template <typename F>
int user_error_code(F f, const std::string& path) {
  try {
    f();
  } catch (const UserError& e) {
    return std::string(e.what()).find(path) != std::string::npos ? 0 : 1;
  } catch (...) {
    return 2;
  }
  return 3;
}

TEST(AtomicWrite, ReadOnlyDirectoryKeepsTheOldFile) {
  Scratch s;
  const fs::path target = s.dir / "r.json";
  write_file_atomic(target.string(), kOld);
  // Owned by whoever the writer runs as, without write permission: only the mode stops it.
  if (::geteuid() == 0) {
    ASSERT_EQ(::chown(s.dir.c_str(), 65534, 65534), 0);
  }
  fs::permissions(s.dir, fs::perms::owner_read | fs::perms::owner_exec | fs::perms::group_read |
                             fs::perms::group_exec | fs::perms::others_read | fs::perms::others_exec);
  const int code = without_root([&] { return user_error_code([&] { write_file_atomic(target.string(), "new"); }, target.string()); });
  fs::permissions(s.dir, fs::perms::owner_all);
  ASSERT_NE(code, -1) << "could not drop root privileges to test permissions";
  EXPECT_EQ(code, 0) << "1: message does not name the path, 2: not a UserError, 3: no error at all";
  EXPECT_EQ(slurp(target), kOld);
  EXPECT_EQ(std::distance(fs::directory_iterator(s.dir), fs::directory_iterator()), 1) << "a temporary file was left";
}

// The message of the UserError `f` throws ("" when it throws none, "other exception" for anything else).
template <typename F>
std::string user_error_of(F f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  } catch (...) {
    return "other exception";
  }
  return "";
}

// The refusal of a non-regular target: a one-sentence UserError naming the path, the node untouched, no temporary.
void expect_refused(const fs::path& target, const std::string& kind) {
  struct stat before {};
  ASSERT_EQ(::stat(target.c_str(), &before), 0);
  const std::string err = user_error_of([&] { write_file_atomic(target.string(), "x\n"); });
  EXPECT_NE(err.find(target.string()), std::string::npos) << "message does not name the path: " << err;
  EXPECT_NE(err.find(kind), std::string::npos) << "message does not say it is " << kind << ": " << err;
  EXPECT_NE(err.find("not a regular file"), std::string::npos) << err;
  struct stat after {};
  ASSERT_EQ(::stat(target.c_str(), &after), 0);
  EXPECT_EQ(after.st_mode & S_IFMT, before.st_mode & S_IFMT) << target << " was replaced by another kind of file";
  EXPECT_EQ(after.st_ino, before.st_ino) << target << " was replaced";
  for (const auto& e : fs::directory_iterator(target.parent_path()))
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << "left " << e.path();
}

TEST(AtomicWrite, FifoTargetIsRefusedWithoutBlocking) {
  Scratch s;
  const fs::path fifo = s.dir / "pipe.json";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  expect_refused(fifo, "FIFO");
}

TEST(AtomicWrite, DeviceTargetIsRefused) {
  // A device node of our own (root may create one) first: a broken writer then only damages the scratch folder.
  Scratch s;
  const fs::path dev = s.dir / "full";
  if (::mknod(dev.c_str(), S_IFCHR | 0666, makedev(1, 7)) == 0) expect_refused(dev, "device");
  // Then the real /dev/full (the audit's case: as root it used to be replaced by a regular file).
  struct stat st {};
  if (::stat("/dev/full", &st) != 0 || !S_ISCHR(st.st_mode)) GTEST_SKIP() << "no /dev/full on this machine";
  const std::string err = user_error_of([] { write_file_atomic("/dev/full", "x\n"); });
  struct stat after {};
  const bool intact = ::stat("/dev/full", &after) == 0 && S_ISCHR(after.st_mode);
  if (!intact && ::geteuid() == 0) {  // put the device back for the rest of the machine before failing
    ::unlink("/dev/full");
    ::mknod("/dev/full", S_IFCHR | 0666, makedev(1, 7));
    ::chmod("/dev/full", 0666);  // mknod applied the umask
  }
  EXPECT_TRUE(intact) << "/dev/full was replaced by a regular file";
  EXPECT_NE(err.find("/dev/full"), std::string::npos) << err;
  EXPECT_NE(err.find("device"), std::string::npos) << err;
}

TEST(AtomicWrite, SymlinkTargetReplacesTheFileAndKeepsTheLink) {
  Scratch s;
  fs::create_directories(s.dir / "real");
  const fs::path file = s.dir / "real" / "recipe.json", link = s.dir / "recipe.json";
  write_file_atomic(file.string(), kOld);
  fs::create_symlink(fs::path("real") / "recipe.json", link);  // relative, as users usually make them
  write_file_atomic(link.string(), "new\n");
  ASSERT_TRUE(fs::is_symlink(link)) << "the link was replaced by a regular file";
  EXPECT_EQ(fs::read_symlink(link), fs::path("real") / "recipe.json");
  EXPECT_EQ(slurp(file), "new\n");
  EXPECT_EQ(visible_files(s.dir / "real"), std::vector<std::string>{"recipe.json"});

  // A dangling link: the file it names is created, the link kept.
  const fs::path dangling = s.dir / "later.json";
  fs::create_symlink(fs::path("real") / "later.json", dangling);
  write_file_atomic(dangling.string(), "later\n");
  ASSERT_TRUE(fs::is_symlink(dangling));
  EXPECT_EQ(slurp(s.dir / "real" / "later.json"), "later\n");

  // A loop is an error, not a hang.
  fs::create_symlink("loop_b", s.dir / "loop_a");
  fs::create_symlink("loop_a", s.dir / "loop_b");
  EXPECT_NE(user_error_of([&] { write_file_atomic((s.dir / "loop_a").string(), "x"); }), "");
}

TEST(AtomicWrite, KeepsThePrivateModeOfTheOldFile) {
  Scratch s;
  const fs::path target = s.dir / "secret.json";
  write_file_atomic(target.string(), kOld);
  ASSERT_EQ(::chmod(target.c_str(), 0600), 0);
  write_file_atomic(target.string(), "new\n");
  struct stat st {};
  ASSERT_EQ(::stat(target.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u) << std::oct << (st.st_mode & 07777);
  EXPECT_EQ(slurp(target), "new\n");
}

TEST(AtomicWrite, NewFileModeFollowsTheUmask) {
  Scratch s;
  const mode_t old = ::umask(027);
  write_file_atomic((s.dir / "a.json").string(), "a\n");
  ::umask(022);
  write_file_atomic((s.dir / "b.json").string(), "b\n");
  ::umask(old);
  struct stat a {}, b {};
  ASSERT_EQ(::stat((s.dir / "a.json").c_str(), &a), 0);
  ASSERT_EQ(::stat((s.dir / "b.json").c_str(), &b), 0);
  EXPECT_EQ(a.st_mode & 0777, 0640u) << std::oct << (a.st_mode & 0777);
  EXPECT_EQ(b.st_mode & 0777, 0644u) << std::oct << (b.st_mode & 0777);
}

TEST(AtomicWrite, EmptyPathIsAUserError) {
  const std::string err = user_error_of([] { write_file_atomic("", "x"); });
  EXPECT_NE(err.find("empty"), std::string::npos) << err;
}

// Concurrent writers each use their own temporary (exclusive creation): the result is one writer's complete content.
TEST(AtomicWrite, ConcurrentWritersNeverMixContents) {
  Scratch s;
  const fs::path target = s.dir / "shared.json";
  std::vector<pid_t> kids;
  for (char c : {'a', 'b', 'c', 'd'}) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      try {
        for (int i = 0; i < 20; ++i) write_file_atomic(target.string(), std::string(1 << 20, c));
      } catch (...) {
        std::_Exit(1);
      }
      std::_Exit(0);
    }
    kids.push_back(pid);
  }
  for (pid_t k : kids) {
    int st = 0;
    ::waitpid(k, &st, 0);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "a writer failed";
  }
  const std::string got = slurp(target);
  ASSERT_EQ(got.size(), size_t(1) << 20);
  EXPECT_EQ(got, std::string(got.size(), got[0])) << "the file mixes two writers' contents";
  EXPECT_EQ(std::distance(fs::directory_iterator(s.dir), fs::directory_iterator()), 1) << "a temporary file was left";
}

// ---- reading -------------------------------------------------------------------------------------------------------

TEST(ReadInput, RefusesDevicesFifosDirectoriesAndOversizedFiles) {
  Scratch s;
  auto refused = [](const std::string& path, const std::string& words) {
    const std::string err = user_error_of([&] { read_json_file(path, "plan file"); });
    EXPECT_NE(err.find("plan file \"" + path + "\""), std::string::npos) << path << ": " << err;
    EXPECT_NE(err.find(words), std::string::npos) << path << ": " << err;
  };
  if (fs::exists("/dev/zero")) refused("/dev/zero", "device");
  if (fs::exists("/dev/urandom")) refused("/dev/urandom", "device");
  const fs::path fifo = s.dir / "pipe.json";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  refused(fifo.string(), "FIFO");  // without a writer: returning at all shows it did not block in open()
  refused(s.dir.string(), "directory");
  refused((s.dir / "missing.json").string(), "does not exist");
  // One byte over the limit (sparse, so it costs no disk) is refused; exactly at the limit is read.
  const fs::path big = s.dir / "big.json";
  {
    std::ofstream(big).put(' ');
  }
  fs::resize_file(big, lcplan::kMaxInputFileBytes + 1);
  refused(big.string(), "MiB limit");
  fs::resize_file(big, lcplan::kMaxInputFileBytes);
  EXPECT_EQ(read_text_file(big.string(), "plan file").size(), size_t(lcplan::kMaxInputFileBytes));
  refused((s.dir / "pipe.json" / "x").string(), "does not exist");
}

TEST(ReadInput, ReadsThroughASymlinkAndReportsInvalidJson) {
  Scratch s;
  write_file_atomic((s.dir / "a.json").string(), "{\"k\": 1}");
  fs::create_symlink("a.json", s.dir / "link.json");
  EXPECT_EQ(read_json_file((s.dir / "link.json").string(), "plan file")["k"], 1);
  write_file_atomic((s.dir / "bad.json").string(), "{ nope");
  EXPECT_NE(user_error_of([&] { read_json_file((s.dir / "bad.json").string(), "plan file"); }).find("not valid JSON"),
            std::string::npos);
}

TEST(ReadInput, UnreadableFileIsAUserError) {
  Scratch s;
  const fs::path f = s.dir / "secret.json";
  write_file_atomic(f.string(), "{}");
  ASSERT_EQ(::chmod(f.c_str(), 0), 0);
  fs::permissions(s.dir, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec | fs::perms::others_read |
                             fs::perms::others_exec);
  const int code = without_root([&] {
    const std::string err = user_error_of([&] { read_json_file(f.string(), "plan file"); });
    return err.find(f.string()) != std::string::npos && err.find("no permission") != std::string::npos ? 0 : 1;
  });
  ASSERT_NE(code, -1) << "could not drop root privileges to test permissions";
  EXPECT_EQ(code, 0) << "an unreadable file did not give a UserError naming it and the missing permission";
}

// ---- no other writer -------------------------------------------------------------------------------------------

// A line of source that opens, creates, copies or renames a file. Preprocessor lines and // comments are ignored.
bool writes_a_file(std::string line) {
  static const std::regex writer(
      R"(ofstream|\bw?fstream\b|basic_fstream|\b(f|fd|fre)open\s*\(|\bcreat\s*\(|\bO_(WRONLY|RDWR|CREAT|TRUNC|APPEND)\b|)"
      R"(\bcopy_file\b|\b(fs|filesystem)::copy\s*\(|\brename(at2?)?\s*\(|\bmks?temp|\bresize_file\b|\btruncate\s*\()");
  const size_t comment = line.find("//");
  if (comment != std::string::npos) line.resize(comment);
  const size_t first = line.find_first_not_of(" \t");
  if (first != std::string::npos && line[first] == '#') return false;
  return std::regex_search(line, writer);
}

// The scan must be able to fail: these are writers it has to catch, and look-alikes it must let through.
TEST(AtomicWrite, WriterPatternCatchesWritersOnly) {
  for (const char* w : {"std::ofstream out(path);", "ofstream out(path);", "std::fstream f(p, std::ios::out);",
                        "FILE* f = fopen(p.c_str(), \"w\");", "std::fopen(name, \"a\")", "fs::rename(tmp, target);",
                        "std::rename(a, b);", "::rename(a.c_str(), b.c_str())", "int fd = open(p, O_WRONLY);",
                        "open(p, O_CREAT | O_EXCL, 0600)", "fs::copy_file(a, b);", "std::filesystem::copy(a, b);",
                        "mkstemp(buf);", "freopen(p, \"w\", stdout);", "fs::resize_file(p, 0);"})
    EXPECT_TRUE(writes_a_file(w)) << "not caught: " << w;
  for (const char* ok : {"std::ifstream in(path);", "#include <fstream>", "// writes through std::ofstream elsewhere",
                         "read_json_file(path, \"plan\");", "const auto renamed = names;",
                         "std::copy(a.begin(), a.end(), out);"})
    EXPECT_FALSE(writes_a_file(ok)) << "false alarm: " << ok;
}

// Every file lcplan writes must go through write_file_atomic: no other source may open a file for writing.
// Tests, benchmarks, kernels and the fuzz harnesses may write freely (scratch files, reports).
TEST(AtomicWrite, NoOtherWriterInTheSources) {
  const fs::path root = LCPLAN_SOURCE_DIR;
  std::vector<std::string> offenders;
  for (const char* area : {"cli", "common", "models", "parallel", "estimator", "calibrate", "search", "report",
                           "executor", "profiler", "python"}) {
    if (!fs::is_directory(root / area)) continue;
    for (const auto& e : fs::recursive_directory_iterator(root / area)) {
      const auto ext = e.path().extension();
      if (ext != ".cpp" && ext != ".h" && ext != ".cu" && ext != ".cuh" && ext != ".hpp") continue;
      if (e.path() == root / "common" / "json_file.cpp") continue;  // the one atomic writer
      std::ifstream in(e.path());
      std::string line;
      for (int n = 1; std::getline(in, line); ++n)
        if (writes_a_file(line)) offenders.push_back(e.path().string() + ":" + std::to_string(n) + ": " + line);
    }
  }
  std::string all;
  for (const auto& o : offenders) all += o + "\n";
  EXPECT_TRUE(offenders.empty()) << "files opened for writing outside write_file_atomic:\n" << all;
}

}  // namespace
