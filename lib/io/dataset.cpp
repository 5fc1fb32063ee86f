#include "lib/io/dataset.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iterator>
#include <limits>
#include <numeric>
#include <type_traits>
#include <utility>

#include <hdf5.h>
#if H5_VERSION_GE(1, 13, 2)
#include <H5FDdevelop.h>  // H5FD_class_t moved here in HDF5 1.14
#endif

#include "lib/core/atomic_file.h"
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
  if (e->desc && *e->desc) {
    std::string d = e->desc;
    std::replace(d.begin(), d.end(), '\n', ' ');  // the sec2 driver's messages hold a ctime() line break
    descs->push_back(std::move(d));
  }
  return 0;
}

// The outermost and innermost messages of HDF5's error stack ("unable to open file: file signature not found");
// when a driver message carries the OS error ("errno = 5, error message = 'Input/output error'"), that text
// instead of the innermost message. Clears the stack.
std::string hdf5_detail() {
  std::vector<std::string> descs;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect_error, &descs);
  H5Eclear2(H5E_DEFAULT);
  if (descs.empty()) return "HDF5 gave no detail";
  for (const std::string& d : descs) {
    const size_t at = d.find("error message = '");
    if (at == std::string::npos) continue;
    const size_t begin = at + 17, stop = d.find('\'', begin);
    return descs.front() + ": " + d.substr(begin, stop == std::string::npos ? std::string::npos : stop - begin);
  }
  if (descs.size() == 1 || descs.front() == descs.back()) return descs.front();
  return descs.front() + ": " + descs.back();
}

// Throws with the file name and HDF5's reason when an HDF5 call returned a negative value.
template <typename... A>
void h5check(int64_t status, const std::string& path, fmt::format_string<A...> what, A&&... args) {
  if (status < 0)
    throw Error(fmt::format("{}: {} ({})", path, fmt::format(what, std::forward<A>(args)...), hdf5_detail()));
}

// Closes an HDF5 identifier once: the variable is invalidated first, so no path closes it twice, and a failed
// close is not retried (after a failed H5Fclose HDF5 has already freed the file; a second close would crash).
// The result is ignored: this is for cleanup after another error, or for read-only handles.
void close_quietly(int64_t& id, herr_t (*close)(hid_t)) noexcept {
  const hid_t h = id;
  id = -1;
  if (h >= 0 && close(h) < 0) H5Eclear2(H5E_DEFAULT);
}

// A temporary HDF5 identifier (dataspace, property list, type, dataset) closed at the end of its scope.
class H5Handle {
 public:
  H5Handle(hid_t id, herr_t (*close)(hid_t)) noexcept : id_(id), close_(close) {}
  ~H5Handle() { close_quietly(id_, close_); }
  H5Handle(const H5Handle&) = delete;
  H5Handle& operator=(const H5Handle&) = delete;
  hid_t get() const { return id_; }
  hid_t release() noexcept {  // the caller owns it now
    const hid_t h = id_;
    id_ = -1;
    return h;
  }

 private:
  int64_t id_;
  herr_t (*close_)(hid_t);
};

// Reads n elements from position `at` of a 1-D dataset, converted to `mem_type`.
void read_range(int64_t ds, hid_t mem_type, void* out, hsize_t at, hsize_t n, const std::string& path,
                const char* name) {
  if (n == 0) return;
  hsize_t start[1] = {at}, count[1] = {n};
  H5Handle fspace(H5Dget_space(ds), H5Sclose);
  h5check(fspace.get(), path, "cannot get the dataspace of dataset '{}'", name);
  h5check(H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start, nullptr, count, nullptr), path,
          "cannot select elements [{}, {}) of dataset '{}'", at, at + n, name);
  H5Handle mspace(H5Screate_simple(1, count, nullptr), H5Sclose);
  h5check(mspace.get(), path, "cannot create a dataspace of {} elements", n);
  h5check(H5Dread(ds, mem_type, mspace.get(), fspace.get(), H5P_DEFAULT, out), path,
          "cannot read elements [{}, {}) of dataset '{}' (file truncated or corrupt?)", at, at + n, name);
}

