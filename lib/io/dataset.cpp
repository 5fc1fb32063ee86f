#include "lib/io/dataset.h"

#include <algorithm>
#include <functional>
#include <filesystem>
#include <numeric>
#include <type_traits>

#include <hdf5.h>

#include "lib/core/error.h"
#include "lib/core/rng.h"

namespace dflash::io {

static_assert(std::is_same_v<hid_t, int64_t>, "dataset.h stores hid_t as int64_t (HDF5 >= 1.10)");

namespace {

constexpr const char* kFormatHint =
    "a DFlash dataset holds tokens (int32), offsets (int64, n+1) and loss_mask (uint8); see data/README.md "
    "(dflash_data import-jsonl makes one)";
constexpr hsize_t kTokenChunk = 1 << 14;    // elements per HDF5 chunk of tokens / loss_mask (64 KiB of ids)
constexpr hsize_t kOffsetChunk = 1 << 14;   // elements per HDF5 chunk of offsets
constexpr size_t kWriteBuffer = 1 << 20;    // tokens buffered by the writer before a flush
constexpr int64_t kScanChunk = 1 << 22;     // tokens read at a time by validation and stats

// Library errors are turned into dflash::Error below; HDF5 must not print its own stack to stderr.
void quiet_hdf5() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

herr_t collect_error(unsigned n, const H5E_error2_t* e, void* data) {
  auto* descs = static_cast<std::vector<std::string>*>(data);
  if (e->desc && *e->desc) descs->push_back(e->desc);
  return 0;
}

// The outermost and innermost messages of HDF5's error stack ("unable to open file: file signature not found").
std::string hdf5_detail() {
  std::vector<std::string> descs;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect_error, &descs);
  H5Eclear2(H5E_DEFAULT);
  if (descs.empty()) return "HDF5 gave no detail";
  if (descs.size() == 1 || descs.front() == descs.back()) return descs.front();
  return descs.front() + ": " + descs.back();
}

// Throws with the file name and HDF5's reason when an HDF5 call returned a negative value.
template <typename... A>
void h5check(int64_t status, const std::string& path, fmt::format_string<A...> what, A&&... args) {
  if (status < 0)
    throw Error(fmt::format("{}: {} ({})", path, fmt::format(what, std::forward<A>(args)...), hdf5_detail()));
}

void close_dataset(int64_t& id) {
  if (id >= 0) H5Dclose(id);
  id = -1;
}
void close_file(int64_t& id) {
  if (id >= 0) H5Fclose(id);
  id = -1;
}

int64_t create_extendible(int64_t file, const char* name, hid_t type, hsize_t chunk, const std::string& path) {
  hsize_t dims[1] = {0}, maxdims[1] = {H5S_UNLIMITED}, chunks[1] = {chunk};
  hid_t space = H5Screate_simple(1, dims, maxdims);
  hid_t plist = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_chunk(plist, 1, chunks);
  H5Pset_deflate(plist, 4);
  hid_t ds = H5Dcreate2(file, name, type, space, H5P_DEFAULT, plist, H5P_DEFAULT);
  H5Pclose(plist);
  H5Sclose(space);
  h5check(ds, path, "cannot create dataset '{}'", name);
  return ds;
}

// Appends n elements of `mem_type` at position `at` of a 1-D extendible dataset.
void append(int64_t ds, hid_t mem_type, const void* data, hsize_t at, hsize_t n, const std::string& path,
            const char* name) {
  if (n == 0) return;
  hsize_t new_size[1] = {at + n}, start[1] = {at}, count[1] = {n};
  h5check(H5Dset_extent(ds, new_size), path, "cannot extend dataset '{}'", name);
  hid_t fspace = H5Dget_space(ds);
  H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start, nullptr, count, nullptr);
  hid_t mspace = H5Screate_simple(1, count, nullptr);
  herr_t st = H5Dwrite(ds, mem_type, mspace, fspace, H5P_DEFAULT, data);
  H5Sclose(mspace);
  H5Sclose(fspace);
  h5check(st, path, "cannot write dataset '{}' (disk full?)", name);
}

