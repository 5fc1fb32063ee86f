#pragma once
// The identity of a target model folder, recorded in every checkpoint as the dataset's is: a resume against a
// different target of the same shape (another fine-tune, another revision) is refused, and dflash_eval warns. Reading
// every weight of a 27B model to hash it would take minutes, so the content part samples each tensor: its name, dtype
// and shape, and 4 KiB at the start, the middle and the end of its bytes (a fine-tune changes essentially every
// weight, so different weights give different samples), plus config.json byte for byte.
#include <string>

namespace dflash::model {

// "N tensors, P parameters, sampled content 0x<16 hex digits>"; throws dflash::Error for an unreadable folder.
std::string target_identity(const std::string& target_dir);

}  // namespace dflash::model