// Opens a 1-D integer dataset and returns its length.
int64_t open_dataset(int64_t file, const char* name, const std::string& path, hsize_t* length) {
  const htri_t exists = H5Lexists(file, name, H5P_DEFAULT);
  h5check(exists, path, "cannot look up dataset '{}' (file truncated or corrupt?)", name);
  if (exists == 0) throw Error(fmt::format("{}: dataset '{}' is missing; {}", path, name, kFormatHint));
  H5Handle ds(H5Dopen2(file, name, H5P_DEFAULT), H5Dclose);
  h5check(ds.get(), path, "cannot open dataset '{}' (file truncated or corrupt?)", name);
  H5Handle type(H5Dget_type(ds.get()), H5Tclose);
  h5check(type.get(), path, "cannot read the type of dataset '{}'", name);
  const H5T_class_t cls = H5Tget_class(type.get());
  H5Handle space(H5Dget_space(ds.get()), H5Sclose);
  h5check(space.get(), path, "cannot read the shape of dataset '{}'", name);
  const int rank = H5Sget_simple_extent_ndims(space.get());
  h5check(rank, path, "cannot read the shape of dataset '{}'", name);
  hsize_t dims[1] = {0};
  if (rank == 1) h5check(H5Sget_simple_extent_dims(space.get(), dims, nullptr), path,
                         "cannot read the shape of dataset '{}'", name);
  if (cls != H5T_INTEGER || rank != 1)
    throw Error(fmt::format("{}: dataset '{}' must be a 1-D integer array, found {} dimension(s) of {} values; {}",
                            path, name, rank, cls == H5T_INTEGER ? "integer" : "non-integer", kFormatHint));
  *length = dims[0];
  return ds.release();
}

// ---------------------------------------------------------------- the writer's file driver
//
// Why the writer has its own driver: in HDF5 1.10 (Debian's) a failed H5Fclose frees the file's memory but keeps
// its ID, and the library's exit handler closes that ID again and crashes (HDF5 issue #2257 / CVE-2020-10812; our
// destructor's second H5Fclose crashed the same way). A full disk or a file-size limit makes H5Fclose fail,
// because closing writes the chunk and metadata caches. So the writer's I/O goes through this small POSIX driver
// (the default driver's behaviour: pread / pwrite / ftruncate on one descriptor), which records the first failed
// OS call and its errno and from then on drops writes. HDF5 never sees an I/O failure, every handle closes
// cleanly, and the writer reports the recorded error and removes the file. Nothing of the driver is stored in the
// file (no driver info block): the files are exactly the default driver's, read back with it.

}  // namespace

struct DatasetWriter::IoState {
  int err = 0;         // errno of the first failed write / truncate / fsync / close; 0 = none
  std::string op;      // what it was ("writing 65536 bytes at offset 1048576")
  int open_err = 0;    // errno of the last failed open (H5Fcreate's error)
  int64_t inject_in = 0;  // tests: > 0 = the inject_in-th I/O call from now fails with inject_err
  int inject_err = 0;
  // The OS call's errno, or the injected one when this call is the one a test chose to fail.
  int injected(int real) {
    if (inject_in > 0 && --inject_in == 0) return inject_err;
    return real;
  }
};

