#pragma once
// Training checkpoints that never lose a run (docs/checkpoints.md): `out_dir/ckpt/step_XXXXXXXX/` holds
// model.safetensors (fp32 master weights, export names), optimizer.safetensors (AdamW m, v), state.json (step, data
// cursor, rank layout, drafter shape, config hash, per-rank RNG, an opaque `extra`) and a DONE marker written last
// with the size and hash of every file. Every file goes to a temporary name, is fsync'd and renamed; the directory
// is fsync'd before DONE is written the same way, so a crash at any point leaves a directory without DONE, which
// every reader ignores.
//
// One rank writes (the first drafter rank: all drafter ranks hold identical weights); this API takes the data,
// not MPI.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lib/model/adamw.h"
#include "lib/model/drafter_config.h"
#include "lib/model/drafter_export.h"
#include "lib/model/drafter_params.h"

namespace dflash::state {

constexpr const char* kCheckpointMagic = "dflash_mpi checkpoint";
constexpr int kCheckpointVersion = 1;

// Where the data stream is: the next step reads sequence `step_in_epoch` of epoch `epoch`'s order.
struct DataCursor {
  int64_t epoch = 0;
  int64_t step_in_epoch = 0;   // optimizer steps already taken in this epoch
  uint64_t shuffle_seed = 0;   // seed of the epoch-seeded shuffle
};

// The rank layout (docs/architecture.md): resume refuses a different one.
struct CheckpointLayout {
  int target_tp = 0;
  int target_groups = 0;
  int drafter_dp = 0;
  int micro_batches = 0;  // sequences per drafter rank per step
};

// One rank's RNG (lib/core/rng.h): its whole state is three integers.
struct RankRng {
  int rank = 0;
  uint64_t seed = 0, stream = 0, counter = 0;
};

// Everything but the tensors.
struct TrainingState {
  int64_t step = 0;             // optimizer steps completed (names the directory)
  DataCursor data;
  CheckpointLayout layout;
  std::string config_hash;      // config_hash_hex(cfg): "0x" + 16 hex digits
  std::string dataset;          // the training data's identity (shape + content hash); "" in older checkpoints
  std::string target;           // the target folder's identity (lib/model/target_identity.h); "" in older ones
  std::vector<RankRng> rng;     // whatever ranks the trainer records, in its order
  nlohmann::json extra = nlohmann::json::object();  // opaque to this module (export reads extra["export"])
};

// Writes `out_dir/ckpt/step_{state.step:08d}/` atomically (see above) and returns its path. Re-saving a step that
// already has a complete checkpoint replaces it: its DONE is removed only once the new files are on disk.
// `opt.m`, `opt.v` must be empty (not started) or hold one value per parameter.
std::string save_checkpoint(const std::string& out_dir, const model::DrafterConfig& drafter,
                            const model::DrafterParams<float>& params, const model::AdamWState& opt, const TrainingState& state);

// The same into any directory `step_dir` (created with its parents; the best checkpoint, lib/state/best_checkpoint.h).
std::string save_checkpoint_in(const std::string& step_dir, const model::DrafterConfig& drafter,
                               const model::DrafterParams<float>& params, const model::AdamWState& opt, const TrainingState& state);

// `out_dir/ckpt/step_XXXXXXXX` for a step (no I/O).
std::string checkpoint_dir(const std::string& out_dir, int64_t step);

// Path of the newest `out_dir/ckpt/step_*` directory that has DONE; "" when there is none. Directories without DONE
// and names that are not step_<8+ digits> are ignored. Does not read the files (load_checkpoint verifies them).
std::string find_latest_checkpoint(const std::string& out_dir);
// Every complete step checkpoint under out_dir/ckpt, oldest first.
std::vector<std::string> list_complete_checkpoints(const std::string& out_dir);

// What this run is: load_checkpoint refuses a checkpoint that differs in any of these, naming the field.
struct CheckpointExpectation {
  CheckpointLayout layout;
  model::DrafterConfig drafter;
  std::string config_hash;
  std::string dataset;  // compared when both this and the checkpoint's are not empty
  std::string target;   // the same
  // The data cursor and the per-rank RNG follow from the step (lib/state/checkpointing.cpp): a checkpoint whose
  // recorded ones do not was written for another number of sequences per epoch or seed; 0: not compared.
  int64_t steps_per_epoch = 0;
  uint64_t seed = 0;
};

struct LoadedCheckpoint {
  std::string dir;
  model::DrafterConfig drafter;
  model::DrafterParams<float> params;  // bit-exact fp32 master weights
  model::AdamWState optimizer;         // m, v ([P] each, empty when not loaded) and the AdamW step
  TrainingState state;
};

// For resume: verifies DONE (every file's size and hash), state.json's magic and version, then the layout, drafter
// shape and config hash against `expected`; any difference is a dflash::Error saying what differs, e.g.
// "checkpoint layout drafter_dp=3, this run has drafter_dp=2".
LoadedCheckpoint load_checkpoint(const std::string& dir, const CheckpointExpectation& expected);

// Integrity checks only (DONE, sizes, hashes, magic, version, tensor names and shapes): for export and inspection.
// `with_optimizer` = false skips reading (not verifying) optimizer.safetensors.
LoadedCheckpoint read_checkpoint(const std::string& dir, bool with_optimizer = true);

// state.json of a checkpoint directory, after its DONE-listed hash is verified (no tensors read).
TrainingState read_checkpoint_state(const std::string& dir, model::DrafterConfig* drafter = nullptr);

// Keeps the newest `keep` complete checkpoints (0 = all) and deletes older complete ones and incomplete ones older
// than the newest complete (crash leftovers); never the newest complete one, never a directory newer than it.
// A deleted directory loses its DONE first, so a crash mid-delete leaves only an ignored incomplete directory.
// Returns the deleted paths, oldest first.
std::vector<std::string> prune_checkpoints(const std::string& out_dir, int keep);

// The 64-bit file hash DONE records: FNV-1a over little-endian 64-bit words (tail bytes zero-padded to a word),
// then folded with the byte length through SplitMix64 (docs/checkpoints.md gives the exact definition).
uint64_t checkpoint_hash(const void* data, size_t bytes);

// Exports a checkpoint directory (verified as read_checkpoint does; the optimizer is not read) as model/
// export_drafter does. The target facts come from its state.json extra["export"]; a non-empty / non-zero field of
// `overrides` replaces that field (and supplies it when the checkpoint has none).
void export_checkpoint(const std::string& step_dir, const std::string& out_dir, io::DType dtype,
                       const model::DrafterExportInfo& overrides = {});

}  // namespace dflash::state
