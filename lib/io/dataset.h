#pragma once
// Training sequences in HDF5 (format and rules in data/README.md):
//   tokens    int32 [total]   every sequence's token ids, concatenated
//   offsets   int64 [n + 1]   sequence i is tokens[offsets[i] : offsets[i+1]]; offsets[0] = 0, last = total
//   loss_mask uint8 [total]   1 = the token is trained on (a response token), 0 = context only
// The reader validates on open and reads one sequence at a time (hyperslab), never the whole file.
// Plus the data order of training: an epoch-seeded shuffle and the assignment of sequences to drafter ranks.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace dflash::io {

// One training sequence.
struct Sequence {
  int64_t index = -1;               // position in the file
  std::vector<int32_t> tokens;      // [S]
  std::vector<uint8_t> loss_mask;   // [S], 0/1
};

// Streams sequences into a new HDF5 file (chunked, deflate). close() finishes it: writes what is buffered, closes
// every HDF5 handle and fsyncs; commit(final) then renames it into place. The file is only valid after close().
// Errors: any failed write (a full disk, a file-size limit, an I/O error) throws a dflash::Error naming the file,
// what was being written and the OS error, after the writer has closed its handles and removed the file it
// created; the writer is then unusable. Destroyed without a successful close() (an exception on the way), it
// closes what is open, ignores errors and removes the unfinished file it created: never a half-written dataset.
// The writer does its I/O through its own POSIX file driver (dataset.cpp explains why), so that HDF5 never sees
// a failed write and every handle closes cleanly after one.
class DatasetWriter {
 public:
  explicit DatasetWriter(const std::string& path);
  ~DatasetWriter() noexcept;
  DatasetWriter(const DatasetWriter&) = delete;
  DatasetWriter& operator=(const DatasetWriter&) = delete;

  // tokens [n], loss_mask [n] (nullptr = all 1). Values are written as given; the reader validates them.
  void add(const int32_t* tokens, const uint8_t* loss_mask, int64_t n);
  void add(const std::vector<int32_t>& tokens, const std::vector<uint8_t>& loss_mask = {});
  void close();
  // close(), then rename the file to final_path (replacing what is there) and fsync the folder. Until the rename
  // final_path is untouched; a failure removes this writer's file. For the usual "OUT.h5.partial -> OUT.h5".
  void commit(const std::string& final_path);

  int64_t sequences() const { return offsets_written_ + int64_t(offsets_buf_.size()) - 1; }
  int64_t tokens() const { return total_tokens_; }
  const std::string& path() const { return path_; }

  // Tests only: the nth I/O call of the writer's driver from now on (1 = the next pwrite, ftruncate or fsync) fails
  // with errno `err`, as a full disk fails whichever write comes next (RLIMIT_FSIZE fails by file offset instead).
  void fail_io_for_testing(int64_t nth, int err);

  struct IoState;  // the driver's record of the first failed OS call (dataset.cpp)

 private:
  void flush();
  void append(int64_t ds, int64_t mem_type, const void* data, uint64_t at, uint64_t n, const char* name);
  // Throws (after abandon()) when the driver recorded an OS error or status < 0; `what` names the operation.
  void check(int64_t status, const std::string& what);
  // Closes every open handle (errors ignored, each handle closed at most once) and removes the file if this
  // writer created it. Never throws.
  void abandon() noexcept;

  std::string path_;
  int64_t file_ = -1, tokens_ds_ = -1, offsets_ds_ = -1, mask_ds_ = -1;  // hid_t
  std::shared_ptr<IoState> io_;  // shared with the open file's driver
  bool created_ = false;         // this writer created path_ (so it may remove it)
  bool closed_ = false;          // close() succeeded: the file is complete
  bool failed_ = false;          // a write failed: the file is gone, add() / close() refuse
  std::vector<int32_t> tokens_buf_;
  std::vector<uint8_t> mask_buf_;
  std::vector<int64_t> offsets_buf_{0};  // offsets not yet written to the file
  int64_t flushed_tokens_ = 0, offsets_written_ = 0, total_tokens_ = 0;
};