namespace {

using IoState = DatasetWriter::IoState;

struct DriverInfo {  // the file-access property: where the driver reports (copied by HDF5 through fapl_copy)
  std::shared_ptr<IoState> io;
};

struct PosixFile {
  H5FD_t pub;  // HDF5's part; must come first
  int fd = -1;
  haddr_t eoa = 0, eof = 0;
  dev_t dev = 0;
  ino_t ino = 0;
  bool written = false;  // something was written: fsync on close
  std::shared_ptr<IoState> io;
};

void record(IoState& io, int err, std::string op) {
  if (io.err != 0) return;  // the first failure is the cause; later ones follow from it
  io.err = err;
  io.op = std::move(op);
}

void* driver_fapl_copy(const void* info) {
  try {
    return new DriverInfo(*static_cast<const DriverInfo*>(info));
  } catch (...) {
    return nullptr;
  }
}
herr_t driver_fapl_free(void* info) {
  delete static_cast<DriverInfo*>(info);
  return 0;
}
void* driver_fapl_get(H5FD_t* file) {
  try {
    return new DriverInfo{reinterpret_cast<PosixFile*>(file)->io};
  } catch (...) {
    return nullptr;
  }
}

H5FD_t* driver_open(const char* name, unsigned flags, hid_t fapl, haddr_t maxaddr) {
  const auto* info = static_cast<const DriverInfo*>(H5Pget_driver_info(fapl));
  if (!info || !info->io || !name || !*name) return nullptr;
  int o_flags = (H5F_ACC_RDWR & flags) ? O_RDWR : O_RDONLY;
  if (H5F_ACC_TRUNC & flags) o_flags |= O_TRUNC;
  if (H5F_ACC_CREAT & flags) o_flags |= O_CREAT;
  if (H5F_ACC_EXCL & flags) o_flags |= O_EXCL;
  const int fd = ::open(name, o_flags | O_CLOEXEC, 0666);
  if (fd < 0) {
    info->io->open_err = errno;  // H5Fcreate first probes the name without O_CREAT: not a sticky failure
    return nullptr;
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    info->io->open_err = errno;
    ::close(fd);
    return nullptr;
  }
  info->io->open_err = 0;  // a later H5Fcreate failure is then not an open failure
  PosixFile* f = nullptr;
  try {
    f = new PosixFile();
  } catch (...) {
    ::close(fd);
    return nullptr;
  }
  std::memset(&f->pub, 0, sizeof(f->pub));
  f->fd = fd;
  f->eof = haddr_t(st.st_size);
  f->dev = st.st_dev;
  f->ino = st.st_ino;
  f->io = info->io;
  return &f->pub;
}

herr_t driver_close(H5FD_t* file) {
  auto* f = reinterpret_cast<PosixFile*>(file);
  IoState& io = *f->io;
  if (f->written && io.err == 0) {
    const int err = io.injected(::fsync(f->fd) != 0 ? errno : 0);
    if (err != 0) record(io, err, "syncing the file to disk (fsync)");
  }
  if (::close(f->fd) != 0) record(io, errno, "closing the file descriptor");
  delete f;
  return 0;
}

int driver_cmp(const H5FD_t* a, const H5FD_t* b) {
  const auto* f1 = reinterpret_cast<const PosixFile*>(a);
  const auto* f2 = reinterpret_cast<const PosixFile*>(b);
  if (f1->dev != f2->dev) return f1->dev < f2->dev ? -1 : 1;
  if (f1->ino != f2->ino) return f1->ino < f2->ino ? -1 : 1;
  return 0;
}

herr_t driver_query(const H5FD_t*, unsigned long* flags) {
  if (flags)  // what the default (sec2) driver allows: metadata aggregation / accumulation, data sieving
    *flags = H5FD_FEAT_AGGREGATE_METADATA | H5FD_FEAT_ACCUMULATE_METADATA | H5FD_FEAT_DATA_SIEVE |
             H5FD_FEAT_AGGREGATE_SMALLDATA;
  return 0;
}

haddr_t driver_get_eoa(const H5FD_t* file, H5FD_mem_t) { return reinterpret_cast<const PosixFile*>(file)->eoa; }
herr_t driver_set_eoa(H5FD_t* file, H5FD_mem_t, haddr_t addr) {
  reinterpret_cast<PosixFile*>(file)->eoa = addr;
  return 0;
}
haddr_t driver_get_eof(const H5FD_t* file, H5FD_mem_t) { return reinterpret_cast<const PosixFile*>(file)->eof; }
herr_t driver_get_handle(H5FD_t* file, hid_t, void** handle) {
  if (!handle) return -1;
  *handle = &reinterpret_cast<PosixFile*>(file)->fd;
  return 0;
}

herr_t driver_read(H5FD_t* file, H5FD_mem_t, hid_t, haddr_t addr, size_t size, void* buf) {
  auto* f = reinterpret_cast<PosixFile*>(file);
  auto* out = static_cast<char*>(buf);
  while (size > 0) {
    const ssize_t n = ::pread(f->fd, out, size, off_t(addr));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) record(*f->io, errno, fmt::format("reading {} bytes at offset {}", size, addr));
    if (n <= 0) {  // past the end of the file (or after an error): zeros, as the default driver gives
      std::memset(out, 0, size);
      break;
    }
    size -= size_t(n), addr += haddr_t(n), out += n;
  }
  return 0;
}

