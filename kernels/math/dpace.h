#pragma once
// D-PACE position factors of one block (docs/loss.md, "Position weights"): the only copy, called by the vocab loss
// on the host for every backend (a block's p_y come back with the row values after each chunk's statistics pass).
//
// For the rows j = 0..n−1 of one block, in block-position order, with confidence q_j = p_y,j = exp(−CE_j) of the
// drafter on the label and valid_j = (w_j > 0):
//   q̃_j = α + (1 − α) q_j for a valid row, 1 for an invalid one (a multiplicative no-op)
//   C_j = Π_{i ≤ j} q̃_i                          cumulative confidence (inclusive)
//   R_j = Σ_{m ≥ j, valid m} Π_{j < i ≤ m} q̃_i   continuation value; R_j = [valid_j] + q̃_{j+1} R_{j+1}
//   dpace: C_j R_j = Σ_{m ≥ j, valid m} C_m;   cumulative confidence: C_j;   continuation value: R_j
// R is formed by its backward recursion, never as Σ C_m / C_j: no division, nothing to clamp when C_j is tiny.
// The factors are data (stop-gradient), as in every source: they reweight the row's loss, not its gradient's form.
#include <cstdint>

namespace dflash::kernels::math {

enum class DpaceFactor { dpace, cumulative_confidence, continuation_value };

// q [n] confidences, valid [n]; factor [n] (=) the row's D-PACE factor (0 for invalid rows).
inline void dpace_block_factors(const double* q, const uint8_t* valid, int n, double alpha, DpaceFactor which,
                                double* factor) {
  // forward: C_j into factor[]
  double c = 1.0;
  for (int j = 0; j < n; ++j) {
    if (valid[j]) c *= alpha + (1.0 - alpha) * q[j];
    factor[j] = c;
  }
  // backward: R_j, then the product asked for
  double r = 0.0;
  for (int j = n - 1; j >= 0; --j) {
    const double q_next = j + 1 < n && valid[j + 1] ? alpha + (1.0 - alpha) * q[j + 1] : 1.0;
    r = (valid[j] ? 1.0 : 0.0) + q_next * r;
    if (!valid[j]) {
      factor[j] = 0.0;
      continue;
    }
    switch (which) {
      case DpaceFactor::dpace: factor[j] *= r; break;
      case DpaceFactor::cumulative_confidence: break;
      case DpaceFactor::continuation_value: factor[j] = r; break;
    }
  }
}

}  // namespace dflash::kernels::math
