// Compute kernels the core serves itself on the host backing, where the backing's own kernel cannot
// serve flagos through the native route: dropout (which must draw from the flagos generator) and the
// fused recurrent cells (which the CPU does not have).
#include "backing.h"

#include <ATen/ATen.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

namespace torch_fl {
namespace {

// The host's CPU kernel for native_dropout draws from the global CPU generator; flagos dropout
// must draw from the flagos generator that torch.flagos.manual_seed controls.
std::tuple<at::Tensor, at::Tensor> native_dropout_host(const at::Tensor& input, double p, std::optional<bool> train) {
  if (input.numel() == 0 || !train.value_or(true) || p == 0) {
    return {input.clone(), at::ones_like(input, input.options().dtype(at::kBool))};
  }
  if (p == 1) {
    return {at::zeros_like(input), at::zeros_like(input, input.options().dtype(at::kBool))};
  }
  at::Tensor keep = at::empty_like(input, input.options().dtype(at::kBool));
  keep.bernoulli_(1 - p, default_generator(input.device().index()));
  return {input * keep * (1.0 / (1 - p)), keep};
}

// Recurrent layers use fused cell kernels on every non-CPU device; the host has none. These
// compute the cells from differentiable ops at the autograd level, so their backward is derived.
std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_lstm_cell_host(const at::Tensor& input_gates,
                                                                    const at::Tensor& hidden_gates,
                                                                    const at::Tensor& cx,
                                                                    const std::optional<at::Tensor>& input_bias,
                                                                    const std::optional<at::Tensor>& hidden_bias) {
  at::Tensor gates = input_gates + hidden_gates;
  if (input_bias.has_value() && input_bias->defined()) gates = gates + *input_bias;
  if (hidden_bias.has_value() && hidden_bias->defined()) gates = gates + *hidden_bias;
  auto chunks = gates.chunk(4, 1);
  at::Tensor i = chunks[0].sigmoid(), f = chunks[1].sigmoid(), g = chunks[2].tanh(), o = chunks[3].sigmoid();
  at::Tensor cy = f * cx + i * g;
  return {o * cy.tanh(), cy, at::cat({i, f, g, o}, 1)};
}

std::tuple<at::Tensor, at::Tensor> fused_gru_cell_host(const at::Tensor& input_gates, const at::Tensor& hidden_gates,
                                                       const at::Tensor& hx,
                                                       const std::optional<at::Tensor>& input_bias,
                                                       const std::optional<at::Tensor>& hidden_bias) {
  at::Tensor ig = input_bias.has_value() && input_bias->defined() ? input_gates + *input_bias : input_gates;
  at::Tensor hg = hidden_bias.has_value() && hidden_bias->defined() ? hidden_gates + *hidden_bias : hidden_gates;
  auto i = ig.chunk(3, 1);
  auto h = hg.chunk(3, 1);
  at::Tensor r = (i[0] + h[0]).sigmoid(), z = (i[1] + h[1]).sigmoid();
  at::Tensor n = (i[2] + r * h[2]).tanh();
  return {n + z * (hx - n), at::cat({r, z, n, hx, h[2]}, 1)};
}

}  // namespace

void register_backing_kernels() {
  if (!host_backed()) return;
  static torch::Library lib(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  lib.impl("native_dropout", TORCH_FN(native_dropout_host));
  static torch::Library autograd(torch::Library::IMPL, "aten", c10::DispatchKey::AutogradPrivateUse1, __FILE__,
                                 __LINE__);
  autograd.impl("_thnn_fused_lstm_cell", TORCH_FN(fused_lstm_cell_host));
  autograd.impl("_thnn_fused_gru_cell", TORCH_FN(fused_gru_cell_host));
}

}  // namespace torch_fl
