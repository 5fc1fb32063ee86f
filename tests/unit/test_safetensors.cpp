// safetensors: round trip of every dtype, row/column slices, index-based checkpoints, bf16/f16 rounding, and one
// corrupted file per header rule, each with the error it must give.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "test_util.h"
#include "lib/core/error.h"
#include "lib/core/rng.h"
#include "lib/io/safetensors.h"
#include "lib/model/random_target.h"

namespace fs = std::filesystem;
using namespace dflash;
using namespace dflash::io;

namespace {

fs::path temp_dir(const std::string& name) { return dflash::test::scratch_dir(name); }

// a file with this exact header text and data section
std::string write_raw(const fs::path& path, const std::string& header, size_t data_bytes) {
  std::ofstream f(path, std::ios::binary);
  uint64_t n = header.size();
  f.write(reinterpret_cast<const char*>(&n), 8);
  f << header;
  f << std::string(data_bytes, '\0');
  return path.string();
}

// the error message opening `path` gives ("" if it opens)
std::string open_error(const std::string& path) {
  try {
    SafetensorsFile f(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("safetensors: round trip of F32, BF16 and F16 with row and column slices") {
  const fs::path dir = temp_dir("roundtrip");
  const int R = 7, C = 5;
  std::vector<float> a(R * C), b(R * C), c(13);
  Rng rng(3);
  for (auto& x : a) x = float(rng.normal());
  for (auto& x : b) x = float(rng.normal());
  for (auto& x : c) x = float(rng.normal() * 100);
  const std::string path = (dir / "t.safetensors").string();
  write_safetensors(path,
                    {tensor_from("a", DType::F32, {R, C}, a.data()), tensor_from("b", DType::BF16, {R, C}, b.data()),
                     tensor_from("c", DType::F16, {13}, c.data()), tensor_from("empty", DType::F32, {0, 4}, nullptr)},
                    {{"format", "pt"}});
  SafetensorsFile f(path);
  CHECK(f.names() == std::vector<std::string>{"a", "b", "c", "empty"});
  CHECK(f.metadata().at("format") == "pt");
  CHECK(f.info("b").dtype == DType::BF16);
  CHECK(f.info("b").shape == std::vector<int64_t>{R, C});
  CHECK(f.read("a") == a);  // F32 is exact
  const auto rb = f.read("b");
  for (int i = 0; i < R * C; ++i) {
    CHECK(rb[i] == bf16_to_float(float_to_bf16(b[i])));
    CHECK(std::fabs(rb[i] - b[i]) <= std::ldexp(std::fabs(b[i]), -8));  // within half a bf16 ulp
  }
  const auto rc = f.read("c");
  for (int i = 0; i < 13; ++i) CHECK(rc[i] == f16_to_float(float_to_f16(c[i])));
  CHECK(f.read("empty").empty());

  std::vector<float> rows(2 * C), cols(R * 2);
  f.read_rows("a", 3, 5, rows.data());
  for (int j = 0; j < 2 * C; ++j) CHECK(rows[j] == a[3 * C + j]);
  f.read_cols("a", 1, 3, cols.data());
  for (int r = 0; r < R; ++r) {
    CHECK(cols[r * 2] == a[r * C + 1]);
    CHECK(cols[r * 2 + 1] == a[r * C + 2]);
  }
  f.read_cols("b", 4, 5, cols.data());
  for (int r = 0; r < R; ++r) CHECK(cols[r] == rb[r * C + 4]);

  CHECK_THROWS_WITH_AS(f.read_rows("a", 5, 8, rows.data()), doctest::Contains("rows [5, 8) out of range"), Error);
  CHECK_THROWS_WITH_AS(f.read_cols("c", 0, 1, cols.data()), doctest::Contains("needs a 2-D tensor"), Error);
  CHECK_THROWS_WITH_AS(f.info("nope"), doctest::Contains("no tensor named 'nope'"), Error);
}

TEST_CASE("safetensors: bf16 and f16 round to nearest even and widen exactly") {
  CHECK(bf16_to_float(float_to_bf16(1.0f)) == 1.0f);
  CHECK(bf16_to_float(float_to_bf16(1.0f + 0x1p-8f)) == 1.0f);                // tie → even (down)
  CHECK(bf16_to_float(float_to_bf16(1.0f + 3 * 0x1p-8f)) == 1.0f + 0x1p-6f);  // tie → even (up)
  CHECK(bf16_to_float(float_to_bf16(1.0f + 0x1p-8f + 0x1p-20f)) == 1.0f + 0x1p-7f);  // above the tie → up
  CHECK(bf16_to_float(float_to_bf16(-2.5f)) == -2.5f);
  CHECK(std::isnan(bf16_to_float(float_to_bf16(std::nanf("")))));
  CHECK(std::isinf(bf16_to_float(float_to_bf16(INFINITY))));
  for (uint32_t h = 0; h < 0x10000; ++h) {  // every bf16 value widens and narrows back to itself
    const float f = bf16_to_float(uint16_t(h));
    if (!std::isnan(f)) REQUIRE(float_to_bf16(f) == uint16_t(h));
  }
  CHECK(f16_to_float(float_to_f16(1.0f + 0x1p-11f)) == 1.0f);  // tie → even
  CHECK(f16_to_float(float_to_f16(65519.0f)) == 65504.0f);
  CHECK(std::isinf(f16_to_float(float_to_f16(65520.0f))));
  CHECK(f16_to_float(float_to_f16(0x1p-24f)) == 0x1p-24f);  // smallest subnormal
  CHECK(f16_to_float(float_to_f16(0x1p-25f)) == 0.0f);      // tie → even (zero)
  CHECK(f16_to_float(float_to_f16(3 * 0x1p-26f)) == 0x1p-24f);
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = f16_to_float(uint16_t(h));
    if (!std::isnan(f)) REQUIRE(float_to_f16(f) == uint16_t(h));
  }
}

TEST_CASE("safetensors: a checkpoint split over files with an index reads the same tensors") {
  const fs::path dir = temp_dir("index");
  model::RandomTargetSpec spec;
  spec.layers = 3;
  spec.dtype = DType::BF16;
  model::write_random_target((dir / "one").string(), spec);
  spec.files = 3;
  model::write_random_target((dir / "three").string(), spec);
  CHECK(fs::exists(dir / "three" / "model.safetensors.index.json"));
  CHECK(fs::exists(dir / "three" / "model-00003-of-00003.safetensors"));
  Checkpoint one((dir / "one").string()), three((dir / "three").string());
  SafetensorsFile single((dir / "one" / "model.safetensors").string());
  for (const auto& name : single.names()) {
    CHECK_MESSAGE(three.has(name), name);
    CHECK_MESSAGE(one.read(name) == three.read(name), name);
  }
  CHECK(three.expect("model.layers.2.mlp.down_proj.weight", {64, 128}).dtype == DType::BF16);
  CHECK_THROWS_WITH_AS(three.expect("model.layers.2.mlp.down_proj.weight", {64, 64}),
                       doctest::Contains("has shape [64, 128], config.json implies [64, 64]"), Error);
  CHECK_THROWS_WITH_AS(Checkpoint((dir / "nothing").string()),
                       doctest::Contains("neither model.safetensors nor model.safetensors.index.json"), Error);
  // an index naming a tensor its file lacks
  fs::create_directories(dir / "bad");
  fs::copy_file(dir / "one" / "model.safetensors", dir / "bad" / "model.safetensors");
  std::ofstream(dir / "bad" / "model.safetensors.index.json")
      << R"({"weight_map": {"ghost.weight": "model.safetensors"}})";
  Checkpoint bad((dir / "bad").string());
  CHECK_THROWS_WITH_AS(bad.info("ghost.weight"), doctest::Contains("does not contain it"), Error);
}

TEST_CASE("safetensors: corrupted files give clear errors naming the file and tensor") {
  const fs::path dir = temp_dir("corrupt");
  const std::string ok_header = R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})";
  const std::string ok = write_raw(dir / "ok.safetensors", ok_header, 16);
  CHECK(open_error(ok) == "");

  SUBCASE("truncated data section") {
    const std::string p = write_raw(dir / "trunc.safetensors", ok_header, 12);
    const std::string e = open_error(p);
    CHECK(contains(e, p));
    CHECK(contains(e, "tensor 'w'"));
    CHECK(contains(e, "out of range"));
  }
  SUBCASE("file shorter than the length field") {
    const fs::path p = dir / "tiny.safetensors";
    std::ofstream(p, std::ios::binary) << "abc";
    CHECK(contains(open_error(p.string()), "too short"));
  }
  SUBCASE("header length beyond the file") {
    const fs::path p = dir / "len.safetensors";
    fs::copy_file(ok, p);
    std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
    const uint64_t big = 1ull << 40;
    f.write(reinterpret_cast<const char*>(&big), 8);
    f.close();
    const std::string e = open_error(p.string());
    CHECK(contains(e, p.string()));
    CHECK(contains(e, "header length 1099511627776 runs beyond the end of the file"));
  }
  SUBCASE("bad JSON") {
    const std::string p = write_raw(dir / "json.safetensors", R"({"w":{"dtype":"F32",)", 16);
    CHECK(contains(open_error(p), "header is not valid JSON"));
    const std::string q = write_raw(dir / "array.safetensors", "[1,2]", 0);
    CHECK(contains(open_error(q), "header JSON is not an object"));
  }
  SUBCASE("overlapping spans") {
    const std::string p = write_raw(dir / "overlap.safetensors",
                                    R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                                    R"("b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})",
                                    24);
    const std::string e = open_error(p);
    CHECK(contains(e, "tensors 'a' [0, 16) and 'b' [8, 24) overlap"));
  }
  SUBCASE("out-of-range span") {
    const std::string p = write_raw(dir / "range.safetensors",
                                    R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[16,32]}})", 20);
    CHECK(contains(open_error(p), "tensor 'a': data_offsets [16, 32] out of range: the data section has 20 bytes"));
    const std::string q = write_raw(dir / "reversed.safetensors",
                                    R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}})", 20);
    CHECK(contains(open_error(q), "end before they begin"));
  }
  SUBCASE("shape × dtype does not match the span") {
    const std::string p = write_raw(dir / "shape.safetensors",
                                    R"({"a":{"dtype":"BF16","shape":[3,2],"data_offsets":[0,16]}})", 16);
    CHECK(contains(open_error(p), "tensor 'a': shape [3, 2] × BF16 (2 bytes each) = 12 bytes but data_offsets span 16"));
    const std::string q = write_raw(dir / "negshape.safetensors",
                                    R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4);
    CHECK(contains(open_error(q), "not a non-negative integer"));
  }
  SUBCASE("unknown or unsupported dtype") {
    const std::string p = write_raw(dir / "dtype.safetensors",
                                    R"({"a":{"dtype":"Q4_K","shape":[2],"data_offsets":[0,8]}})", 8);
    const std::string e = open_error(p);
    CHECK(contains(e, p));
    CHECK(contains(e, "tensor 'a': unsupported dtype 'Q4_K' (supported: BF16, F16, F32)"));
    const std::string q = write_raw(dir / "i64.safetensors",
                                    R"({"a":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", 8);
    CHECK(contains(open_error(q), "unsupported dtype 'I64'"));
  }
  SUBCASE("missing fields") {
    const std::string p = write_raw(dir / "fields.safetensors", R"({"a":{"dtype":"F32","shape":[2]}})", 8);
    CHECK(contains(open_error(p), "tensor 'a': 'data_offsets' must be an array [begin, end]"));
  }
  SUBCASE("missing file") { CHECK(contains(open_error((dir / "absent.safetensors").string()), "cannot open")); }
}
