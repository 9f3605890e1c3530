// Scaled-dot-product attention. PyTorch asks a per-device stub which fused backend to use; flagos
// answers with the backing's own choice (cuDNN / flash / efficient on CUDA). On the host, where the
// backing's choice is CPU flash attention, flagos answers PrivateUse1's own "overrideable" backend
// and serves it with the CPU's fused kernels on zero-copy aliases: without that hook, SDPA on a
// device that is not the CPU has no way to reach the CPU's flash attention by itself.
#include "backing.h"
#include "native_call.h"

#include <ATen/ATen.h>
#include <ATen/Operators.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/SDPBackend.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <algorithm>
#include <numeric>

namespace torch_fl {
namespace {

// The SDPA choice only reads metadata. Under torch.compile it is asked of tensors without bytes to
// alias (FakeTensors, functional and other Python wrappers, while tracing modes are active): the
// backing then gets an uninitialised tensor of the same sizes, strides, dtype and requires_grad,
// and the backing's choice runs outside those modes, which would otherwise trace it.
const c10::DispatchKeySet kTracing({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot,
                                    c10::DispatchKey::Functionalize, c10::DispatchKey::PreDispatch});

// A flagos tensor with bytes to alias, outside any tracing mode.
bool has_flagos_bytes(const at::Tensor& t) {
  return t.has_storage() && t.storage().device_type() == kFlagos && !t.key_set().has_any(kTracing);
}

// The alias carries requires_grad too: the backing's choice depends on it (a mask that wants a
// gradient keeps the math path).
at::Tensor backing_for_choice(const at::Tensor& t) {
  at::Tensor b = has_flagos_bytes(t)
                     ? borrow_as_backing(t)
                     : at::empty_strided(t.sizes(), t.strides(), t.options().device(to_backing(t.device())));
  return t.requires_grad() ? b.requires_grad_(true) : b;
}

// Marks pooled aliases as wanting a gradient for one choice, and clears the mark (their autograd
// metadata) before they go back to the pool, whose later borrowers expect plain tensors.
class GradMarks {
 public:
  GradMarks() = default;
  GradMarks(const GradMarks&) = delete;
  GradMarks& operator=(const GradMarks&) = delete;
  void mark(const at::Tensor& alias) {
    alias.unsafeGetTensorImpl()->set_requires_grad(true);
    marked_.push_back(alias.unsafeGetTensorImpl());
  }
  ~GradMarks() {
    for (c10::TensorImpl* impl : marked_) impl->set_autograd_meta(nullptr);
  }

 private:
  c10::SmallVector<c10::TensorImpl*, 4> marked_;
};

// The backing's own choice, straight from its kernel, on aliases from the route's pool (handed back
// as the native route hands back its own): what an eager attention call asks every time (a decode
// step and a training step, once per layer), without a second pass through the dispatcher, whose
// profiler event neither CPU nor CUDA records (they ask the choice directly).
int64_t pooled_choice(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor* mask,
                      double dropout_p, bool is_causal, std::optional<double> scale, bool enable_gqa) {
  NativeArguments args;
  args.arguments_outlive_call = true;
  GradMarks marks;  // declared after `args`: cleared before the aliases go back
  // No tensor results: the arguments need no swaps. An alias to mark is taken as a written one,
  // which is never an inference tensor outside inference mode (those cannot want a gradient).
  auto take = [&](const at::Tensor& t) {
    const size_t i = args.unmapped(t, t.requires_grad());
    if (t.requires_grad()) marks.mark(args.aliases[i]);
    return i;
  };
  const size_t iq = take(q), ik = take(k), iv = take(v);
  std::optional<at::Tensor> m;  // released before `args` hands the aliases back
  if (mask != nullptr) m = args.aliases[take(*mask)];
  return at::_ops::_fused_sdp_choice::redispatch(backing().keys, args.aliases[iq], args.aliases[ik], args.aliases[iv],
                                                 m, dropout_p, is_causal, scale, enable_gqa);
}

int64_t fused_sdp_choice(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const std::optional<at::Tensor>& mask, double dropout_p, bool is_causal,
                         std::optional<double> scale, bool enable_gqa) {
  const bool has_mask = mask.has_value() && mask->defined();
  int64_t choice = 0;
  if (has_flagos_bytes(q) && has_flagos_bytes(k) && has_flagos_bytes(v) && (!has_mask || has_flagos_bytes(*mask))) {
    choice = pooled_choice(q, k, v, has_mask ? &*mask : nullptr, dropout_p, is_causal, scale, enable_gqa);
  } else {
    c10::impl::ExcludeDispatchKeyGuard outside_tracing(kTracing);
    std::optional<at::Tensor> m;
    if (has_mask) m = backing_for_choice(*mask);
    choice = at::_fused_sdp_choice(backing_for_choice(q), backing_for_choice(k), backing_for_choice(v), m, dropout_p,
                                   is_causal, scale, enable_gqa);
  }
  if (host_backed() && choice == static_cast<int64_t>(at::SDPBackend::flash_attention) &&
      at::globalContext().userEnabledOverrideableSDP()) {
    return static_cast<int64_t>(at::SDPBackend::overrideable);
  }
  return choice;
}

// The output in the layout PyTorch's meta kernel promises for this op (the query's dimension
// order), so eager and compiled code see the same strides; the CPU kernel writes (B, S, H, D).
// Its logsumexp, (B, S, H) transposed, is made contiguous (B, H, S) for the same reason.
at::Tensor in_query_layout(const at::Tensor& query, at::Tensor out) {
  at::Tensor target;
  if (query.sizes() == out.sizes()) {
    target = at::empty_like(query);
  } else {
    std::vector<int64_t> order(query.dim());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return query.stride(a) > query.stride(b); });
    std::vector<int64_t> strides(query.dim());
    int64_t stride = 1;
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
      strides[*it] = stride;
      stride *= out.size(*it);
    }
    target = at::empty_strided(out.sizes(), strides, out.options());
  }
  if (target.strides() == out.strides()) return out;
  return target.copy_(out);
}

