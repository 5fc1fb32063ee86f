// safetensors_compare A.safetensors B.safetensors [--rtol R]: same tensor names and shapes, and per tensor
//   max |a − b| / max |b| ≤ R.
// Prints the worst tensor; exit 0 when all pass, 1 otherwise.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>

#include "lib/core/args.h"
#include "lib/io/safetensors.h"

using namespace dflash;

int main(int argc, char** argv) {
  try {
    Args args(argc, argv, {"rtol"});
    if (args.positional().size() != 2) {
      std::fprintf(stderr, "usage: safetensors_compare A B [--rtol R]\n");
      return 2;
    }
    const double rtol = args.real("rtol", 1e-5);
    io::SafetensorsFile a(args.positional()[0]), b(args.positional()[1]);
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