// Reads n elements from position `at` of a 1-D dataset, converted to `mem_type`.
void read_range(int64_t ds, hid_t mem_type, void* out, hsize_t at, hsize_t n, const std::string& path,
                const char* name) {
  if (n == 0) return;
  hsize_t start[1] = {at}, count[1] = {n};
  hid_t fspace = H5Dget_space(ds);
  H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start, nullptr, count, nullptr);
  hid_t mspace = H5Screate_simple(1, count, nullptr);
  herr_t st = H5Dread(ds, mem_type, mspace, fspace, H5P_DEFAULT, out);
  H5Sclose(mspace);
  H5Sclose(fspace);
  h5check(st, path, "cannot read elements [{}, {}) of dataset '{}' (file truncated or corrupt?)", at, at + n, name);
}

// Opens a 1-D integer dataset and returns its length.
int64_t open_dataset(int64_t file, const char* name, const std::string& path, hsize_t* length) {
  if (H5Lexists(file, name, H5P_DEFAULT) <= 0)
    throw Error(fmt::format("{}: dataset '{}' is missing; {}", path, name, kFormatHint));
  hid_t ds = H5Dopen2(file, name, H5P_DEFAULT);
  h5check(ds, path, "cannot open dataset '{}'", name);
  hid_t type = H5Dget_type(ds);
  H5T_class_t cls = H5Tget_class(type);
  H5Tclose(type);
  hid_t space = H5Dget_space(ds);
  int rank = H5Sget_simple_extent_ndims(space);
  hsize_t dims[1] = {0};
  if (rank == 1) H5Sget_simple_extent_dims(space, dims, nullptr);
  H5Sclose(space);
  if (cls != H5T_INTEGER || rank != 1) {
    H5Dclose(ds);
    throw Error(fmt::format("{}: dataset '{}' must be a 1-D integer array, found {} dimension(s) of {} values; {}",
                            path, name, rank, cls == H5T_INTEGER ? "integer" : "non-integer", kFormatHint));
  }
  *length = dims[0];
  return ds;
}

}  // namespace

// ---------------------------------------------------------------- writer

DatasetWriter::DatasetWriter(const std::string& path) : path_(path) {
  quiet_hdf5();
  file_ = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  h5check(file_, path_, "cannot create the HDF5 file (does the folder exist and is it writable?)");
  tokens_ds_ = create_extendible(file_, "tokens", H5T_STD_I32LE, kTokenChunk, path_);
  offsets_ds_ = create_extendible(file_, "offsets", H5T_STD_I64LE, kOffsetChunk, path_);
  mask_ds_ = create_extendible(file_, "loss_mask", H5T_STD_U8LE, kTokenChunk, path_);
}

DatasetWriter::~DatasetWriter() {
  try {
    close();
  } catch (...) {
    // the error was the caller's to see through close(); a destructor must not throw
  }
}

void DatasetWriter::add(const int32_t* tokens, const uint8_t* loss_mask, int64_t n) {
  DFLASH_CHECK(file_ >= 0, "{}: add() after close()", path_);
  DFLASH_CHECK(n >= 0, "{}: negative sequence length {}", path_, n);
  tokens_buf_.insert(tokens_buf_.end(), tokens, tokens + n);
  if (loss_mask) mask_buf_.insert(mask_buf_.end(), loss_mask, loss_mask + n);
  else mask_buf_.insert(mask_buf_.end(), size_t(n), uint8_t(1));
  total_tokens_ += n;
  offsets_buf_.push_back(total_tokens_);
  if (tokens_buf_.size() >= kWriteBuffer) flush();
}

void DatasetWriter::add(const std::vector<int32_t>& tokens, const std::vector<uint8_t>& loss_mask) {
  DFLASH_CHECK(loss_mask.empty() || loss_mask.size() == tokens.size(),
               "{}: sequence {} has {} tokens but {} loss_mask values", path_, sequences(), tokens.size(),
               loss_mask.size());
  add(tokens.data(), loss_mask.empty() ? nullptr : loss_mask.data(), int64_t(tokens.size()));
}

