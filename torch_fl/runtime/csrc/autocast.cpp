// Autocast for flagos follows PyTorch's own op lists (the ones CUDA uses), through PyTorch's own
// autocast wrappers instantiated for the PrivateUse1 device type.
#include <ATen/autocast_mode.h>
#include <torch/library.h>

// Older PyTorch lists name ops taking named dimensions, spelled unqualified in its macros.
#if __has_include(<ATen/core/Dimname.h>)
#include <ATen/core/Dimname.h>
using at::DimnameList;
#endif

namespace {
using at::Tensor;
using c10::IntArrayRef;
using c10::Scalar;
using c10::ScalarType;
}  // namespace

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
#define FLAGOS_LOWER(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define FLAGOS_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define FLAGOS_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define FLAGOS_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)
  AT_FORALL_LOWER_PRECISION_FP(FLAGOS_LOWER)
  AT_FORALL_FP32(FLAGOS_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(FLAGOS_FP32_SET_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
  AT_FORALL_PROMOTE(FLAGOS_PROMOTE)
#undef FLAGOS_LOWER
#undef FLAGOS_FP32
#undef FLAGOS_FP32_SET_OPT_DTYPE
#undef FLAGOS_PROMOTE
}
