// safetensors_compare A.safetensors B.safetensors [--rtol R]: same tensor names and shapes, and per tensor
//   max |a − b| / max |b| ≤ R.
// Prints the worst tensor; exit 0 when all pass, 1 otherwise.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <exception>

#include "lib/core/cli_app.h"
#include "lib/io/safetensors.h"

using namespace dflash;

int main(int argc, char** argv) {
  try {
    CliApp app("Compares two safetensors files tensor by tensor.", "safetensors_compare");
    std::string path_a, path_b;
    double rtol = 1e-5;
    app.add_option("A", path_a, "a safetensors file")->required()->type_name("FILE");
    app.add_option("B", path_b, "the other")->required()->type_name("FILE");
    app.add_option("--rtol", rtol, "relative tolerance");
    if (const std::optional<int> rc = parse_or_exit_code(app, argc, argv)) return *rc;
    io::SafetensorsFile a(path_a), b(path_b);
    if (a.names() != b.names()) {
      std::fprintf(stderr, "tensor names differ\n");
      return 1;
    }
    double worst = 0;
    std::string worst_name;
    for (const auto& name : a.names()) {
      if (a.info(name).shape != b.info(name).shape) {
        std::fprintf(stderr, "%s: shapes %s vs %s\n", name.c_str(), a.info(name).shape_str().c_str(),
                     b.info(name).shape_str().c_str());
        return 1;
      }
      const auto x = a.read(name), y = b.read(name);
      double diff = 0, ref = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        diff = std::max(diff, double(std::abs(x[i] - y[i])));
        ref = std::max(ref, double(std::abs(y[i])));
      }
      const double rel = ref > 0 ? diff / ref : diff;
      if (rel >= worst) worst = rel, worst_name = name;
    }
    std::printf("%zu tensors; worst max|a-b|/max|b| = %.3e (%s); limit %.1e\n", a.names().size(), worst,
                worst_name.c_str(), rtol);
    return worst <= rtol ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "safetensors_compare: %s\n", e.what());
    return 1;
  }
}
