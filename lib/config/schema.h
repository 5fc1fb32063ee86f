#pragma once
// The key table of the training config: one row per key, read by parsing, validation, printing and hashing.
#include <cstdint>
#include <limits>
#include <type_traits>
#include <string>
#include <variant>
#include <vector>

#include "lib/config/config.h"
#include "lib/core/named_enum.h"  // edit_distance

namespace dflash {

enum class KeyType { kInt, kFloat, kBool, kString, kEnum, kIntList, kEnumList };
const char* key_type_name(KeyType t);  // "int", "float", ... as in messages and docs

// Where a key's value lives inside a TrainConfig.
// kEnum keys are text (std::string: log.level) or one of these enums, whose names (names_of, beside each enum) are
// the key's choices: the file's text becomes the enum here and nowhere else (lib/core/named_enum.h).
using FieldRef = std::variant<int*, int64_t*, double*, bool*, std::string*, std::vector<int>*,
                              std::vector<std::string>*, model::VocabLossMode*, kernels::Device*, PrecisionChoice*,
                              comm::TransportChoice*, model::TpAllreduce*, model::PositionWeight*>;
// True for the enum alternatives of FieldRef.
template <typename V>
constexpr bool is_named_enum_v = std::is_enum_v<V>;

// Allowed numeric interval (ints, floats, elements of int lists); open ends are exclusive.
struct ValueRange {
  double lo = -std::numeric_limits<double>::infinity();
  double hi = std::numeric_limits<double>::infinity();
  bool lo_open = false, hi_open = false;
  bool contains(double v) const;
  std::string describe() const;  // "> 0", ">= 1", "in [0, 1)", "" when unbounded
};

struct ConfigKey {
  std::string path;                   // "optim.lr"
  KeyType type = KeyType::kInt;
  FieldRef (*field)(TrainConfig&) = nullptr;  // the member it fills
  std::string help;                   // one line for docs and --help
  std::vector<std::string> choices;   // kEnum / kEnumList
  ValueRange range;                        // kInt / kFloat / kIntList
  bool required = false;              // no usable default: must come from the file or --set
  bool hashed = true;                 // part of config_hash (false: does not change the training math)

  std::string section() const { return path.substr(0, path.find('.')); }
  std::string leaf() const { return path.substr(path.find('.') + 1); }
};

// Every key, in section order (run, layout, target, drafter, loss, optim, data, ckpt, log).
const std::vector<ConfigKey>& config_schema();
const std::vector<std::string>& config_sections();
// nullptr when unknown.
const ConfigKey* find_config_key(const std::string& path);
// The closest known key to an unknown one ("" when nothing is close): same leaf in another section first,
// then the smallest edit distance.
std::string suggest_config_key(const std::string& unknown);

}  // namespace dflash
