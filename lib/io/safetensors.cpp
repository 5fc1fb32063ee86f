#include "lib/io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "lib/core/error.h"

namespace dflash::io {

namespace {

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // the reference implementation's bound

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// out[n] (=) fp32 values of n elements of `dtype` at src (any alignment: the data section need not be aligned)
void widen(float* out, const uint8_t* src, size_t n, DType dtype) {
  switch (dtype) {
    case DType::F32:
      std::memcpy(out, src, n * 4);
      return;
    case DType::BF16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t b;
        std::memcpy(&b, src + 2 * i, 2);
        out[i] = bf16_to_float(b);
      }
      return;
    case DType::F16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        out[i] = f16_to_float(h);
      }
      return;
  }
}

void narrow(uint8_t* dst, const float* in, size_t n, DType dtype) {
  switch (dtype) {
    case DType::F32:
      std::memcpy(dst, in, n * 4);
      return;
    case DType::BF16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t b = float_to_bf16(in[i]);
        std::memcpy(dst + 2 * i, &b, 2);
      }
      return;
    case DType::F16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h = float_to_f16(in[i]);
        std::memcpy(dst + 2 * i, &h, 2);
      }
      return;
  }
}

bool shape_numel(const std::vector<int64_t>& shape, int64_t* out) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) return false;
  }
  *out = n;
  return true;
}

}  // namespace

size_t dtype_size(DType d) { return d == DType::F32 ? 4 : 2; }

const char* dtype_name(DType d) {
  switch (d) {
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
  }
  return "?";
}

DType parse_dtype(const std::string& name) {
  if (name == "F32") return DType::F32;
  if (name == "F16") return DType::F16;
  if (name == "BF16") return DType::BF16;
  DFLASH_USER_FAIL("unsupported dtype '{}' (supported: BF16, F16, F32)", name);
}

uint16_t float_to_bf16(float f) {
  uint32_t x = bits_of(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x0040u);  // quiet NaN, sign kept
  x += 0x7fffu + ((x >> 16) & 1u);  // round to nearest, ties to even
  return uint16_t(x >> 16);
}

float bf16_to_float(uint16_t b) { return float_of(uint32_t(b) << 16); }

