#include "lib/core/cli_app.h"

#include <cstdio>
#include <exception>
#include <memory>
#include <string>

namespace dflash {

namespace {

// A validator of a number against `ok`, described by `rule` ("> 0", ">= 0").
CLI::Validator number_check(const char* rule, bool (*ok)(double), const char* name) {
  return CLI::Validator(
      [rule, ok](std::string& text) -> std::string {
        size_t used = 0;
        double v = 0;
        try {
          v = std::stod(text, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used == 0 || used != text.size()) return "must be a number, got '" + text + "'";
        return ok(v) ? std::string() : std::string("must be ") + rule + ", got " + text;
      },
      std::string("(") + rule + ")", name);
}

}  // namespace

CLI::Validator positive_number() {
  return number_check("> 0", [](double v) { return v > 0; }, "POSITIVE");
}
CLI::Validator non_negative_number() {
  return number_check(">= 0", [](double v) { return v >= 0; }, "NON_NEGATIVE");
}


namespace {

// CLI11's option column, reworded: "--max-new-tokens INT in [1 - 1048576] (default 128)" rather than
// "INT:INT in [1 - 1048576]=128"; a validator that says more than the type ("{bf16,f32}") replaces it, and
// positive_number() / NonNegativeNumber read "INT > 0" / "INT >= 0".
class CliFormatter : public CLI::Formatter {
 public:
  CliFormatter() { column_width(34); }
  std::string make_option_opts(const CLI::Option* opt) const override {
    if (!opt->get_option_text().empty()) return " " + opt->get_option_text();
    std::string out;
    if (opt->get_type_size() == 0) return out;  // a flag
    std::string type = opt->get_type_name();
    if (const size_t colon = type.rfind(':'); colon != std::string::npos) {
      const std::string base = type.substr(0, type.find(':')), rule = type.substr(colon + 1);
      type = rule == "POSITIVE" ? base + " > 0" : rule == "NONNEGATIVE" ? base + " >= 0" : rule;
    }
    if (!type.empty()) out += " " + type;
    if (opt->get_expected_max() == CLI::detail::expected_max_vector_size) out += " ...";
    const std::string fallback = opt->get_default_str();
    if (!fallback.empty() && fallback != "[]") out += " (default " + fallback + ")";
    if (opt->get_required()) out += " REQUIRED";
    return out;
  }
};

// CLI11's "Could not convert: --tree-budget = abc" as "--tree-budget: must be a whole number, got 'abc'" (the kind of
// value from the option's type); the message as it was when it has another shape.
std::string conversion_message(const CLI::App& app, const std::string& what) {
  const std::string head = "Could not convert: ";
  const size_t eq = what.find(" = ");
  if (what.rfind(head, 0) != 0 || eq == std::string::npos) return what;
  const std::string name = what.substr(head.size(), eq - head.size()), value = what.substr(eq + 3);
  const CLI::Option* opt = app.get_option_no_throw(name);
  const std::string type = opt ? opt->get_type_name().substr(0, opt->get_type_name().find(':')) : "";
  const std::string kind = type == "INT"     ? "a whole number"
                           : type == "UINT"  ? "a whole number >= 0"
                           : type == "FLOAT" ? "a number"
                                             : "of type " + type;
  return fmt::format("{}: must be {}, got '{}'", name, kind, value);
}

// The first leftover argument that looks like an option ("--bogus=1" -> "--bogus"), or "".
std::string unknown_option(const CLI::App& app) {
  for (const std::string& arg : app.remaining(/*recurse=*/true))  // a subcommand's too
    if (arg.size() > 1 && arg[0] == '-') return arg.substr(0, arg.find('='));
  return "";
}

}  // namespace

CliApp::CliApp(const std::string& description, const std::string& name) : CLI::App(description, name) {
  set_help_flag("-h,--help", "print this help and exit");
  formatter(std::make_shared<CliFormatter>());
  option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)->always_capture_default();
  allow_windows_style_options(false);
}

CLI::Option* add_named_option(CLI::App& app, const std::string& name, const std::string& help,
                              const std::vector<std::string>& choices,
                              const std::function<void(const std::string&)>& store) {
  return app.add_option_function<std::string>(name, store, help)->check(CLI::IsMember(choices));
}

bool parse_command_line(CLI::App& app, int argc, char** argv, bool print_help) {
  try {
    app.parse(argc, argv);
    return true;
  } catch (const CLI::CallForHelp&) {
    if (print_help) std::fputs(app.help().c_str(), stdout);
    return false;
  } catch (const CLI::ConversionError& e) {
    throw UsageError(fmt::format("{}; `{} --help` lists the options", conversion_message(app, e.what()),
                                 app.get_name()));
  } catch (const CLI::ParseError& e) {
    const std::string where = "`" + app.get_name() + " --help` lists the options";
    if (const std::string unknown = unknown_option(app); !unknown.empty())
      throw UsageError(fmt::format("unknown option {}; {}", unknown, where));
    throw UsageError(fmt::format("{}; {}", e.what(), where));
  }
}

std::optional<int> parse_or_exit_code(CLI::App& app, int argc, char** argv) {
  try {
    if (parse_command_line(app, argc, argv)) return std::nullopt;
    return 0;
  } catch (const UsageError& e) {
    std::fprintf(stderr, "%s: error: %s\n", app.get_name().c_str(), e.what());
    return 2;
  }
}

int run_program(const std::string& name, const std::function<int()>& body) {
  try {
    return body();
  } catch (const UsageError& e) {
    std::fprintf(stderr, "%s: error: %s\n", name.c_str(), e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", name.c_str(), e.what());
    return 1;
  }
}

}  // namespace dflash