void DatasetWriter::flush() {
  append(tokens_ds_, H5T_NATIVE_INT32, tokens_buf_.data(), flushed_tokens_, tokens_buf_.size(), path_, "tokens");
  append(mask_ds_, H5T_NATIVE_UINT8, mask_buf_.data(), flushed_tokens_, mask_buf_.size(), path_, "loss_mask");
  append(offsets_ds_, H5T_NATIVE_INT64, offsets_buf_.data(), offsets_written_, offsets_buf_.size(), path_, "offsets");
  flushed_tokens_ += int64_t(tokens_buf_.size());
  offsets_written_ += int64_t(offsets_buf_.size());
  tokens_buf_.clear();
  mask_buf_.clear();
  offsets_buf_.clear();
}

void DatasetWriter::close() {
  if (file_ < 0) return;
  try {
    flush();
  } catch (...) {
    close_dataset(tokens_ds_), close_dataset(offsets_ds_), close_dataset(mask_ds_), close_file(file_);
    throw;
  }
  close_dataset(tokens_ds_), close_dataset(offsets_ds_), close_dataset(mask_ds_);
  h5check(H5Fclose(file_), path_, "cannot close the HDF5 file (disk full?)");
  file_ = -1;
}

void write_dataset(const std::string& path, const std::vector<int32_t>& tokens, const std::vector<int64_t>& offsets,
                   const std::vector<uint8_t>& loss_mask) {
  DFLASH_CHECK(!offsets.empty() && offsets.front() == 0 && offsets.back() == int64_t(tokens.size()) &&
                   loss_mask.size() == tokens.size(),
               "{}: write_dataset needs offsets [n+1] from 0 to len(tokens) and one loss_mask value per token", path);
  DatasetWriter w(path);
  for (size_t i = 0; i + 1 < offsets.size(); ++i) {
    DFLASH_CHECK(offsets[i + 1] >= offsets[i], "{}: offsets must be non-decreasing (sequence {})", path, i);
    w.add(tokens.data() + offsets[i], loss_mask.data() + offsets[i], offsets[i + 1] - offsets[i]);
  }
  w.close();
}

// ---------------------------------------------------------------- reader

Dataset::Dataset(const std::string& path, int64_t vocab, bool scan_tokens) : path_(path), vocab_(vocab) {
  quiet_hdf5();
  if (!std::filesystem::exists(path)) throw Error(fmt::format("{}: no such file; {}", path, kFormatHint));
  if (H5Fis_hdf5(path.c_str()) <= 0) {
    H5Eclear2(H5E_DEFAULT);
    throw Error(fmt::format("{}: not an HDF5 file; {}", path, kFormatHint));
  }
  // Read-only opens without HDF5's file locking: every rank reads the file at once, and on Lustre or NFS mounts
  // without flock support HDF5's default locking fails the open ("unable to lock file") or blocks. Readers never
  // need it (nothing writes a training file while a job reads it). HDF5_USE_FILE_LOCKING in the environment still
  // takes precedence (docs/running.md).
  const hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  h5check(fapl, path_, "cannot create a file-access property list");
  H5Pset_file_locking(fapl, false, true);
  file_ = H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl);
  H5Pclose(fapl);
  h5check(file_, path_, "cannot open the HDF5 file");
  try {
    hsize_t n_tokens = 0, n_offsets = 0, n_mask = 0;
    tokens_ds_ = open_dataset(file_, "tokens", path_, &n_tokens);
    mask_ds_ = open_dataset(file_, "loss_mask", path_, &n_mask);
    int64_t offsets_ds = open_dataset(file_, "offsets", path_, &n_offsets);
    offsets_.resize(n_offsets);
    try {
      read_range(offsets_ds, H5T_NATIVE_INT64, offsets_.data(), 0, n_offsets, path_, "offsets");
    } catch (...) {
      H5Dclose(offsets_ds);
      throw;
    }
    H5Dclose(offsets_ds);

    DFLASH_USER_CHECK(n_offsets >= 1, "{}: dataset 'offsets' is empty; it needs n+1 entries starting with 0 (a dataset "
                 "of no sequences has offsets = [0])", path_);
    DFLASH_USER_CHECK(offsets_[0] == 0, "{}: dataset 'offsets': offsets[0] is {}, must be 0 (sequence 0 starts at the "
                 "first token); rewrite the offsets as cumulative lengths starting at 0", path_, offsets_[0]);
    for (int64_t i = 0; i + 1 < int64_t(n_offsets); ++i)
      DFLASH_USER_CHECK(offsets_[i + 1] >= offsets_[i], "{}: dataset 'offsets' is not monotone at sequence {}: "
                   "offsets[{}] = {} > offsets[{}] = {}; offsets must be non-decreasing cumulative lengths",
                   path_, i, i, offsets_[i], i + 1, offsets_[i + 1]);
    DFLASH_USER_CHECK(offsets_.back() == int64_t(n_tokens), "{}: dataset 'offsets' ends at {} (end of sequence {}) but "
                 "dataset 'tokens' has {} entries; the last offset must equal the number of tokens",
                 path_, offsets_.back(), size() - 1, n_tokens);
    if (n_mask != n_tokens) {
      int64_t first_bad = std::upper_bound(offsets_.begin(), offsets_.end(), int64_t(std::min(n_mask, n_tokens))) -
                          offsets_.begin() - 1;
      throw Error(fmt::format("{}: dataset 'loss_mask' has {} entries but 'tokens' has {} (first sequence without a "
                              "matching mask: {}); write one loss_mask value per token", path_, n_mask, n_tokens,
                              first_bad));
    }
    if (scan_tokens) scan([](const int32_t*, const uint8_t*, int64_t) {});
  } catch (...) {
    close_dataset(tokens_ds_), close_dataset(mask_ds_), close_file(file_);
    throw;
  }
}

