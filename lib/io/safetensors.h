#pragma once
// Safetensors checkpoints (https://github.com/huggingface/safetensors): an mmap reader that validates the whole
// header before any tensor is touched, reads a row or column slice of a tensor as fp32 without reading the rest,
// follows `model.safetensors.index.json` for multi-file checkpoints, and a streaming writer.
//
// File layout: u64 little-endian header length N, N bytes of JSON {name: {dtype, shape, data_offsets: [b, e]},
// "__metadata__": {str: str}}, then the data section; offsets are relative to the data section.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace dflash::io {

enum class DType { F32, F16, BF16 };

size_t dtype_size(DType d);
const char* dtype_name(DType d);  // "F32", "F16", "BF16" as in the header
DType parse_dtype(const std::string& name);  // throws naming the accepted dtypes

// bf16: round-to-nearest-even when narrowing (NaN stays NaN), exact widening.
uint16_t float_to_bf16(float f);
float bf16_to_float(uint16_t b);
// IEEE half: round-to-nearest-even when narrowing (overflow → inf), exact widening (subnormals included).
uint16_t float_to_f16(float f);
float f16_to_float(uint16_t h);

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  size_t begin = 0, end = 0;  // byte span in the data section
  int64_t numel() const;
  int64_t rows() const;     // shape[0] (1 for a scalar)
  int64_t row_len() const;  // product of shape[1:]
  std::string shape_str() const;  // "[2048, 5120]"
};

// One .safetensors file, mmapped read-only. Construction validates: header length within the file (and under
// 100 MB), well-formed JSON, every dtype in {BF16, F16, F32}, shape × dtype size = byte span, spans inside the
// data section and not overlapping. Any violation is a dflash::Error naming the file (and tensor).
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  bool has(const std::string& name) const { return tensors_.count(name) > 0; }
  const TensorInfo& info(const std::string& name) const;  // throws naming the file and tensor
  std::vector<std::string> names() const;                 // sorted
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // out[(row_end-row_begin) * row_len] (=) rows [row_begin, row_end) along dim 0, converted to fp32.
  void read_rows(const std::string& name, int64_t row_begin, int64_t row_end, float* out) const;
  // out[rows, col_end-col_begin] (=) columns [col_begin, col_end) of a 2-D tensor, converted to fp32.
  void read_cols(const std::string& name, int64_t col_begin, int64_t col_end, float* out) const;
  // the whole tensor as fp32
  std::vector<float> read(const std::string& name) const;
  // the tensor's stored bytes (t.end - t.begin of them, in its dtype), mapped: for hashing, not for math
  const uint8_t* raw_bytes(const TensorInfo& t) const { return span(t); }

 private:
  const uint8_t* span(const TensorInfo& t) const { return data_ + t.begin; }

  std::string path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  const uint8_t* data_ = nullptr;  // start of the data section
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// A Hugging Face checkpoint directory: `model.safetensors`, or `model.safetensors.index.json` whose weight_map
// names the file of every tensor (files are opened on first use; a tensor the index names must be in its file).
class Checkpoint {
 public:
  explicit Checkpoint(const std::string& dir);

  const std::string& dir() const { return dir_; }
  bool has(const std::string& name) const { return file_of_.count(name) > 0; }
  std::vector<std::string> names() const;  // every tensor of the checkpoint (all files), sorted
  const TensorInfo& info(const std::string& name) const;
  void read_rows(const std::string& name, int64_t row_begin, int64_t row_end, float* out) const;
  void read_cols(const std::string& name, int64_t col_begin, int64_t col_end, float* out) const;
  std::vector<float> read(const std::string& name) const;
  // throws unless the tensor exists with exactly this shape, naming the checkpoint, tensor and both shapes
  const TensorInfo& expect(const std::string& name, const std::vector<int64_t>& shape) const;
  // the tensor's stored bytes (info(name).end - begin of them), mapped: for hashing, not for math
  const uint8_t* raw_bytes(const std::string& name) const { return file(name).raw_bytes(info(name)); }

 private:
  const SafetensorsFile& file(const std::string& name) const;

  std::string dir_;
  std::map<std::string, std::string> file_of_;  // tensor → file name inside dir_
  mutable std::map<std::string, std::unique_ptr<SafetensorsFile>> files_;
};

// A tensor to write: `fill` writes its numel() fp32 values into the buffer it is given (called once, while
// writing, so a model larger than memory can be streamed one tensor at a time); stored as `dtype`.
struct TensorToWrite {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  std::function<void(float*)> fill;
};
TensorToWrite tensor_from(const std::string& name, DType dtype, std::vector<int64_t> shape, const float* data);

// Writes the tensors in the given order (header padded with spaces to 8 bytes, as the reference writer does).
void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace dflash::io
