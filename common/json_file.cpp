#include "common/json_file.h"

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/user_error.h"

namespace lcplan {

namespace fs = std::filesystem;

namespace {

// strerror text in lower case, so it reads as the tail of our sentence.
std::string reason(int err) {
  std::string s = std::strerror(err);
  if (!s.empty()) s[0] = char(std::tolower(static_cast<unsigned char>(s[0])));
  return s;
}

// What a non-regular file is, for the sentence refusing it.
std::string kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// Closes the descriptor on every way out of a scope.
struct Fd {
  int fd = -1;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

std::string random_suffix() {
  unsigned long long r = 0;
  if (::getrandom(&r, sizeof r, GRND_NONBLOCK) != ssize_t(sizeof r))  // O_EXCL still guarantees a fresh file
    r = (static_cast<unsigned long long>(::getpid()) << 32) ^
        static_cast<unsigned long long>(std::chrono::steady_clock::now().time_since_epoch().count());
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", r);
  return buf;
}

// The file a chain of symbolic links ends at (possibly not existing yet): replacing it keeps the links valid.
fs::path follow_links(const fs::path& path, const std::string& name) {
  fs::path p = path;
  for (int hop = 0; hop < 40; ++hop) {
    struct stat ls {};
    if (::lstat(p.c_str(), &ls) != 0 || !S_ISLNK(ls.st_mode)) return p;
    std::error_code ec;
    const fs::path to = fs::read_symlink(p, ec);
    if (ec) throw UserError(name + " is a symbolic link that cannot be read (" + reason(ec.value()) + ")");
    p = to.is_absolute() ? to : p.parent_path() / to;
  }
  throw UserError(name + " goes through more than 40 symbolic links (a loop?), give the path of a file instead");
}

// Why a file could not be created in `dir`, worded for the user.
std::string create_failure(int err, const fs::path& dir) {
  if (err == ENOENT || err == ENOTDIR) return "the directory \"" + dir.string() + "\" does not exist";
  if (err == EACCES || err == EPERM) return "no permission to write in the directory \"" + dir.string() + "\"";
  return reason(err);
}

}  // namespace

std::string read_text_file(const std::string& path, const std::string& what) {
  const std::string name = what + " \"" + path + "\"";
  if (path.empty()) throw UserError(what + " path is empty (give the path of a JSON file)");
  // O_NONBLOCK: opening a FIFO must not wait for a writer before we get to refuse it.
  Fd f(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (f.fd < 0) {
    const int err = errno;
    if (err == ENOENT || err == ENOTDIR) throw UserError(name + " does not exist");
    if (err == EACCES || err == EPERM) throw UserError(name + " cannot be read (no permission)");
    throw UserError(name + " cannot be opened (" + reason(err) + ")");
  }
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) throw UserError(name + " cannot be read (" + reason(errno) + ")");
  if (S_ISDIR(st.st_mode)) throw UserError(name + " is a directory (expected a JSON file)");
  if (!S_ISREG(st.st_mode)) throw UserError(name + " is " + kind_of(st.st_mode) + ", not a regular file (expected a JSON file)");
  const std::string too_big = name + " is larger than the " + std::to_string(kMaxInputFileBytes >> 20) +
                              " MiB limit for input files (expected a JSON file of at most a few MiB)";
  if (st.st_size > kMaxInputFileBytes) throw UserError(too_big);
  std::string text;
  text.reserve(size_t(st.st_size));
  char buf[1 << 16];
  while (true) {
    const ssize_t n = ::read(f.fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw UserError(name + " cannot be read (" + reason(errno) + ")");
    if (n == 0) break;
    text.append(buf, size_t(n));
    if (std::int64_t(text.size()) > kMaxInputFileBytes) throw UserError(too_big);  // grew while we read it
  }
  return text;
}

nlohmann::json read_json_file(const std::string& path, const std::string& what) {
  nlohmann::json j = nlohmann::json::parse(read_text_file(path, what), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw UserError(what + " \"" + path + "\" is not valid JSON");
  return j;
}

void write_file_atomic(const std::string& path, const std::string& content) {
  if (path.empty()) throw UserError("the output path is empty (give a file name such as recipe.json)");
  const std::string name = "output \"" + path + "\"";
  struct stat st {};
  // stat follows links, so a link to a device (or /dev/stdout) is refused like the device itself.
  const bool exists = ::stat(path.c_str(), &st) == 0;
  if (exists && !S_ISREG(st.st_mode))
    throw UserError(name + " is " + kind_of(st.st_mode) + ", not a regular file (give the path of a file to create or replace)");
  const fs::path target = follow_links(path, name);
  const std::string base = target.filename().string();
  if (base.empty() || base == "." || base == "..")
    throw UserError(name + " names a directory, not a file (give the path of a file to create or replace)");
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");

  std::string tmp;
  int fd = -1;
  for (int attempt = 0; fd < 0; ++attempt) {
    tmp = (dir / ("." + base + ".tmp." + random_suffix())).string();
    // O_EXCL: never open something already there (a planted link); 0644 lets the kernel apply the umask.
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0 && (errno != EEXIST || attempt == 100))
      throw UserError(name + " cannot be written (" + create_failure(errno, dir) + ")");
  }
  // Any failure from here on: the temporary goes, the old file stays as it was.
  auto fail = [&](const char* what, int err) {
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    throw UserError(name + " " + what + " (" + reason(err) + ")");
  };
  if (exists) {
    // Best effort: root replacing a user's file should leave it theirs; without that privilege it becomes ours.
    if (st.st_uid != ::geteuid() || st.st_gid != ::getegid()) {
      [[maybe_unused]] const int ignored = ::fchown(fd, st.st_uid, st.st_gid);
    }
    if (::fchmod(fd, st.st_mode & 07777) != 0) fail("could not be written with the old file's permissions", errno);
  }
  for (size_t done = 0; done < content.size();) {
    const ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("could not be written completely", n < 0 ? errno : ENOSPC);
    done += size_t(n);
  }
  if (::fsync(fd) != 0) fail("could not be flushed to disk", errno);
  const int closed = ::close(fd);
  fd = -1;
  if (closed != 0) fail("could not be written completely", errno);
  if (::rename(tmp.c_str(), target.c_str()) != 0) fail("could not replace the old file", errno);
  // The rename is durable only once the directory entry is on disk; a directory we cannot open is left unsynced.
  Fd d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (d.fd >= 0 && ::fsync(d.fd) != 0 && errno != EINVAL)
    throw UserError(name + " was written but its directory could not be synced (" + reason(errno) + ")");
}

}  // namespace lcplan
