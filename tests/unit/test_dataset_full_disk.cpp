// The dataset writer on a full disk, simulated in-process with a file-size limit (RLIMIT_FSIZE, SIGXFSZ ignored: a
// write past the limit fails with EFBIG): every failure point, from the first chunk to the last metadata block,
// is an Error naming the file, what was written and the OS error; no file stays behind, the process keeps
// working (HDF5 1.10 used to crash in H5Fclose, or at exit, after a failed close) and commit() leaves the target
// as it was. A truncated dataset is an error naming the file.
#include <doctest/doctest.h>

#include <sys/resource.h>

#include <cerrno>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include "lib/core/error.h"
#include "lib/io/dataset.h"
#include "test_util.h"

using namespace dflash;
using namespace dflash::io;
namespace fs = std::filesystem;

namespace {

// Runs fn with writes limited to `bytes` per file; returns the Error's message ("" when fn did not throw).
template <typename F>
std::string with_file_size_limit(rlim_t bytes, F&& fn) {
  rlimit old{};
  REQUIRE(::getrlimit(RLIMIT_FSIZE, &old) == 0);
  rlimit lim = old;
  lim.rlim_cur = std::min<rlim_t>(bytes, old.rlim_max);
  auto* old_handler = std::signal(SIGXFSZ, SIG_IGN);
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &lim) == 0);
  std::string error;
  try {
    fn();
  } catch (const Error& e) {
    error = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &old);  // before any CHECK can print
  std::signal(SIGXFSZ, old_handler);
  return error;
}

// 1.2 M tokens (one flush from add(), one from close()) that compress well: the file is about 60 KB.
void write_big(const std::string& path) {
  DatasetWriter w(path);
  std::vector<int32_t> tok(3000);
  std::vector<uint8_t> mask(3000);
  for (int i = 0; i < 400; ++i) {
    for (int t = 0; t < 3000; ++t) tok[t] = (t * 7 + i) % 1000, mask[t] = t % 5 != 0;
    w.add(tok, mask);
  }
  w.close();
}

std::string read_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

}  // namespace

TEST_CASE("dataset writer: a failed write anywhere is an error naming the file and the OS error, no file left") {
  const fs::path dir = test::scratch_dir("full_disk_every_point");
  const std::string ref = (dir / "ref.h5").string();
  write_big(ref);
  const auto size = rlim_t(fs::file_size(ref));
  REQUIRE(size > 20000);
  // limits through the whole file: the data chunks, the chunk index, the object headers, the superblock at the end
  std::vector<rlim_t> limits = {0, 1, 100, 2048, 4096};
  for (rlim_t l = 8192; l < size; l += size / 16) limits.push_back(l);
  for (rlim_t back : {4096, 1024, 512, 100, 1}) limits.push_back(size - back);
  for (rlim_t limit : limits) {
    CAPTURE(limit);
    const std::string path = (dir / "out.h5").string();
    const std::string error = with_file_size_limit(limit, [&] { write_big(path); });
    CHECK(error.find(path + ": ") == 0);
    CHECK(error.find("File too large") != std::string::npos);
    CHECK(error.find("errno 27") != std::string::npos);
    CHECK(error.find("the unfinished file was removed") != std::string::npos);
    CHECK_FALSE(fs::exists(path));
  }
  // the limit exactly at the file's size is enough: the same bytes are written
  const std::string exact = (dir / "exact.h5").string();
  CHECK(with_file_size_limit(size, [&] { write_big(exact); }).empty());
  CHECK(read_bytes(exact).size() == size);
  // HDF5 is still sound after all those failures: a new file writes and reads back
  Dataset d(exact, 1000);
  CHECK(d.size() == 400);
  CHECK(d.read(399).tokens[1] == (7 + 399) % 1000);
}

TEST_CASE("dataset writer: ENOSPC at each I/O call in turn, up to the metadata of H5Fclose and the fsync") {
  // a full disk fails whichever write comes next: fail the 1st, 2nd, ... I/O call until the file completes
  const fs::path dir = test::scratch_dir("full_disk_each_call");
  const std::string path = (dir / "out.h5").string();
  std::vector<int32_t> tok(3000);
  const auto write = [&](int64_t nth) {
    DatasetWriter w(path);
    w.fail_io_for_testing(nth, ENOSPC);
    for (int i = 0; i < 30; ++i) {
      for (int t = 0; t < 3000; ++t) tok[t] = (t * 13 + i) % 5000;
      w.add(tok);
    }
    w.close();
  };
  std::set<std::string> stages;
  int64_t nth = 1;
  for (; nth < 1000; ++nth) {
    CAPTURE(nth);
    std::string error;
    try {
      write(nth);
    } catch (const Error& e) {
      error = e.what();
    }
    if (error.empty()) break;  // nth is past the last I/O call: the file is complete
    CHECK(error.find(path + ": ") == 0);
    CHECK(error.find("No space left on device") != std::string::npos);
    CHECK(error.find("the disk is full") != std::string::npos);
    CHECK_FALSE(fs::exists(path));
    stages.insert(error.substr(path.size() + 2, error.find(" failed") - path.size() - 2));
  }
  CHECK(nth > 5);
  CHECK(stages.count("closing the file (writing the buffered chunks and metadata, fsync)") == 1);
  Dataset d(path, 5000);
  CHECK(d.size() == 30);
  CHECK(d.read(29).tokens[2] == (26 + 29) % 5000);
}