herr_t driver_write(H5FD_t* file, H5FD_mem_t, hid_t, haddr_t addr, size_t size, const void* buf) {
  auto* f = reinterpret_cast<PosixFile*>(file);
  if (f->io->err != 0) return 0;  // the file is lost already: drop the write, let HDF5 finish consistently
  const auto* in = static_cast<const char*>(buf);
  const haddr_t first = addr;
  const size_t total = size;
  if (const int err = f->io->injected(0); err != 0) {
    record(*f->io, err, fmt::format("writing {} bytes at offset {}", total, first));
    return 0;
  }
  while (size > 0) {
    const ssize_t n = ::pwrite(f->fd, in, size, off_t(addr));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      record(*f->io, n < 0 ? errno : EIO, fmt::format("writing {} bytes at offset {}", total, first));
      return 0;
    }
    size -= size_t(n), addr += haddr_t(n), in += n;
  }
  f->written = true;
  f->eof = std::max(f->eof, addr);
  return 0;
}

herr_t driver_truncate(H5FD_t* file, hid_t, hbool_t) {
  auto* f = reinterpret_cast<PosixFile*>(file);
  if (f->eoa == f->eof) return 0;
  if (f->io->err == 0) {
    const int err = f->io->injected(::ftruncate(f->fd, off_t(f->eoa)) != 0 ? errno : 0);
    if (err != 0) record(*f->io, err, fmt::format("setting the file size to {} bytes (ftruncate)", f->eoa));
    f->written = true;
  }
  f->eof = f->eoa;
  return 0;
}

// The driver's ID, registered on first use (again if the library was closed and reopened meanwhile).
hid_t writer_driver() {
  static hid_t id = H5I_INVALID_HID;
  if (id >= 0 && H5Iis_valid(id) > 0) return id;
  H5FD_class_t cls;
  std::memset(&cls, 0, sizeof(cls));
#ifdef H5FD_CLASS_VERSION
  cls.version = H5FD_CLASS_VERSION;
  cls.value = H5FD_class_value_t(H5_VFD_RESERVED + 173);  // a private driver: any value above the reserved ones
#endif
  cls.name = "dflash_writer";
  cls.maxaddr = haddr_t(std::numeric_limits<off_t>::max());
  cls.fc_degree = H5F_CLOSE_WEAK;
  cls.fapl_size = sizeof(DriverInfo);
  cls.fapl_get = driver_fapl_get;
  cls.fapl_copy = driver_fapl_copy;
  cls.fapl_free = driver_fapl_free;
  cls.open = driver_open;
  cls.close = driver_close;
  cls.cmp = driver_cmp;
  cls.query = driver_query;
  cls.get_eoa = driver_get_eoa;
  cls.set_eoa = driver_set_eoa;
  cls.get_eof = driver_get_eof;
  cls.get_handle = driver_get_handle;
  cls.read = driver_read;
  cls.write = driver_write;
  cls.truncate = driver_truncate;
  const H5FD_mem_t map[H5FD_MEM_NTYPES] = H5FD_FLMAP_DICHOTOMY;
  std::copy(std::begin(map), std::end(map), std::begin(cls.fl_map));
  id = H5FDregister(&cls);
  return id;
}

// What a failed OS call means for the user.
const char* io_hint(int err) {
  switch (err) {
    case ENOSPC: return "the disk is full: free space, or write to another file system";
    case EDQUOT: return "the disk quota is exhausted: free space, or write to another file system";
    case EFBIG: return "the file outgrew the file-size limit (ulimit -f) or the file system's largest file";
    case EIO: return "the disk or file server reported an I/O error";
    case EROFS: return "the file system is read-only";
    default: return nullptr;
  }
}

std::string parent_dir(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

}  // namespace

// ---------------------------------------------------------------- writer

