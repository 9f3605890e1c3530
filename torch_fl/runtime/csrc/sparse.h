// Sparse layouts on flagos (sparse.cpp): a sparse tensor is structure around dense member tensors,
// which the routes alias one by one.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <vector>

namespace torch_fl {

// Any layout but strided: what TensorImpl::layout() tests first, read from the key set alone (the
// routes ask it per tensor argument, and layout() itself is not inlined into the core).
C10_ALWAYS_INLINE bool is_sparse_layout(const at::Tensor& t) {
  constexpr c10::DispatchKeySet not_strided = c10::sparse_ks | c10::sparse_csr_ks | c10::mkldnn_ks;
  return t.defined() && t.unsafeGetTensorImpl()->key_set().has_any(not_strided);
}
// COO: {indices, values}; compressed layouts: {compressed indices, plain indices, values}.
std::vector<at::Tensor> sparse_members(const at::Tensor& t);
// A sparse tensor on `device` with the layout, sizes, dtype and flags of `like` over `members`.
at::Tensor with_sparse_members(const at::Tensor& like, const std::vector<at::Tensor>& members, c10::Device device);
// A backing sparse tensor over borrowing aliases of a flagos sparse tensor's members.
at::Tensor backing_sparse_alias(const at::Tensor& t);
// `target` takes the sizes, dimensions and flags of `source`, with `members` as its members.
void set_sparse_structure(const at::Tensor& target, const at::Tensor& source, const std::vector<at::Tensor>& members);

// Construction and structure of flagos sparse tensors (registered by init()).
void register_sparse_kernels();

}  // namespace torch_fl
