#include "lib/job/cli.h"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "lib/core/cli_app.h"
#include "lib/core/error.h"

namespace dflash::job {

namespace {

constexpr const char* kDescription =
    "dflash_mpi: trains a DFlash drafter against a frozen Qwen3 target (docs/running.md).\n"
    "  mpirun -np N dflash_mpi CONFIG.yaml [options]   N = layout.target_tp * layout.target_groups + "
    "layout.drafter_dp\n"
    "  dflash_mpi CONFIG.yaml --check                  (no mpirun) validate config, target weights, data and the\n"
    "                                                  checkpoint to resume; print the plan and memory estimates\n"
    "  dflash_mpi --export SOURCE OUT_DIR [--best] [--dtype bf16|f32]   a run's drafter for serving (docs/export.md)\n"
    "SIGTERM / SIGUSR1 to the ranks (or to mpirun, which forwards it): finish the step, write a checkpoint, exit 0;\n"
    "continue with ckpt.resume: auto. Keys: docs/config.md. Example: mpi_launch/configs/tiny.yaml\n";

}  // namespace

std::optional<ProgramOptions> parse_program_options(int argc, char** argv, bool print_help) {
  ProgramOptions o;
  CliApp app(kDescription, "dflash_mpi");
  app.add_option("CONFIG", o.config, "the run's YAML config")->required()->type_name("CONFIG.yaml");
  app.add_option("--set", o.sets, "override one config key, e.g. --set optim.lr=3e-4 (repeatable)")
      ->allow_extra_args(false)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)  // every --set (CliApp's default keeps the last)
      ->type_name("KEY=VALUE");
  app.add_option("--stop-after-steps", o.stop_after,
                 "run K steps from the start (or the resumed step), write a checkpoint, exit")
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            long long k = 0;
            size_t used = 0;
            try {
              k = std::stoll(v, &used);
            } catch (const std::exception&) {
              used = 0;
            }
            if (used != v.size() || k < 1)
              return "--stop-after-steps " + v + ": give a whole number of steps >= 1 (the run stops after that many "
                                                 "steps from its start or resumed step)";
            return "";
          },
          "K >= 1"));
  app.add_option("--dump-step", o.dump_dir,
                 "run one step; write its inputs, loss and gradients to DIR/step_XXXXXXXX.safetensors")
      ->type_name("DIR");
  app.add_flag("--check", o.check, "(no mpirun) validate everything the job would read, print the plan, run nothing");
  app.add_option("--gpu", o.gpus,
                 "with --check: predict the pipeline's balance on this GPU: h100, h200, b200, rtx-pro-6000 "
                 "(repeatable; default h200 and rtx-pro-6000, and this machine's GPU)")
      ->type_name("NAME");
  app.add_option("--print-key", o.print_key,
                 "(no mpirun) print one key's resolved value (paths resolved), e.g. run.out_dir, and exit")
      ->type_name("KEY");
  if (!parse_command_line(app, argc, argv, print_help)) return std::nullopt;
  for (const auto& s : o.sets)
    DFLASH_USER_CHECK(s.find('=') != std::string::npos, "dflash_mpi: --set {}: expected key=value, e.g. "
                      "--set optim.lr=3e-4", s);
  return o;
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

int launcher_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"})
    if (const char* v = std::getenv(name); v && *v) return std::atoi(v);
  return 0;
}

}  // namespace dflash::job