DatasetWriter::DatasetWriter(const std::string& path) : path_(path), io_(std::make_shared<IoState>()) {
  quiet_hdf5();
  const hid_t driver = writer_driver();
  h5check(driver, path_, "cannot register the writer's HDF5 file driver");
  H5Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  h5check(fapl.get(), path_, "cannot create a file-access property list");
  const DriverInfo info{io_};
  h5check(H5Pset_driver(fapl.get(), driver, &info), path_, "cannot select the writer's HDF5 file driver");
  file_ = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get());
  if (file_ < 0) {
    const std::string detail = hdf5_detail();
    throw Error(fmt::format("{}: cannot create the HDF5 file: {} (does the folder exist and is it writable?)", path_,
                            io_->open_err ? std::strerror(io_->open_err) : detail));
  }
  created_ = true;
  // From here every failure goes through check(), which closes what is open and removes the file before it throws
  // (a constructor that throws gets no destructor call).
  const auto create = [&](int64_t& ds, const char* name, hid_t type, hsize_t chunk) {
    const std::string what = fmt::format("creating dataset '{}'", name);
    hsize_t dims[1] = {0}, maxdims[1] = {H5S_UNLIMITED}, chunks[1] = {chunk};
    H5Handle space(H5Screate_simple(1, dims, maxdims), H5Sclose);
    check(space.get(), what);
    H5Handle plist(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
    check(plist.get(), what);
    check(H5Pset_chunk(plist.get(), 1, chunks), what);
    check(H5Pset_deflate(plist.get(), 4), what);
    ds = H5Dcreate2(file_, name, type, space.get(), H5P_DEFAULT, plist.get(), H5P_DEFAULT);
    check(ds, what);
  };
  create(tokens_ds_, "tokens", H5T_STD_I32LE, kTokenChunk);
  create(offsets_ds_, "offsets", H5T_STD_I64LE, kOffsetChunk);
  create(mask_ds_, "loss_mask", H5T_STD_U8LE, kTokenChunk);
}

DatasetWriter::~DatasetWriter() noexcept {
  if (!closed_) abandon();
}

void DatasetWriter::abandon() noexcept {
  // datasets before the file: with the weak close degree the file only really closes once nothing in it is open
  close_quietly(tokens_ds_, H5Dclose);
  close_quietly(offsets_ds_, H5Dclose);
  close_quietly(mask_ds_, H5Dclose);
  close_quietly(file_, H5Fclose);
  if (created_) {
    std::error_code ec;
    std::filesystem::remove(path_, ec);  // only the file this writer created
    created_ = false;
  }
  failed_ = true;
}

void DatasetWriter::check(int64_t status, const std::string& what) {
  if (status >= 0 && io_->err == 0) return;
  std::string message;
  if (io_->err != 0) {
    const char* hint = io_hint(io_->err);
    message = fmt::format("{}: {} failed: {} ({}, errno {}){}{}", path_, what, std::strerror(io_->err), io_->op,
                          io_->err, hint ? "; " : "", hint ? hint : "");
    H5Eclear2(H5E_DEFAULT);
  } else {
    message = fmt::format("{}: {} failed ({})", path_, what, hdf5_detail());
  }
  const bool had_file = created_;
  abandon();
  throw Error(had_file ? message + "; the unfinished file was removed" : message);
}

void DatasetWriter::add(const int32_t* tokens, const uint8_t* loss_mask, int64_t n) {
  DFLASH_USER_CHECK(!failed_, "{}: add() after a failed write (the file was removed)", path_);
  DFLASH_CHECK(!closed_, "{}: add() after close()", path_);
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

// Appends n elements of `mem_type` at position `at` of a 1-D extendible dataset.
void DatasetWriter::append(int64_t ds, int64_t mem_type, const void* data, uint64_t at, uint64_t n,
                           const char* name) {
  if (n == 0) return;
  const std::string what = fmt::format("writing dataset '{}' (elements [{}, {}))", name, at, at + n);
  hsize_t new_size[1] = {at + n}, start[1] = {at}, count[1] = {n};
  check(H5Dset_extent(ds, new_size), what);
  H5Handle fspace(H5Dget_space(ds), H5Sclose);
  check(fspace.get(), what);
  check(H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start, nullptr, count, nullptr), what);
  H5Handle mspace(H5Screate_simple(1, count, nullptr), H5Sclose);
  check(mspace.get(), what);
  check(H5Dwrite(ds, mem_type, mspace.get(), fspace.get(), H5P_DEFAULT, data), what);
}