Dataset::~Dataset() { close_dataset(tokens_ds_), close_dataset(mask_ds_), close_file(file_); }

int64_t Dataset::length(int64_t i) const {
  DFLASH_CHECK(i >= 0 && i < size(), "{}: sequence index {} out of range [0, {})", path_, i, size());
  return offsets_[i + 1] - offsets_[i];
}

// Checks token ids and mask values of the flat range [begin, begin + n); errors name the sequence.
void Dataset::check_values(const int32_t* tokens, const uint8_t* mask, int64_t begin, int64_t n) const {
  auto where = [&](int64_t k) {
    int64_t flat = begin + k;
    int64_t seq = std::upper_bound(offsets_.begin(), offsets_.end(), flat) - offsets_.begin() - 1;
    return fmt::format("sequence {} (token {} of {})", seq, flat - offsets_[seq], offsets_[seq + 1] - offsets_[seq]);
  };
  for (int64_t k = 0; k < n; ++k) {
    if (tokens[k] < 0)
      throw Error(fmt::format("{}: dataset 'tokens': {} has negative id {}; token ids must be in [0, vocab)", path_,
                              where(k), tokens[k]));
    if (vocab_ > 0 && tokens[k] >= vocab_)
      throw Error(fmt::format("{}: dataset 'tokens': {} has id {} >= vocab {}; the data was tokenized for another "
                              "model (re-tokenize with the target's tokenizer) or the vocab size is wrong",
                              path_, where(k), tokens[k], vocab_));
    if (mask[k] > 1)
      throw Error(fmt::format("{}: dataset 'loss_mask': {} has value {}; the mask must be 0 (context) or 1 "
                              "(trained)", path_, where(k), int(mask[k])));
  }
}

Sequence Dataset::read(int64_t i, int64_t max_len) const {
  int64_t len = length(i);
  if (max_len > 0) len = std::min(len, max_len);
  Sequence s;
  s.index = i;
  s.tokens.resize(len);
  s.loss_mask.resize(len);
  read_range(tokens_ds_, H5T_NATIVE_INT32, s.tokens.data(), offsets_[i], len, path_, "tokens");
  read_range(mask_ds_, H5T_NATIVE_UINT8, s.loss_mask.data(), offsets_[i], len, path_, "loss_mask");
  check_values(s.tokens.data(), s.loss_mask.data(), offsets_[i], len);
  return s;
}

