// checkpoint/dir_lock.h - what a checkpoint directory must be before the first step: short
// enough for every name the trainer puts in it, and no other job's.
//
// Path length. The kernel refuses a path of PATH_MAX (4096) bytes or more, and the trainer
// appends names under [checkpoint] dir, the longest being a rank file inside the temporary
// directory of a save, "/step_000123.tmp/rank_00007.h5" (with the digits of [train] steps and of
// the world size). The start-up probe writes a shorter name, so a dir near the limit used to pass
// it and fail only at the first save; it is refused at start-up instead, naming its length, the
// longest name and the limit.
#pragma once
#include <string>

// "" or the problem, naming the dir's length, the longest name appended and PATH_MAX.
std::string checkpoint_dir_path_problem(const std::string& dir, int max_step, int world_size);

// One job at a time. A checkpoint directory (and a metrics file) belongs to one job while it
// runs: two jobs in one directory (a requeued job starting while the old one drains, a second
// launch by hand) would each resume from the other's `latest`, overwrite each other's step
// directories and drop each other's metrics records.
//
// The lock is dir/lock (and, for [log] metrics = F, the file F.lock): a small text file naming
// the holder, "host <h> pid <p> started <time> (unix <s>), <n> rank(s)", and OS locks on it
// that die with the process that holds them (Linux open-file-description locks, fcntl
// F_OFD_SETLK: released when the process exits or is killed, never by another close in the
// same process):
//   byte 0              the job: rank 0 holds it for its whole life
//   byte 2^20 + r       rank r of the job holding it, for its whole life
// A new job's rank 0 takes byte 0, waiting up to [checkpoint] lock_wait_s while another job
// holds it, then refusing with the holder's line; then it waits, the same way, until no byte
// 2^20 + r is held: a job killed with kill -9 of mpirun leaves ranks that live on for seconds
// and may still write a checkpoint, and the new job starts only when every one of them is gone.
// Then every rank takes its own byte. A lock file left by a crashed job holds no OS lock: it is
// taken over (the old holder's line is printed), which is safe because the OS lock, not the
// file, decides. Other ranks write into the directory only inside a save that rank 0 runs, and
// all of them hold their bytes until they exit, so no rank of a job writes after the next job
// has started.
//
// Shared file systems: NFS (v3 with lockd, v4) carries these locks to the server, so they hold
// across nodes; a node that dies without releasing them holds them until the server's lease
// expires (NFSv4: about 90 s), during which a new job waits and then refuses. Lustre needs the
// `flock` mount option (with `localflock` the locks hold on one node only). A file system
// without locks (some FUSE mounts) answers ENOLCK or EOPNOTSUPP: the trainer then warns that two
// jobs would not be stopped and goes on.
struct Config;
struct Comm;
// At start-up, every rank (collective): takes the locks of [checkpoint] dir (when set) and of
// [log] metrics (rank 0; when set), or stops the job naming the holder.
void job_locks_take(const Config& cfg, Comm& world);
// (The lock file's text, lock_holder_text and lock_holder_describe, is checkpoint/files.h's.)