using Forward = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, c10::SymInt, c10::SymInt, at::Tensor,
                           at::Tensor, at::Tensor>;

Forward fused_attention_host(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                             const std::optional<at::Tensor>& attn_bias, double dropout_p, bool is_causal,
                             bool /*return_debug_mask*/, std::optional<double> scale) {
  const auto index = query.device().index();
  auto [out, logsumexp] = at::_scaled_dot_product_flash_attention_for_cpu(
      borrow_as_backing(query), borrow_as_backing(key), borrow_as_backing(value), dropout_p, is_causal,
      borrow_optional_as_backing(attn_bias), scale);
  // No random state (the CPU kernels take no dropout) and no sequence offsets (not varlen).
  const auto seed_options = query.options().dtype(at::kLong);
  return {in_query_layout(query, adopt_as_flagos(std::move(out), index)),
          adopt_as_flagos(logsumexp.contiguous(), index),
          at::Tensor(),
          at::Tensor(),
          query.sym_size(-2),
          key.sym_size(-2),
          at::empty({}, seed_options),
          at::empty({}, seed_options),
          at::Tensor()};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> fused_attention_host_backward(
    const at::Tensor& grad_out, const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    const at::Tensor& attn_bias, std::array<bool, 4> /*grad_input_mask*/, const at::Tensor& out,
    const at::Tensor& logsumexp, const at::Tensor& /*cum_seq_q*/, const at::Tensor& /*cum_seq_k*/, int64_t /*max_q*/,
    int64_t /*max_k*/, double dropout_p, bool is_causal, const at::Tensor& /*philox_seed*/,
    const at::Tensor& /*philox_offset*/, std::optional<double> scale) {
  const auto index = query.device().index();
  std::optional<at::Tensor> mask;
  if (attn_bias.defined()) mask = borrow_as_backing(attn_bias);
  auto [gq, gk, gv] = at::_scaled_dot_product_flash_attention_for_cpu_backward(
      borrow_as_backing(grad_out), borrow_as_backing(query), borrow_as_backing(key), borrow_as_backing(value),
      borrow_as_backing(out), borrow_as_backing(logsumexp), dropout_p, is_causal, mask, scale);
  // A mask that wants a gradient never gets here: the CPU, and so fused_sdp_choice, answers math.
  return {adopt_as_flagos(std::move(gq), index), adopt_as_flagos(std::move(gk), index),
          adopt_as_flagos(std::move(gv), index), at::Tensor()};
}

}  // namespace

void register_attention_kernels() {
  static torch::Library lib(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  // torch._fused_sdp_choice answers what SDPA itself asks the stub (below)
  lib.impl("_fused_sdp_choice", TORCH_FN(fused_sdp_choice));
  if (!host_backed()) return;
  lib.impl("_scaled_dot_product_fused_attention_overrideable", TORCH_FN(fused_attention_host));
  lib.impl("_scaled_dot_product_fused_attention_overrideable_backward", TORCH_FN(fused_attention_host_backward));
}

}  // namespace torch_fl

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &torch_fl::fused_sdp_choice)
}
