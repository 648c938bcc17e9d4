// checkpoint/dir_lock.cu - what checkpoint/dir_lock.h asks of a checkpoint directory: a path
// short enough, and one job at a time (the lock file and its OS locks).
#include "checkpoint/dir_lock.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>

#include "checkpoint/files.h"
#include "checkpoint/hdf5_format.h"
#include "config/config.h"
#include "parallel/comm.h"

std::string checkpoint_dir_path_problem(const std::string& dir, int max_step, int world_size) {
  char step[40];
  std::snprintf(step, sizeof(step), "/step_%06d.tmp/", max_step);
  const std::string longest = step + rank_file_name(world_size - 1);
  if (dir.size() + longest.size() < PATH_MAX) return "";
  return "the path is " + std::to_string(dir.size()) + " bytes long, and the trainer appends "
         "names of up to " + std::to_string(longest.size()) + " bytes under it (" +
         longest.substr(1) + "): together they reach the system's limit on a path, PATH_MAX = " +
         std::to_string(PATH_MAX) + " bytes including the terminating zero; choose a dir of at "
         "most " + std::to_string(PATH_MAX - 1 - longest.size()) + " bytes";
}

// ---------------------------------------------------------------------------------------------
// One job at a time (dir_lock.h)
// ---------------------------------------------------------------------------------------------
constexpr off_t kRankBytes = (off_t)1 << 20;  // rank r holds byte kRankBytes + r

namespace {

struct LockTry {
  int error = 0;        // 0: taken; EAGAIN/EACCES: held by another process; else unsupported
  bool held() const { return error == EAGAIN || error == EACCES; }
};

LockTry lock_range(int fd, off_t start, off_t len) {
  struct flock fl;
  std::memset(&fl, 0, sizeof(fl));
  fl.l_type = F_WRLCK, fl.l_whence = SEEK_SET, fl.l_start = start, fl.l_len = len;
  return LockTry{fcntl(fd, F_OFD_SETLK, &fl) == 0 ? 0 : errno};
}

bool range_held(int fd, off_t start, off_t len) {  // by another open file description
  struct flock fl;
  std::memset(&fl, 0, sizeof(fl));
  fl.l_type = F_WRLCK, fl.l_whence = SEEK_SET, fl.l_start = start, fl.l_len = len;
  return fcntl(fd, F_OFD_GETLK, &fl) == 0 && fl.l_type != F_UNLCK;
}

std::string read_all(int fd) {
  std::string text;
  char buf[512];
  ssize_t n;
  for (off_t at = 0; (n = pread(fd, buf, sizeof(buf), at)) > 0 && text.size() < 4096; at += n)
    text.append(buf, (size_t)n);
  return text;
}

// Waits up to wait_s while `busy()` (checking every 0.1 s); false if still busy then.
template <class Busy>
bool wait_while(Busy busy, int wait_s, const std::string& note) {
  const auto t0 = std::chrono::steady_clock::now();
  bool said = false;
  while (busy()) {
    if (std::chrono::steady_clock::now() - t0 >= std::chrono::seconds(wait_s)) return false;
    if (!said) std::printf("lock     %s: waiting up to %d s\n", note.c_str(), wait_s), said = true;
    std::fflush(stdout);
    usleep(100 * 1000);
  }
  return true;
}

// Rank 0: takes byte 0 of `path` (and with `ranks`, waits until no rank byte is held), writes
// the holder's line. "" (taken, or the file system has no locks: *fd = -1) or the problem.
std::string take_job_lock(const std::string& path, const std::string& what, int wait_s,
                          int ranks, bool rank_bytes, int* fd_out) {
  *fd_out = -1;
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return "cannot open " + path + ": " + std::strerror(errno);
  LockTry t = lock_range(fd, 0, 1);
  if (t.held() && wait_while([&] { return (t = lock_range(fd, 0, 1)).held(); }, wait_s,
                             what + " is in use by " + lock_holder_describe(read_all(fd))))
    t.error = 0;
  if (t.held()) {
    const std::string holder = lock_holder_describe(read_all(fd));
    close(fd);
    return what + " is in use by another job: " + holder + " (it holds " + path + " after " +
           std::to_string(wait_s) + " s of waiting; [checkpoint] lock_wait_s). Wait for it to "
           "end, or use another directory or metrics file";
  }
  if (t.error != 0) {
    std::printf("lock     warning: cannot lock %s (%s): this file system has no locks, so a "
                "second job in %s would not be stopped\n", path.c_str(), std::strerror(t.error),
                what.c_str());
    close(fd);
    return "";
  }
  if (rank_bytes && !wait_while([&] { return range_held(fd, kRankBytes, 0); }, wait_s,
                                "a rank of the job that held " + path + " is still alive")) {
    close(fd);
    return what + ": a rank of the previous job (" + lock_holder_describe(read_all(fd)) +
           ") still holds " + path + " after " + std::to_string(wait_s) + " s; it may still "
           "write a checkpoint. Wait until it is gone";
  }
  const std::string old = read_all(fd);
  if (!old.empty())
    std::printf("lock     %s: taking over from %s, which has ended\n", path.c_str(),
                lock_holder_describe(old).c_str());
  const std::string text = lock_holder_text(ranks);
  if (ftruncate(fd, 0) != 0 || pwrite(fd, text.data(), text.size(), 0) != (ssize_t)text.size() ||
      fsync(fd) != 0) {
    const std::string why = std::strerror(errno);
    close(fd);
    return "cannot write " + path + ": " + why;
  }
  *fd_out = fd;  // never closed: the lock lives as long as the process
  return "";
}

// The first non-empty message over the ranks; stops every rank with it.
void agree_or_stop(Comm& world, const std::string& problem) {
  if (all_agree(world, problem.empty())) return;
  for (const std::string& p : all_gather_strings(world, problem))
    if (!p.empty()) FATAL_ALL("%s", p.c_str());
}

// Every rank: its own byte of the job's lock file, held (the descriptor never closed) until exit.
void take_rank_lock(const std::string& path, Comm& world) {
  const int mine = open(path.c_str(), O_RDWR | O_CLOEXEC);
  const LockTry t = mine >= 0 ? lock_range(mine, kRankBytes + world.rank, 1) : LockTry{errno};
  std::string problem;
  if (t.error != 0)
    problem = "rank " + std::to_string(world.rank) + ": cannot lock " + path + ": " +
              std::strerror(t.error);
  agree_or_stop(world, problem);
}

}  // namespace

void job_locks_take(const Config& cfg, Comm& world) {
  const int wait_s = cfg.checkpoint.lock_wait_s;
  int fd = -1;
  std::string problem;
  const std::string& dir = cfg.checkpoint.dir;
  if (!dir.empty()) {
    if (world.rank == 0)
      problem = take_job_lock(dir + "/lock", "[checkpoint] dir = " + dir, wait_s, world.size,
                              true, &fd);
    agree_or_stop(world, problem);
    if (all_agree(world, world.rank != 0 || fd >= 0)) take_rank_lock(dir + "/lock", world);
  }
  struct stat st;  // metrics into a device (/dev/stdout) or a FIFO: nothing to protect
  const bool regular = stat(cfg.log.metrics.c_str(), &st) != 0 || S_ISREG(st.st_mode);
  if (!cfg.log.metrics.empty() && regular && world.rank == 0)
    problem = take_job_lock(cfg.log.metrics + ".lock", "[log] metrics = " + cfg.log.metrics,
                            wait_s, world.size, false, &fd);
  agree_or_stop(world, problem);
}
