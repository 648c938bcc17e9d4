// checkpoint/files.h - the file-system half of checkpointing: durable writes (fsync of files
// and of the directories that name them), atomic renames, CRC32 of files, and the manifest that
// makes a checkpoint directory self-verifying.
//
// The manifest (manifest.txt, written last, by rank 0) lists every other file of the checkpoint
// with its size and CRC32 and ends with a line carrying the CRC32 of the lines before it, so a
// damaged or cut-off manifest is caught as well:
//
//   # checkpoint manifest, format 1: <bytes> <crc32> <file>
//   4198123 5a0c33e1 checkpoint.h5
//   98304016 0b7d2f90 rank_00000.h5
//   ...
//   end 9c1e7f02
//
// The CRC32 is zlib's (polynomial 0xEDB88320), so `python3 -c "import zlib; ..."` or `crc32`
// from the shell checks a file without our code. Computed slice-by-8 (~2 GB/s per core), by each
// writer over the bytes it writes (write_bytes_synced), so a file is never read back to be
// digested.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

// CRC32 of a buffer, continuing from `crc` (0 to start), and of a whole file.
uint32_t crc32_update(uint32_t crc, const void* data, size_t n);

struct FileDigest {
  uint64_t bytes = 0;
  uint32_t crc32 = 0;
};
// Reads the file and digests it. Returns "" or a message naming the file.
std::string digest_file(const std::string& path, FileDigest* out);

// fsync of a directory: makes the creation, rename or removal of its entries durable.
std::string sync_dir(const std::string& dir);
// Writes `text` to path via path.tmp + fsync + rename + fsync of the directory: a reader sees
// the old content or the new, never a mix.
std::string write_file_atomically(const std::string& path, const std::string& text);
std::string write_file_synced(const std::string& path, const std::string& text);
// Creates path with the n bytes at data, fsyncs it and gives their size and CRC32: "" or the
// error naming the file (a full disk: "cannot write <path>: No space left on device").
std::string write_bytes_synced(const std::string& path, const void* data, size_t n,
                               FileDigest* digest);
bool read_text_file(const std::string& path, std::string* out);

bool path_exists(const std::string& path);
bool is_directory(const std::string& path);
std::string make_dir(const std::string& path);  // mkdir -p; "" or the error
// mkdir -p, then writes, fsyncs and removes a small file `name` inside: "" if the directory can
// hold files, else the error naming the path.
std::string probe_dir(const std::string& dir, const std::string& name);
void remove_tree(const std::string& path);      // rm -rf, best effort
std::string parent_dir(const std::string& path);
std::string base_name(const std::string& path);
std::vector<std::string> list_dir(const std::string& dir);  // names, without . and ..
// Moves `from` to `to`. If `to` exists (a directory of the same name from an abandoned run),
// the two are swapped atomically (renameat2 RENAME_EXCHANGE), so `to` is never missing, and
// the old content is left at `from`.
std::string rename_replacing(const std::string& from, const std::string& to);

// A lock file's holder line (checkpoint/dir_lock.h): "host <h> pid <p> started <time> (unix
// <s>), <n> rank(s)", written by the job that takes the lock; and its description for a message,
// "host h, pid p, started t, n rank(s)", or, for text that is not such a line (a damaged or
// foreign file), what it says (printable characters only, at most 80). Never fails.
std::string lock_holder_text(int ranks);
std::string lock_holder_describe(const std::string& text);

// The manifest.
struct ManifestEntry {
  std::string file;  // name inside the checkpoint directory
  FileDigest digest;
};
std::string manifest_text(const std::vector<ManifestEntry>& entries);
// Parses manifest.txt of `dir`; returns "" or a message naming the manifest.
std::string manifest_read(const std::string& dir, std::vector<ManifestEntry>* entries);
// Checks presence and size of every entry and the CRC32 of the entries i with
// i % stride == offset (so the ranks share the reading). Returns "" or a message naming the file.
std::string manifest_verify(const std::string& dir, const std::vector<ManifestEntry>& entries,
                            int offset, int stride);
