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

int launcher_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"})
    if (const char* v = std::getenv(name); v && *v) return std::atoi(v);
  return 0;
}

}  // namespace dflash::job