DatasetStats Dataset::stats() const {
  DatasetStats st;
  st.sequences = size();
  st.tokens = total_tokens();
  for (int64_t i = 0; i < size(); ++i) {
    int64_t len = offsets_[i + 1] - offsets_[i];
    st.min_len = i == 0 ? len : std::min(st.min_len, len);
    st.max_len = std::max(st.max_len, len);
  }
  st.mean_len = size() > 0 ? double(st.tokens) / double(size()) : 0.0;
  scan([&](const int32_t* tok, const uint8_t* mask, int64_t n) {
    for (int64_t k = 0; k < n; ++k) {
      st.max_token = std::max(st.max_token, tok[k]);
      st.trained_tokens += mask[k];
    }
  });
  return st;
}

void Dataset::scan(const std::function<void(const int32_t*, const uint8_t*, int64_t)>& visit) const {
  std::vector<int32_t> tok;
  std::vector<uint8_t> mask;
  for (int64_t at = 0; at < total_tokens(); at += kScanChunk) {
    const int64_t n = std::min(kScanChunk, total_tokens() - at);
    tok.resize(n), mask.resize(n);
    read_range(tokens_ds_, H5T_NATIVE_INT32, tok.data(), at, n, path_, "tokens");
    read_range(mask_ds_, H5T_NATIVE_UINT8, mask.data(), at, n, path_, "loss_mask");
    check_values(tok.data(), mask.data(), at, n);
    visit(tok.data(), mask.data(), n);
  }
}

std::vector<int64_t> Dataset::order(int64_t epoch, uint64_t seed, bool shuffle) const {
  return shuffle_order(size(), epoch, seed, shuffle);
}

// ---------------------------------------------------------------- order and assignment

std::vector<int64_t> shuffle_order(int64_t n, int64_t epoch, uint64_t seed, bool shuffle) {
  std::vector<int64_t> order(size_t(std::max<int64_t>(n, 0)));
  std::iota(order.begin(), order.end(), int64_t(0));
  if (!shuffle) return order;
  // Own seed for the data stream ("data" tag), so no other Rng(seed, epoch) user draws the same numbers.
  Rng rng(mix64(seed ^ 0x64617461ULL), uint64_t(epoch));
  for (int64_t i = n - 1; i > 0; --i) std::swap(order[i], order[rng.below(uint64_t(i + 1))]);
  return order;
}

SequenceSchedule::SequenceSchedule(int64_t num_sequences, int drafter_dp, int micro_batches, uint64_t seed,
                                   bool shuffle, const std::string& dataset_name)
    : n_(num_sequences), dp_(drafter_dp), micro_(micro_batches), seed_(seed), shuffle_(shuffle) {
  DFLASH_CHECK(dp_ >= 1 && micro_ >= 1, "drafter_dp ({}) and micro_batches ({}) must be >= 1", dp_, micro_);
  steps_per_epoch_ = n_ / (int64_t(dp_) * micro_);
  DFLASH_USER_CHECK(steps_per_epoch_ >= 1, "{} has {} sequences, fewer than one step needs (layout.drafter_dp {} x "
               "optim.micro_batches {} = {}); add data or lower micro_batches", dataset_name, n_, dp_, micro_,
               int64_t(dp_) * micro_);
}

int64_t SequenceSchedule::sequence(int64_t step, int micro, int drafter_rank) const {
  DFLASH_CHECK(step >= 0 && micro >= 0 && micro < micro_ && drafter_rank >= 0 && drafter_rank < dp_,
               "SequenceSchedule::sequence(step {}, micro {}, rank {}) out of range (micro_batches {}, drafter_dp {})",
               step, micro, drafter_rank, micro_, dp_);
  int64_t epoch = epoch_of(step);
  if (epoch != cached_epoch_) {
    cached_order_ = shuffle_order(n_, epoch, seed_, shuffle_);
    cached_epoch_ = epoch;
  }
  int64_t slot = ((step % steps_per_epoch_) * micro_ + micro) * dp_ + drafter_rank;
  return cached_order_[size_t(slot)];
}

}  // namespace dflash::io