uint16_t float_to_f16(float f) {
  uint32_t x = bits_of(f);
  const uint16_t sign = uint16_t((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x >= 0x7f800000u) return sign | 0x7c00u | (x > 0x7f800000u ? 0x0200u : 0u);  // inf / NaN
  if (x >= 0x477ff000u) return sign | 0x7c00u;                                       // ≥ 65520 rounds to inf
  if (x < 0x38800000u) {  // below 2^-14: a half subnormal, unit 2^-24; nearbyint rounds to even
    return sign | uint16_t(std::nearbyint(double(float_of(x)) * 16777216.0));
  }
  x += 0x0fffu + ((x >> 13) & 1u);  // round to nearest even at bit 13 (a carry into the exponent is right)
  return sign | uint16_t((x >> 13) - (112u << 10));
}

float f16_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0) {
    float v = std::ldexp(float(mant), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return float_of(sign | 0x7f800000u | (mant << 13));
  return float_of(sign | ((exp + 112u) << 23) | (mant << 13));
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}
int64_t TensorInfo::rows() const { return shape.empty() ? 1 : shape[0]; }
int64_t TensorInfo::row_len() const {
  int64_t n = 1;
  for (size_t i = 1; i < shape.size(); ++i) n *= shape[i];
  return n;
}
std::string TensorInfo::shape_str() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

// ---------------------------------------------------------------------------------------------------------------
// SafetensorsFile

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  DFLASH_USER_CHECK(fd >= 0, "safetensors {}: cannot open: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    DFLASH_USER_FAIL("safetensors {}: cannot stat: {}", path, std::strerror(errno));
  }
  const uint64_t file_size = uint64_t(st.st_size);
  if (file_size < 8) {
    ::close(fd);
    DFLASH_USER_FAIL("safetensors {}: file is {} bytes, too short for the 8-byte header length (truncated file?)", path,
                file_size);
  }
  map_ = ::mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  DFLASH_USER_CHECK(map_ != MAP_FAILED, "safetensors {}: mmap failed: {}", path, std::strerror(errno));
  map_size_ = file_size;
  // The constructor may throw below: release the mapping then (the destructor does not run).
  struct Guard {
    SafetensorsFile* self;
    bool armed = true;
    ~Guard() {
      if (armed) ::munmap(self->map_, self->map_size_);
    }
  } guard{this};

  const auto* base = static_cast<const uint8_t*>(map_);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | base[i];  // little-endian u64
  DFLASH_USER_CHECK(header_len <= file_size - 8,
               "safetensors {}: header length {} runs beyond the end of the file ({} bytes; truncated file?)", path,
               header_len, file_size);
  DFLASH_USER_CHECK(header_len <= kMaxHeaderBytes, "safetensors {}: header length {} exceeds the 100 MB limit", path,
               header_len);
  data_ = base + 8 + header_len;
  const uint64_t data_size = file_size - 8 - header_len;

  nlohmann::json header;
  try {
    header = nlohmann::json::parse(base + 8, base + 8 + header_len);
  } catch (const nlohmann::json::exception& e) {
    DFLASH_USER_FAIL("safetensors {}: header is not valid JSON: {}", path, e.what());
  }
  DFLASH_USER_CHECK(header.is_object(), "safetensors {}: header JSON is not an object", path);

  std::vector<const TensorInfo*> by_offset;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const auto& v = it.value();
    if (name == "__metadata__") {
      DFLASH_USER_CHECK(v.is_object(), "safetensors {}: __metadata__ is not an object", path);
      for (auto m = v.begin(); m != v.end(); ++m) {
        DFLASH_USER_CHECK(m.value().is_string(), "safetensors {}: __metadata__ value of '{}' is not a string", path,
                     m.key());
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    DFLASH_USER_CHECK(v.is_object(), "safetensors {}: tensor '{}': entry is not an object", path, name);
    DFLASH_USER_CHECK(v.contains("dtype") && v["dtype"].is_string(), "safetensors {}: tensor '{}': missing string 'dtype'",
                 path, name);
    DFLASH_USER_CHECK(v.contains("shape") && v["shape"].is_array(), "safetensors {}: tensor '{}': missing array 'shape'",
                 path, name);
    DFLASH_USER_CHECK(v.contains("data_offsets") && v["data_offsets"].is_array() && v["data_offsets"].size() == 2,
                 "safetensors {}: tensor '{}': 'data_offsets' must be an array [begin, end]", path, name);
    TensorInfo t;
    t.name = name;
    const std::string dtype = v["dtype"].get<std::string>();
    try {
      t.dtype = parse_dtype(dtype);
    } catch (const Error&) {
      DFLASH_USER_FAIL("safetensors {}: tensor '{}': unsupported dtype '{}' (supported: BF16, F16, F32)", path, name,
                  dtype);
    }
    for (const auto& d : v["shape"]) {
      DFLASH_USER_CHECK(d.is_number_unsigned() || (d.is_number_integer() && d.get<int64_t>() >= 0),
                   "safetensors {}: tensor '{}': shape {} has an entry that is not a non-negative integer", path,
                   name, v["shape"].dump());
      t.shape.push_back(d.get<int64_t>());
    }
    for (const auto& o : v["data_offsets"]) {
      DFLASH_USER_CHECK(o.is_number_unsigned() || (o.is_number_integer() && o.get<int64_t>() >= 0),
                   "safetensors {}: tensor '{}': data_offsets {} are not non-negative integers", path, name,
                   v["data_offsets"].dump());
    }
    const uint64_t b = v["data_offsets"][0].get<uint64_t>(), e = v["data_offsets"][1].get<uint64_t>();
    DFLASH_USER_CHECK(b <= e, "safetensors {}: tensor '{}': data_offsets [{}, {}] end before they begin", path, name, b,
                 e);
    DFLASH_USER_CHECK(e <= data_size,
                 "safetensors {}: tensor '{}': data_offsets [{}, {}] out of range: the data section has {} bytes "
                 "(truncated file?)",
                 path, name, b, e, data_size);
    int64_t numel = 0;
    DFLASH_USER_CHECK(shape_numel(t.shape, &numel), "safetensors {}: tensor '{}': shape {} overflows", path, name,
                 t.shape_str());
    DFLASH_USER_CHECK(uint64_t(numel) * dtype_size(t.dtype) == e - b,
                 "safetensors {}: tensor '{}': shape {} × {} ({} bytes each) = {} bytes but data_offsets span {} "
                 "bytes",
                 path, name, t.shape_str(), dtype, dtype_size(t.dtype), uint64_t(numel) * dtype_size(t.dtype),
                 e - b);
    t.begin = b;
    t.end = e;
    by_offset.push_back(&tensors_.emplace(name, std::move(t)).first->second);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const TensorInfo* a, const TensorInfo* b) { return a->begin < b->begin || (a->begin == b->begin && a->end < b->end); });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const TensorInfo* p = by_offset[i - 1];
    const TensorInfo* c = by_offset[i];
    DFLASH_USER_CHECK(p->end <= c->begin || p->begin == p->end || c->begin == c->end,
                 "safetensors {}: tensors '{}' [{}, {}) and '{}' [{}, {}) overlap", path, p->name, p->begin, p->end,
                 c->name, c->begin, c->end);
  }
  guard.armed = false;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ && map_ != MAP_FAILED) ::munmap(map_, map_size_);
}

