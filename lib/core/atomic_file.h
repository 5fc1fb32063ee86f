#pragma once
// Durable, all-or-nothing file writes: every file the project writes goes to a temporary name next to its final
// path, is fsync'd, renamed over the final path and the directory entry is fsync'd. A crash at any point leaves
// either the old file or the complete new one, never a torn file under the final name.
#include <string>
#include <string_view>

namespace dflash {

// fsync a file or a directory (directory = true); a failure is a dflash::Error naming the path.
void fsync_path(const std::string& path, bool directory);

// Writes `bytes` to `path` (created or truncated) and fsyncs it; no rename. For writers with a protocol of their
// own (a checkpoint renames several files, then writes its DONE marker).
void write_file_durable(const std::string& path, std::string_view bytes);

// Writes `bytes` to `path` atomically (temporary name, fsync, rename, fsync of the parent directory).
void write_file_atomic(const std::string& path, std::string_view bytes);

// For writers that produce the file themselves (HDF5, safetensors): write to partial(), then commit().
// Destroyed without commit() (an exception on the way), it removes the partial file: nothing half-written stays.
class AtomicOutput {
 public:
  explicit AtomicOutput(std::string path);
  ~AtomicOutput();
  AtomicOutput(const AtomicOutput&) = delete;
  AtomicOutput& operator=(const AtomicOutput&) = delete;

  const std::string& partial() const { return partial_; }  // "<path>.partial"
  const std::string& path() const { return path_; }
  // fsync the partial file, rename it to path(), fsync the directory.
  void commit();

 private:
  std::string path_, partial_;
  bool committed_ = false;
};

}  // namespace dflash
