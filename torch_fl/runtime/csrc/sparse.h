// Sparse layouts on flagos (sparse.cpp): a sparse tensor is structure around dense member tensors,
// which the routes alias one by one.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <vector>

namespace torch_fl {

inline bool is_sparse_layout(const at::Tensor& t) { return t.defined() && t.layout() != at::kStrided; }
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