const TensorInfo& SafetensorsFile::info(const std::string& name) const {
  auto it = tensors_.find(name);
  DFLASH_USER_CHECK(it != tensors_.end(), "safetensors {}: no tensor named '{}'", path_, name);
  return it->second;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> v;
  for (const auto& [k, _] : tensors_) v.push_back(k);
  return v;
}

void SafetensorsFile::read_rows(const std::string& name, int64_t row_begin, int64_t row_end, float* out) const {
  const TensorInfo& t = info(name);
  DFLASH_USER_CHECK(0 <= row_begin && row_begin <= row_end && row_end <= t.rows(),
               "safetensors {}: tensor '{}' {}: rows [{}, {}) out of range", path_, name, t.shape_str(), row_begin,
               row_end);
  const size_t len = size_t(t.row_len()), es = dtype_size(t.dtype);
  widen(out, span(t) + size_t(row_begin) * len * es, size_t(row_end - row_begin) * len, t.dtype);
}

void SafetensorsFile::read_cols(const std::string& name, int64_t col_begin, int64_t col_end, float* out) const {
  const TensorInfo& t = info(name);
  DFLASH_USER_CHECK(t.shape.size() == 2, "safetensors {}: tensor '{}' {}: a column slice needs a 2-D tensor", path_, name,
               t.shape_str());
  DFLASH_USER_CHECK(0 <= col_begin && col_begin <= col_end && col_end <= t.shape[1],
               "safetensors {}: tensor '{}' {}: columns [{}, {}) out of range", path_, name, t.shape_str(),
               col_begin, col_end);
  const size_t cols = size_t(t.shape[1]), width = size_t(col_end - col_begin), es = dtype_size(t.dtype);
  for (int64_t r = 0; r < t.shape[0]; ++r) {
    widen(out + size_t(r) * width, span(t) + (size_t(r) * cols + size_t(col_begin)) * es, width, t.dtype);
  }
}

std::vector<float> SafetensorsFile::read(const std::string& name) const {
  const TensorInfo& t = info(name);
  std::vector<float> v(size_t(t.numel()));
  widen(v.data(), span(t), v.size(), t.dtype);
  return v;
}

// ---------------------------------------------------------------------------------------------------------------
// Checkpoint

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  for (const auto& [name, file] : file_of_) out.push_back(name);
  return out;  // std::map: sorted
}

Checkpoint::Checkpoint(const std::string& dir) : dir_(dir) {
  namespace fs = std::filesystem;
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  const fs::path single = fs::path(dir) / "model.safetensors";
  if (fs::exists(index)) {
    std::ifstream in(index);
    DFLASH_USER_CHECK(in, "checkpoint {}: cannot read {}", dir, index.string());
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      DFLASH_USER_FAIL("checkpoint index {}: not valid JSON: {}", index.string(), e.what());
    }
    DFLASH_USER_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(),
                 "checkpoint index {}: missing object 'weight_map'", index.string());
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      DFLASH_USER_CHECK(it.value().is_string(), "checkpoint index {}: weight_map['{}'] is not a file name",
                   index.string(), it.key());
      const std::string f = it.value().get<std::string>();
      DFLASH_USER_CHECK(f.find('/') == std::string::npos && f != ".." && !f.empty(),
                   "checkpoint index {}: weight_map['{}'] = '{}' must be a file name inside the directory",
                   index.string(), it.key(), f);
      file_of_[it.key()] = f;
    }
  } else if (fs::exists(single)) {
    auto f = std::make_unique<SafetensorsFile>(single.string());
    for (const auto& n : f->names()) file_of_[n] = "model.safetensors";
    files_["model.safetensors"] = std::move(f);
  } else {
    DFLASH_USER_FAIL("checkpoint {}: neither model.safetensors nor model.safetensors.index.json found", dir);
  }
}

