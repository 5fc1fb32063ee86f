#pragma once
// The vocab loss's exp (float: the Cephes polynomial, ≤ 2 ulp, vectorisable; double: exp) under its CPU name. The
// one definition, shared with the CUDA row passes, is kernels/math/loss_exp.h.
#include "kernels/math/loss_exp.h"

namespace dflash::cpu {

using kernels::math::loss_exp;

}  // namespace dflash::cpu