void DatasetWriter::flush() {
  append(tokens_ds_, H5T_NATIVE_INT32, tokens_buf_.data(), flushed_tokens_, tokens_buf_.size(), "tokens");
  append(mask_ds_, H5T_NATIVE_UINT8, mask_buf_.data(), flushed_tokens_, mask_buf_.size(), "loss_mask");
  append(offsets_ds_, H5T_NATIVE_INT64, offsets_buf_.data(), offsets_written_, offsets_buf_.size(), "offsets");
  flushed_tokens_ += int64_t(tokens_buf_.size());
  offsets_written_ += int64_t(offsets_buf_.size());
  tokens_buf_.clear();
  mask_buf_.clear();
  offsets_buf_.clear();
}

void DatasetWriter::close() {
  if (closed_) return;
  DFLASH_USER_CHECK(!failed_, "{}: close() after a failed write (the file was removed)", path_);
  flush();
  // Each handle is invalidated before its close and never closed again, whatever the close returns.
  for (auto [ds, name] : {std::pair{&tokens_ds_, "tokens"}, {&offsets_ds_, "offsets"}, {&mask_ds_, "loss_mask"}}) {
    const hid_t h = *ds;
    *ds = -1;
    check(H5Dclose(h), fmt::format("closing dataset '{}' (writing its buffered chunks)", name));
  }
  const hid_t f = file_;
  file_ = -1;
  check(H5Fclose(f), "closing the file (writing the buffered chunks and metadata, fsync)");
  closed_ = true;
}

void DatasetWriter::fail_io_for_testing(int64_t nth, int err) {
  io_->inject_in = nth;
  io_->inject_err = err;
}

void DatasetWriter::commit(const std::string& final_path) {
  close();
  if (::rename(path_.c_str(), final_path.c_str()) != 0) {
    const int err = errno;
    std::error_code ec;
    std::filesystem::remove(path_, ec);
    created_ = false;
    throw Error(fmt::format("{}: cannot rename to {}: {}; {} was removed, {} is unchanged", path_, final_path,
                            std::strerror(err), path_, final_path));
  }
  created_ = false;  // the file is final_path's now
  fsync_path(parent_dir(final_path), true);
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
  const htri_t is_hdf5 = H5Fis_hdf5(path.c_str());
  if (is_hdf5 < 0) {
    const std::string detail = hdf5_detail();
    throw Error(fmt::format("{}: cannot read the file ({}); is it readable?", path, detail));
  }
  if (is_hdf5 == 0) throw Error(fmt::format("{}: not an HDF5 file; {}", path, kFormatHint));
  // Read-only opens without HDF5's file locking: every rank reads the file at once, and on Lustre or NFS mounts
  // without flock support HDF5's default locking fails the open ("unable to lock file") or blocks. Readers never
  // need it (nothing writes a training file while a job reads it). HDF5_USE_FILE_LOCKING in the environment still
  // takes precedence (docs/running.md).
  {
    H5Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
    h5check(fapl.get(), path_, "cannot create a file-access property list");
    h5check(H5Pset_file_locking(fapl.get(), false, true), path_, "cannot turn off HDF5 file locking");
    file_ = H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get());
    if (file_ < 0) {  // the detail before H5Pclose: every HDF5 call clears the error stack
      const std::string detail = hdf5_detail();
      throw Error(fmt::format("{}: cannot open the HDF5 file ({}); if it is truncated or damaged, make it again",
                              path_, detail));
    }
  }
  try {
    hsize_t n_tokens = 0, n_offsets = 0, n_mask = 0;
    tokens_ds_ = open_dataset(file_, "tokens", path_, &n_tokens);
    mask_ds_ = open_dataset(file_, "loss_mask", path_, &n_mask);
    {
      H5Handle offsets_ds(open_dataset(file_, "offsets", path_, &n_offsets), H5Dclose);
      offsets_.resize(n_offsets);
      read_range(offsets_ds.get(), H5T_NATIVE_INT64, offsets_.data(), 0, n_offsets, path_, "offsets");
    }

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
    close_quietly(tokens_ds_, H5Dclose), close_quietly(mask_ds_, H5Dclose), close_quietly(file_, H5Fclose);
    throw;
  }
}

// Read-only handles: closing them writes nothing, so a failure here has no consequence worth reporting.
Dataset::~Dataset() {
  close_quietly(tokens_ds_, H5Dclose), close_quietly(mask_ds_, H5Dclose), close_quietly(file_, H5Fclose);
}

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