const SafetensorsFile& Checkpoint::file(const std::string& name) const {
  auto it = file_of_.find(name);
  DFLASH_USER_CHECK(it != file_of_.end(), "checkpoint {}: no tensor named '{}'", dir_, name);
  auto& f = files_[it->second];
  if (!f) f = std::make_unique<SafetensorsFile>((std::filesystem::path(dir_) / it->second).string());
  DFLASH_USER_CHECK(f->has(name), "checkpoint {}: the index puts tensor '{}' in {}, which does not contain it", dir_,
               name, it->second);
  return *f;
}

const TensorInfo& Checkpoint::info(const std::string& name) const { return file(name).info(name); }

void Checkpoint::read_rows(const std::string& name, int64_t row_begin, int64_t row_end, float* out) const {
  file(name).read_rows(name, row_begin, row_end, out);
}
void Checkpoint::read_cols(const std::string& name, int64_t col_begin, int64_t col_end, float* out) const {
  file(name).read_cols(name, col_begin, col_end, out);
}
std::vector<float> Checkpoint::read(const std::string& name) const { return file(name).read(name); }

const TensorInfo& Checkpoint::expect(const std::string& name, const std::vector<int64_t>& shape) const {
  DFLASH_USER_CHECK(has(name), "checkpoint {}: missing tensor '{}' (expected shape {})", dir_, name,
               TensorInfo{"", DType::F32, shape}.shape_str());
  const TensorInfo& t = info(name);
  DFLASH_USER_CHECK(t.shape == shape, "checkpoint {}: tensor '{}' has shape {}, config.json implies {}", dir_, name,
               t.shape_str(), TensorInfo{"", DType::F32, shape}.shape_str());
  return t;
}

// ---------------------------------------------------------------------------------------------------------------
// Writer

TensorToWrite tensor_from(const std::string& name, DType dtype, std::vector<int64_t> shape, const float* data) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return {name, dtype, std::move(shape), [data, n](float* out) { std::copy(data, data + n, out); }};
}

void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    DFLASH_USER_CHECK(!header.contains(t.name), "write_safetensors {}: duplicate tensor '{}'", path, t.name);
    int64_t numel = 0;
    DFLASH_USER_CHECK(shape_numel(t.shape, &numel), "write_safetensors {}: tensor '{}' has an invalid shape", path,
                 t.name);
    const uint64_t bytes = uint64_t(numel) * dtype_size(t.dtype);
    header[t.name] = {{"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  while (text.size() % 8) text += ' ';

  std::FILE* f = std::fopen(path.c_str(), "wb");
  DFLASH_USER_CHECK(f, "write_safetensors: cannot create {}: {}", path, std::strerror(errno));
  auto put = [&](const void* p, size_t n) {
    if (n && std::fwrite(p, 1, n, f) != n) {
      std::fclose(f);
      DFLASH_USER_FAIL("write_safetensors {}: write failed: {}", path, std::strerror(errno));
    }
  };
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = uint8_t(uint64_t(text.size()) >> (8 * i));
  put(len, 8);
  put(text.data(), text.size());
  std::vector<float> values;
  std::vector<uint8_t> bytes;
  for (const auto& t : tensors) {
    int64_t numel = 0;
    shape_numel(t.shape, &numel);
    values.assign(size_t(numel), 0.f);
    if (numel) t.fill(values.data());
    bytes.resize(size_t(numel) * dtype_size(t.dtype));
    narrow(bytes.data(), values.data(), values.size(), t.dtype);
    put(bytes.data(), bytes.size());
  }
  DFLASH_USER_CHECK(std::fclose(f) == 0, "write_safetensors {}: close failed: {}", path, std::strerror(errno));
}

}  // namespace dflash::io
