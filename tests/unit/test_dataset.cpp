// The HDF5 dataset: round trip, one error per kind of corruption (each naming the file, dataset and sequence),
// the epoch shuffle and the assignment of sequences to drafter ranks.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <string>

#include <unistd.h>
#include <set>

#include <hdf5.h>

#include "lib/core/error.h"
#include "lib/io/dataset.h"

using namespace dflash;
using namespace dflash::io;
namespace fs = std::filesystem;

#define CHECK_HAS(text, part)                                                                                     \
  do {                                                                                                            \
    std::string text_ = (text);                                                                                   \
    CHECK_MESSAGE(text_.find(part) != std::string::npos, "'" << text_ << "'\n  should contain '" << (part) << "'"); \
  } while (0)

namespace {

// A folder of this process and test case, removed by the test case at its end.
fs::path temp_dir(const char* test) {
  fs::path d = fs::temp_directory_path() / (std::string("dflash_test_dataset_") + test + "_" + std::to_string(::getpid()));
  fs::create_directories(d);
  return d;
}

// Three sequences: lengths 4, 0 and 3.
const std::vector<int32_t> kTokens = {5, 6, 7, 8, 100, 101, 99};
const std::vector<int64_t> kOffsets = {0, 4, 4, 7};
const std::vector<uint8_t> kMask = {0, 0, 1, 1, 0, 1, 1};

std::string open_error(const std::string& path, int64_t vocab, bool scan = true) {
  try {
    Dataset d(path, vocab, scan);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// Writes the three datasets with raw HDF5 calls, so that a test can corrupt any of them.
void write_raw(const std::string& path, const std::vector<int32_t>& tokens, const std::vector<int64_t>* offsets,
               const std::vector<uint8_t>& mask) {
  hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  auto put = [&](const char* name, hid_t type, const void* data, hsize_t n) {
    hid_t space = H5Screate_simple(1, &n, nullptr);
    hid_t ds = H5Dcreate2(f, name, type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dwrite(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data);
    H5Dclose(ds);
    H5Sclose(space);
  };
  put("tokens", H5T_NATIVE_INT32, tokens.data(), tokens.size());
  if (offsets) put("offsets", H5T_NATIVE_INT64, offsets->data(), offsets->size());
  put("loss_mask", H5T_NATIVE_UINT8, mask.data(), mask.size());
  H5Fclose(f);
}

}  // namespace

TEST_CASE("dataset: write then read back every sequence, stats and truncation") {
  fs::path dir = temp_dir("roundtrip");
  std::string path = (dir / "roundtrip.h5").string();
  write_dataset(path, kTokens, kOffsets, kMask);
  Dataset d(path, 128);
  CHECK(d.size() == 3);
  CHECK(d.total_tokens() == 7);
  CHECK(d.offsets() == kOffsets);
  CHECK(d.length(0) == 4);
  CHECK(d.length(1) == 0);
  Sequence s0 = d.read(0);
  CHECK(s0.index == 0);
  CHECK(s0.tokens == std::vector<int32_t>{5, 6, 7, 8});
  CHECK(s0.loss_mask == std::vector<uint8_t>{0, 0, 1, 1});
  CHECK(d.read(1).tokens.empty());
  Sequence s2 = d.read(2);
  CHECK(s2.tokens == std::vector<int32_t>{100, 101, 99});
  CHECK(s2.loss_mask == std::vector<uint8_t>{0, 1, 1});
  CHECK(d.read(2, 2).tokens == std::vector<int32_t>{100, 101});  // max_len
  CHECK_THROWS_WITH_AS(d.read(3), doctest::Contains("sequence index 3 out of range [0, 3)"), Error);

  DatasetStats st = d.stats();
  CHECK(st.sequences == 3);
  CHECK(st.tokens == 7);
  CHECK(st.min_len == 0);
  CHECK(st.max_len == 4);
  CHECK(st.mean_len == doctest::Approx(7.0 / 3.0));
  CHECK(st.trained_tokens == 4);
  CHECK(st.max_token == 101);
  fs::remove_all(dir);
}

TEST_CASE("dataset: the streaming writer spans several flushes and HDF5 chunks") {
  fs::path dir = temp_dir("large");
  std::string path = (dir / "large.h5").string();
  const int n_seq = 700, len = 3001;  // 2.1M tokens: two writer flushes, ~130 HDF5 chunks
  {
    DatasetWriter w(path);
    std::vector<int32_t> tok(len);
    std::vector<uint8_t> mask(len);
    for (int i = 0; i < n_seq; ++i) {
      for (int t = 0; t < len; ++t) tok[t] = (i * 7 + t) % 50000, mask[t] = (t + i) % 3 == 0;
      w.add(tok, mask);
    }
    CHECK(w.sequences() == n_seq);
    CHECK(w.tokens() == int64_t(n_seq) * len);
    w.close();
  }
  Dataset d(path, 50000);
  CHECK(d.size() == n_seq);
  CHECK(d.total_tokens() == int64_t(n_seq) * len);
  for (int i : {0, 349, 350, 699}) {
    Sequence s = d.read(i);
    REQUIRE(s.tokens.size() == size_t(len));
    bool same = true;
    for (int t = 0; t < len; ++t) same &= s.tokens[t] == (i * 7 + t) % 50000 && s.loss_mask[t] == ((t + i) % 3 == 0);
    CHECK_MESSAGE(same, "sequence " << i);
  }
  fs::remove_all(dir);
}

TEST_CASE("dataset: every corruption is an error naming the file, the dataset and the sequence") {
  fs::path dir = temp_dir("corrupt");
  std::string good = (dir / "good.h5").string();
  write_dataset(good, kTokens, kOffsets, kMask);

  SUBCASE("token id >= vocab names the sequence and the token") {
    std::string e = open_error(good, 101);
    CHECK_HAS(e, good + ": dataset 'tokens': sequence 2 (token 1 of 3) has id 101 >= vocab 101");
    CHECK_HAS(e, "re-tokenize");
    // without the scan on open, reading that sequence reports the same
    Dataset lazy(good, 101, false);
    CHECK(lazy.read(0).tokens.size() == 4);
    CHECK_THROWS_WITH_AS(lazy.read(2), doctest::Contains("sequence 2 (token 1 of 3) has id 101 >= vocab 101"), Error);
  }
  SUBCASE("negative token id") {
    std::string p = (dir / "negative.h5").string();
    std::vector<int32_t> t = kTokens;
    t[5] = -3;
    write_raw(p, t, &kOffsets, kMask);
    CHECK_HAS(open_error(p, 0), "dataset 'tokens': sequence 2 (token 1 of 3) has negative id -3");
  }
  SUBCASE("loss_mask value other than 0/1") {
    std::string p = (dir / "mask2.h5").string();
    std::vector<uint8_t> m = kMask;
    m[1] = 2;
    write_raw(p, kTokens, &kOffsets, m);
    CHECK_HAS(open_error(p, 128), "dataset 'loss_mask': sequence 0 (token 1 of 4) has value 2");
  }
  SUBCASE("non-monotone offsets") {
    std::string p = (dir / "nonmonotone.h5").string();
    std::vector<int64_t> o = {0, 4, 2, 7};
    write_raw(p, kTokens, &o, kMask);
    CHECK_HAS(open_error(p, 128), p + ": dataset 'offsets' is not monotone at sequence 1: offsets[1] = 4 > offsets[2] = 2");
  }
  SUBCASE("offsets not starting at 0") {
    std::string p = (dir / "offset0.h5").string();
    std::vector<int64_t> o = {1, 4, 4, 7};
    write_raw(p, kTokens, &o, kMask);
    CHECK_HAS(open_error(p, 128), "dataset 'offsets': offsets[0] is 1, must be 0");
  }
  SUBCASE("last offset != number of tokens") {
    std::string p = (dir / "lastoffset.h5").string();
    std::vector<int64_t> o = {0, 4, 4, 6};
    write_raw(p, kTokens, &o, kMask);
    CHECK_HAS(open_error(p, 128), "dataset 'offsets' ends at 6 (end of sequence 2) but dataset 'tokens' has 7 entries");
  }
  SUBCASE("loss_mask length != tokens length") {
    std::string p = (dir / "masklen.h5").string();
    std::vector<uint8_t> m(kMask.begin(), kMask.begin() + 5);
    write_raw(p, kTokens, &kOffsets, m);
    CHECK_HAS(open_error(p, 128),
              p + ": dataset 'loss_mask' has 5 entries but 'tokens' has 7 (first sequence without a matching mask: 2)");
  }
  SUBCASE("missing dataset") {
    std::string p = (dir / "nooffsets.h5").string();
    write_raw(p, kTokens, nullptr, kMask);
    std::string e = open_error(p, 128);
    CHECK_HAS(e, p + ": dataset 'offsets' is missing");
    CHECK_HAS(e, "data/README.md");
  }
  SUBCASE("not a file, not HDF5") {
    CHECK_HAS(open_error((dir / "absent.h5").string(), 128), "absent.h5: no such file");
    std::string p = (dir / "text.h5").string();
    FILE* f = std::fopen(p.c_str(), "w");
    std::fputs("not hdf5\n", f);
    std::fclose(f);
    CHECK_HAS(open_error(p, 128), p + ": not an HDF5 file");
  }
  SUBCASE("writer into a missing folder") {
    CHECK_THROWS_WITH_AS(DatasetWriter((dir / "no" / "such" / "x.h5").string()),
                         doctest::Contains("cannot create the HDF5 file"), Error);
  }
  fs::remove_all(dir);
}

TEST_CASE("dataset: epoch shuffle is a deterministic permutation, ranks get slot j % drafter_dp") {
  const int64_t n = 1000;
  auto a = shuffle_order(n, 3, 42);
  CHECK(a == shuffle_order(n, 3, 42));  // deterministic
  std::vector<int64_t> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < n; ++i) REQUIRE(sorted[i] == i);  // a permutation
  CHECK(a != shuffle_order(n, 4, 42));                        // another epoch
  CHECK(a != shuffle_order(n, 3, 43));                        // another seed
  int64_t fixed = 0;
  for (int64_t i = 0; i < n; ++i) fixed += a[i] == i;
  CHECK(fixed < 10);  // a uniform permutation has ~1 fixed point
  auto plain = shuffle_order(5, 3, 42, false);
  CHECK(plain == std::vector<int64_t>{0, 1, 2, 3, 4});
  CHECK(shuffle_order(0, 0, 1).empty());

  // 10 sequences, 3 drafter ranks, 1 micro-batch: 3 steps per epoch, one sequence of the order skipped
  SequenceSchedule sched(10, 3, 1, 42, true);
  CHECK(sched.steps_per_epoch() == 3);
  auto order0 = shuffle_order(10, 0, 42), order1 = shuffle_order(10, 1, 42);
  for (int step = 0; step < 3; ++step)
    for (int r = 0; r < 3; ++r) CHECK(sched.sequence(step, 0, r) == order0[step * 3 + r]);
  CHECK(sched.epoch_of(3) == 1);
  CHECK(sched.sequence(3, 0, 2) == order1[2]);
  std::set<int64_t> epoch0;
  for (int step = 0; step < 3; ++step)
    for (int r = 0; r < 3; ++r) epoch0.insert(sched.sequence(step, 0, r));
  CHECK(epoch0.size() == 9);  // no sequence twice in an epoch

  // 2 micro-batches: step s, micro m, rank r uses slot (s*2 + m)*3 + r
  SequenceSchedule mb(12, 3, 2, 7, false);
  CHECK(mb.steps_per_epoch() == 2);
  CHECK(mb.sequence(1, 1, 2) == (1 * 2 + 1) * 3 + 2);
  CHECK_THROWS_WITH_AS(SequenceSchedule(2, 3, 1, 0, true, "tiny.h5"),
                       doctest::Contains("tiny.h5 has 2 sequences, fewer than one step needs"), Error);
}