TEST_CASE("dataset writer: after a failure add and close refuse, the destructor is safe and removes the file") {
  const fs::path dir = test::scratch_dir("full_disk_after_failure");
  const std::string path = (dir / "x.h5").string();
  std::vector<int32_t> tok(3000, 3);
  SUBCASE("failure inside add (a flush of the write buffer)") {
    DatasetWriter w(path);
    const std::string error = with_file_size_limit(4096, [&] {
      for (int i = 0; i < 400; ++i) w.add(tok);
    });
    CHECK(error.find(path + ": writing dataset 'tokens'") == 0);
    CHECK(error.find("File too large") != std::string::npos);
    CHECK_FALSE(fs::exists(path));
    CHECK_THROWS_WITH_AS(w.add(tok), doctest::Contains("add() after a failed write"), Error);
    CHECK_THROWS_WITH_AS(w.close(), doctest::Contains("close() after a failed write"), Error);
  }  // the destructor of a failed writer: nothing to close twice, nothing to remove
  SUBCASE("destroyed without close") {
    {
      DatasetWriter w(path);
      w.add(tok);
      CHECK(fs::exists(path));
    }
    CHECK_FALSE(fs::exists(path));  // an unfinished dataset is never left behind
  }
  SUBCASE("a name it could not create is not removed") {
    fs::create_directories(path);  // a folder where the file should go: H5Fcreate fails (EISDIR)
    CHECK_THROWS_WITH_AS(DatasetWriter{path}, doctest::Contains("cannot create the HDF5 file: Is a directory"),
                         Error);
    CHECK(fs::is_directory(path));
  }
}

TEST_CASE("dataset writer: commit renames only a complete file, a failed one leaves the target unchanged") {
  const fs::path dir = test::scratch_dir("full_disk_commit");
  const std::string target = (dir / "out.h5").string(), partial = target + ".partial";
  write_dataset(target, {1, 2, 3}, {0, 1, 3}, {1, 1, 0});
  const std::string before = read_bytes(target);
  const std::string error = with_file_size_limit(20000, [&] {
    DatasetWriter w(partial);
    std::vector<int32_t> tok(3000);
    for (int i = 0; i < 400; ++i) {
      for (int t = 0; t < 3000; ++t) tok[t] = (t * 7 + i) % 1000;
      w.add(tok);
    }
    w.commit(target);
  });
  CHECK(error.find(partial + ": ") == 0);
  CHECK(error.find("File too large") != std::string::npos);
  CHECK_FALSE(fs::exists(partial));
  CHECK(read_bytes(target) == before);
  Dataset old(target, 10);
  CHECK(old.size() == 2);
  // and without a limit it replaces the target
  DatasetWriter w(partial);
  w.add({7, 8, 9, 9});
  w.commit(target);
  CHECK_FALSE(fs::exists(partial));
  Dataset now(target, 10);
  CHECK(now.size() == 1);
  CHECK(now.read(0).tokens == std::vector<int32_t>{7, 8, 9, 9});
}

TEST_CASE("dataset: a truncated file is an error naming the file, not a crash") {
  const fs::path dir = test::scratch_dir("full_disk_truncated");
  const std::string good = (dir / "good.h5").string(), path = (dir / "cut.h5").string();
  write_big(good);
  const auto size = fs::file_size(good);
  for (auto keep : {size / 2, size - 1, uintmax_t(600), uintmax_t(8)}) {
    CAPTURE(keep);
    fs::copy_file(good, path, fs::copy_options::overwrite_existing);
    fs::resize_file(path, keep);
    try {
      Dataset d(path, 1000);
      FAIL("a truncated file opened");
    } catch (const Error& e) {
      const std::string m = e.what();
      CHECK(m.find(path + ": ") == 0);
      CHECK((m.find("truncated") != std::string::npos || m.find("not an HDF5 file") != std::string::npos));
    }
  }
}