// Writes a whole dataset at once (tests, small tools). offsets [n+1], loss_mask same length as tokens.
void write_dataset(const std::string& path, const std::vector<int32_t>& tokens, const std::vector<int64_t>& offsets,
                   const std::vector<uint8_t>& loss_mask);

struct DatasetStats {
  int64_t sequences = 0, tokens = 0;
  int64_t min_len = 0, max_len = 0;
  double mean_len = 0;
  int64_t trained_tokens = 0;       // loss_mask == 1
  int32_t max_token = -1;           // -1 when empty
};

// An open, validated dataset. Keeps offsets in memory (8 bytes per sequence); reads tokens on demand.
// Not thread-safe (the Debian HDF5 is a serial build): read from one thread per process.
class Dataset {
 public:
  // vocab > 0: every token id must be in [0, vocab); vocab <= 0: ids must only be >= 0.
  // scan_tokens: check every token and mask value now (streamed in chunks); otherwise only the structure is
  // checked on open and each read() checks its own sequence.
  Dataset(const std::string& path, int64_t vocab, bool scan_tokens = true);
  ~Dataset();
  Dataset(const Dataset&) = delete;
  Dataset& operator=(const Dataset&) = delete;

  int64_t size() const { return int64_t(offsets_.size()) - 1; }  // number of sequences
  int64_t total_tokens() const { return offsets_.back(); }
  int64_t length(int64_t i) const;
  const std::vector<int64_t>& offsets() const { return offsets_; }
  const std::string& path() const { return path_; }

  // Sequence i (validated); max_len > 0 keeps only its first max_len tokens.
  Sequence read(int64_t i, int64_t max_len = 0) const;
  // Reads every token once (in chunks) for inspect.
  DatasetStats stats() const;
  // The epoch's order of sequence indices (see shuffle_order).
  std::vector<int64_t> order(int64_t epoch, uint64_t seed, bool shuffle = true) const;
  // Reads every token and mask value once, in file order and chunks of kScanChunk, checks them, and hands each
  // chunk to visit.
  void scan(const std::function<void(const int32_t* tokens, const uint8_t* mask, int64_t n)>& visit) const;

 private:
  void check_values(const int32_t* tokens, const uint8_t* mask, int64_t begin, int64_t n) const;

  std::string path_;
  int64_t vocab_;
  int64_t file_ = -1, tokens_ds_ = -1, mask_ds_ = -1;  // hid_t
  std::vector<int64_t> offsets_;  // [n + 1]
};

// A permutation of 0..n-1 that depends only on (n, epoch, seed): Fisher-Yates driven by
// Rng(mix64(seed ^ "data"), epoch). shuffle = false gives 0..n-1.
std::vector<int64_t> shuffle_order(int64_t n, int64_t epoch, uint64_t seed, bool shuffle = true);

// Which sequence each drafter rank trains on. Slot j of an epoch's order goes to drafter rank j % drafter_dp;
// step s of the epoch, micro-batch m uses slots (s * micro_batches + m) * drafter_dp + [0, drafter_dp).
// An epoch has floor(n / (drafter_dp * micro_batches)) steps; the order's tail that does not fill a step is
// skipped that epoch (a different tail each epoch when shuffled). Global step g is step g % steps_per_epoch
// of epoch g / steps_per_epoch.
class SequenceSchedule {
 public:
  // dataset_name is for the error when the dataset cannot fill one step.
  SequenceSchedule(int64_t num_sequences, int drafter_dp, int micro_batches, uint64_t seed, bool shuffle,
                   const std::string& dataset_name = "the dataset");
  int64_t steps_per_epoch() const { return steps_per_epoch_; }
  int64_t epoch_of(int64_t step) const { return step / steps_per_epoch_; }
  // Dataset index for (global step, micro-batch, drafter rank).
  int64_t sequence(int64_t step, int micro, int drafter_rank) const;

 private:
  int64_t n_;
  int dp_, micro_;
  uint64_t seed_;
  bool shuffle_;
  int64_t steps_per_epoch_;
  mutable int64_t cached_epoch_ = -1;
  mutable std::vector<int64_t> cached_order_;
};

}  // namespace dflash::io
