#include "lib/state/export_command.h"

#include <algorithm>
#include <filesystem>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "lib/core/cli_app.h"
#include "lib/core/error.h"
#include "lib/state/drafter_source.h"
#include "lib/model/drafter_export.h"
#include "lib/state/checkpoint.h"

namespace dflash::state {

namespace fs = std::filesystem;

namespace {

constexpr const char* kSourceKinds =
    "SOURCE is a run folder (its newest complete checkpoint), a checkpoint step folder or an exported drafter folder";

// Why a run folder has no complete checkpoint, for the message.
std::string no_checkpoint_reason(const fs::path& run) {
  const fs::path ckpt = run / "ckpt";
  if (!fs::is_directory(ckpt)) return fmt::format("{} does not exist", ckpt.string());
  std::vector<std::string> incomplete;
  for (const fs::directory_entry& e : fs::directory_iterator(ckpt)) {
    const std::string name = e.path().filename().string();
    if (e.is_directory() && name.rfind("step_", 0) == 0) incomplete.push_back(name);
  }
  std::sort(incomplete.begin(), incomplete.end());
  std::string why = incomplete.empty()
                        ? fmt::format("{} holds no step_* checkpoint", ckpt.string())
                        : fmt::format("{} holds only {} without DONE (saves that were interrupted or are still being "
                                      "written)", ckpt.string(), fmt::join(incomplete, ", "));
  if (fs::is_directory(ckpt / "best")) why += "; it has ckpt/best: --best exports that";
  return why;
}

// true when `inner` is `outer` or lies inside it (both made absolute, symlinks resolved where they exist).
bool within(const fs::path& inner, const fs::path& outer) {
  const fs::path a = fs::weakly_canonical(fs::absolute(inner)), b = fs::weakly_canonical(fs::absolute(outer));
  auto ai = a.begin();
  for (auto bi = b.begin(); bi != b.end(); ++bi, ++ai) {
    if (bi->empty()) continue;  // a trailing separator
    if (ai == a.end() || *ai != *bi) return false;
  }
  return true;
}

// What the export reads: the drafter and the target facts its source records.
struct ReadDrafter {
  state::DrafterSource source;  // kind "checkpoint" or "export", dir, step, drafter (config, fp32 weights, info)
  bool facts_recorded = true;  // false: a checkpoint without state.json extra.export
};

ReadDrafter read_drafter(const ExportSource& src) {
  if (src.kind != "export") {
    // a checkpoint from before the trainer recorded extra.export: its target facts come from the options
    const state::TrainingState state = state::read_checkpoint_state(src.dir);
    if (!(state.extra.is_object() && state.extra.contains("export"))) {
      state::LoadedCheckpoint ck = state::read_checkpoint(src.dir, /*with_optimizer=*/false);
      model::require_finite_weights(ck.drafter, ck.params, (fs::path(src.dir) / "model.safetensors").string());
      return {state::DrafterSource{"checkpoint", src.dir, ck.state.step,
                                  model::ExportedDrafter{ck.drafter, std::move(ck.params), {}, io::DType::F32},
                                  ck.state.target},
              false};
    }
  }
  return {state::load_drafter_source(src.dir), true};  // what dflash_eval --drafter reads from the same folder
}

}  // namespace

ExportSource resolve_export_source(const std::string& source, bool best) {
  const fs::path dir(source);
  DFLASH_USER_CHECK(fs::is_directory(dir), "{}: not a directory ({})", source, kSourceKinds);
  const bool checkpoint = fs::exists(dir / "state.json");
  const bool exported = fs::exists(dir / model::kExportConfigFile);
  if (best) {
    DFLASH_USER_CHECK(!checkpoint && !exported,
                      "--best takes a run folder; {} is {} itself: export it without --best", source,
                      checkpoint ? "a checkpoint" : "an exported drafter");
    const fs::path best_dir = dir / "ckpt" / "best";
    DFLASH_USER_CHECK(fs::is_directory(best_dir),
                      "--best: {} does not exist (a run keeps ckpt/best only with the in-training eval on: "
                      "eval.every or eval.spec_every, docs/checkpoints.md); without --best, {} exports its newest "
                      "complete checkpoint", best_dir.string(), source);
    return {"best", best_dir.string()};
  }
  if (checkpoint) {
    DFLASH_USER_CHECK(fs::exists(dir / "DONE"),
                      "{}: a checkpoint without DONE (a save that was interrupted or is still being written): export "
                      "the run folder (its newest complete checkpoint) or another step folder", source);
    return {"checkpoint", source};
  }
  if (exported) {
    DFLASH_USER_CHECK(fs::exists(dir / model::kExportWeightsFile),
                      "{}: has {} but no {}: not an exported drafter folder ({})", source, model::kExportConfigFile,
                      model::kExportWeightsFile, kSourceKinds);
    return {"export", source};
  }
  DFLASH_USER_CHECK(fs::is_directory(dir / "ckpt"),
                    "{}: not a run folder (no ckpt/), a checkpoint step folder (no state.json) or an exported "
                    "drafter folder (no {} + {}); {}", source, model::kExportConfigFile, model::kExportWeightsFile,
                    kSourceKinds);
  const std::string latest = state::find_latest_checkpoint(source);
  DFLASH_USER_CHECK(!latest.empty(), "{}: a run folder without a complete checkpoint: {}", source,
                    no_checkpoint_reason(dir));
  return {"run", latest};
}

std::string export_command(const ExportOptions& o) {
  DFLASH_USER_CHECK(o.dtype == "bf16" || o.dtype == "f32", "--dtype must be bf16 or f32, got '{}'", o.dtype);
  const ExportSource src = resolve_export_source(o.source, o.best);
  // OUT_DIR before reading gigabytes: a previous export or nothing, and never the source or inside it (a
  // checkpoint folder is deleted whole by ckpt.keep)
  model::check_export_out_dir(o.out_dir);
  DFLASH_USER_CHECK(!within(o.out_dir, src.dir), "OUT_DIR {} is {} or inside it: export to a folder of its own",
                    o.out_dir, src.dir);

  ReadDrafter read = read_drafter(src);
  const state::DrafterSource& s = read.source;
  model::DrafterExportInfo info = s.drafter.info;
  if (!o.target_layer_ids.empty()) info.target_layer_ids = o.target_layer_ids;
  if (o.num_target_layers > 0) info.num_target_layers = o.num_target_layers;
  if (o.max_position_embeddings > 0) info.max_position_embeddings = o.max_position_embeddings;
  try {
    model::validate_export_info(info, s.drafter.config);
  } catch (const Error& e) {
    const std::string options = "--target-layer-ids, --num-target-layers, --max-position-embeddings";
    if (!read.facts_recorded)
      DFLASH_USER_FAIL("{} ({}/state.json records no target facts (no extra.export): give them with {})", e.what(),
                       src.dir, options);
    DFLASH_USER_FAIL("{} (the values recorded in {}/{}, then the options given; give the missing or wrong ones with "
                     "{})", e.what(), src.dir, s.kind == "export" ? "config.json" : "state.json extra.export", options);
  }

  model::export_drafter(s.drafter.config, s.drafter.params, info, o.out_dir,
                        o.dtype == "bf16" ? io::DType::BF16 : io::DType::F32);
  const model::ExportedDrafter back = model::load_exported_drafter(o.out_dir);  // proves the files load

  std::string what;
  if (src.kind == "run")
    what = fmt::format("{} (its newest complete checkpoint {}, step {})", o.source, src.dir, s.step);
  else if (src.kind == "best")
    what = fmt::format("{} (the run's best checkpoint, step {})", src.dir, s.step);
  else if (s.kind == "checkpoint")
    what = fmt::format("{} (step {})", src.dir, s.step);
  else
    what = fmt::format("the exported drafter {}", src.dir);
  return fmt::format("exported {} to {}: {} parameters, {}, {} layers, H {}, block {}, target layers [{}] of {}\n"
                     "  {}, {}, {}: AutoModel.from_pretrained(\"{}\", trust_remote_code=True) loads it "
                     "(docs/export.md)",
                     what, o.out_dir, back.params.flat.size(), o.dtype, back.config.layers, back.config.hidden,
                     back.config.block_size, fmt::join(back.info.target_layer_ids, ", "), back.info.num_target_layers,
                     model::kExportModelingFile, model::kExportWeightsFile, model::kExportConfigFile, o.out_dir);
}

namespace {

// --target-layer-ids 1,9,17: whole numbers separated by commas.
std::vector<int> parse_layer_ids(const std::string& text) {
  std::vector<int> ids;
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    const std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    size_t used = 0;
    int v = -1;
    try {
      v = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    DFLASH_USER_CHECK(used == item.size() && !item.empty(),
                      "--target-layer-ids: '{}' is not a comma-separated list of layer numbers (e.g. 1,9,17,25,33)",
                      text);
    ids.push_back(v);
    if (comma == std::string::npos) return ids;
    start = comma + 1;
  }
}

}  // namespace

std::optional<ExportOptions> parse_export_command(int argc, char** argv, const std::string& program,
                                                  bool print_help) {
  ExportOptions o;
  std::string ids;
  CliApp app(program + ": writes a trained drafter for serving: model.safetensors + config.json + "
                             "modeling_dflash.py, loadable with transformers' AutoModel.from_pretrained(OUT_DIR, "
                             "trust_remote_code=True) (docs/export.md); no MPI needed. `dflash_mpi --export` and "
                             "`dflash_data export` are the same command.",
             program);
  // not ->required(): an unknown option is then reported before a missing positional, naming it
  app.add_option("SOURCE", o.source,
                 "a run folder (its newest complete checkpoint: ckpt/step_* with DONE), a checkpoint step folder "
                 "(ckpt/step_XXXXXXXX, ckpt/best) or an exported drafter folder")
      ->type_name("DIR");
  app.add_option("OUT_DIR", o.out_dir,
                 "the folder to write: new, empty, or a previous export (never one holding other files)")
      ->type_name("DIR");
  app.add_flag("--best", o.best, "export SOURCE/ckpt/best (the step with the best eval tau) instead of the newest");
  app.add_option("--dtype", o.dtype, "bf16 (default; rounded to nearest even) or f32 (the master weights bit-exact)")
      ->check(CLI::IsMember({"bf16", "f32"}));
  app.add_option("--target-layer-ids", ids,
                 "the tapped target layers, e.g. 1,9,17,25,33 (default: the checkpoint's state.json extra.export)")
      ->type_name("LIST");
  app.add_option("--num-target-layers", o.num_target_layers,
                 "the target's num_hidden_layers (default: the checkpoint's)")
      ->check(positive_number());
  app.add_option("--max-position-embeddings", o.max_position_embeddings,
                 "the target's max_position_embeddings (default: the checkpoint's)")
      ->check(positive_number());
  if (!parse_command_line(app, argc, argv, print_help)) return std::nullopt;
  DFLASH_USER_CHECK(!o.source.empty() && !o.out_dir.empty(),
                    "expected SOURCE and OUT_DIR; `{} --help` lists the options", program);
  if (!ids.empty()) o.target_layer_ids = parse_layer_ids(ids);
  return o;
}

std::optional<ExportOptions> parse_export_options(int argc, char** argv, bool print_help) {
  return parse_export_command(argc - 1, argv + 1, "dflash_mpi --export", print_help);
}

}  // namespace dflash::state
