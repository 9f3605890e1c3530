// Sparse layouts on flagos: COO tensors (SparsePrivateUse1) and the compressed layouts CSR, CSC,
// BSR and BSC (SparseCsrPrivateUse1). A sparse tensor is structure (sizes, sparse and dense
// dimensions, the coalesced flag) around dense member tensors (indices and values; compressed
// and plain indices and values), so it is aliased member by member: the native route runs the
// backing's sparse kernels on a backing sparse tensor whose members alias the flagos members.
// Construction and the accessors of structure and members are structural kernels, as for dense.
#include "backing.h"
#include "sparse.h"

#include <ATen/ATen.h>
#include <ATen/SparseCsrTensorUtils.h>
#include <ATen/native/SparseTensorUtils.h>
#include <ATen/ops/_coalesced_native.h>
#include <ATen/ops/_indices_native.h>
#include <ATen/ops/_nnz_native.h>
#include <ATen/ops/_sparse_compressed_tensor_unsafe_native.h>
#include <ATen/ops/_sparse_coo_tensor_with_dims_and_tensors_native.h>
#include <ATen/ops/_sparse_coo_tensor_with_dims_native.h>
#include <ATen/ops/_values_native.h>
#include <ATen/ops/ccol_indices_native.h>
#include <ATen/ops/col_indices_native.h>
#include <ATen/ops/crow_indices_native.h>
#include <ATen/ops/dense_dim_native.h>
#include <ATen/ops/empty_native.h>
#include <ATen/ops/indices_native.h>
#include <ATen/ops/is_coalesced_native.h>
#include <ATen/ops/row_indices_native.h>
#include <ATen/ops/sparse_dim_native.h>
#include <ATen/ops/values_native.h>
#include <torch/library.h>

namespace torch_fl {

std::vector<at::Tensor> sparse_members(const at::Tensor& t) {
  if (t.layout() == at::kSparse) {
    const auto* impl = at::sparse::get_sparse_impl(t);
    return {impl->indices(), impl->values()};
  }
  const auto* impl = at::sparse_csr::get_sparse_csr_impl(t);
  return {impl->compressed_indices(), impl->plain_indices(), impl->values()};
}

at::Tensor with_sparse_members(const at::Tensor& like, const std::vector<at::Tensor>& members, c10::Device device) {
  const auto options = like.options().device(device);
  if (like.layout() == at::kSparse) {
    return at::native::new_with_dims_and_tensor_sparse_symint(
        like.sparse_dim(), like.dense_dim(), like.sym_sizes(), members[0], members[1], options.dtype().toScalarType(),
        at::kSparse, device, std::nullopt, at::sparse::get_sparse_impl(like)->coalesced());
  }
  return at::native::_sparse_compressed_tensor_unsafe_symint(members[0], members[1], members[2], like.sym_sizes(),
                                                             options.dtype().toScalarType(), like.layout(), device);
}

at::Tensor backing_sparse_alias(const at::Tensor& t) {
  std::vector<at::Tensor> members;
  for (const at::Tensor& m : sparse_members(t)) members.push_back(borrow_as_backing(m));
  return with_sparse_members(t, members, to_backing(t.device()));
}

void set_sparse_structure(const at::Tensor& target, const at::Tensor& source, const std::vector<at::Tensor>& members) {
  if (target.layout() == at::kSparse) {
    auto* impl = at::sparse::get_sparse_impl(target);
    impl->raw_resize_(source.sparse_dim(), source.dense_dim(), source.sizes());
    impl->set_indices_and_values_unsafe(members[0], members[1]);
    impl->set_coalesced(at::sparse::get_sparse_impl(source)->coalesced());
    return;
  }
  at::sparse_csr::get_sparse_csr_impl(target)->set_member_tensors(members[0], members[1], members[2], source.sizes());
}

void register_sparse_kernels() {
  // Construction and structure: read or build the flagos sparse tensor itself (its members are
  // flagos tensors), never through the route.
  static torch::Library coo(torch::Library::IMPL, "aten", c10::DispatchKey::SparsePrivateUse1, __FILE__, __LINE__);
  coo.impl("_sparse_coo_tensor_with_dims", TORCH_FN(at::native::new_with_dims_sparse));
  coo.impl("_sparse_coo_tensor_with_dims_and_tensors", TORCH_FN(at::native::new_with_dims_and_tensor_sparse_symint));
  coo.impl("empty.memory_format", TORCH_FN(at::native::empty_sparse_symint));
  coo.impl("_indices", TORCH_FN(at::native::_indices_sparse));
  coo.impl("_values", TORCH_FN(at::native::_values_sparse));
  coo.impl("indices", TORCH_FN(at::native::indices_sparse));
  coo.impl("values", TORCH_FN(at::native::values_sparse));
  coo.impl("_nnz", TORCH_FN(at::native::_nnz_sparse));
  coo.impl("sparse_dim", TORCH_FN(at::native::sparse_dim_sparse));
  coo.impl("dense_dim", TORCH_FN(at::native::dense_dim_sparse));
  coo.impl("is_coalesced", TORCH_FN(at::native::is_coalesced_sparse));
  coo.impl("_coalesced_", TORCH_FN(at::native::_coalesced_sparse_));

  static torch::Library compressed(torch::Library::IMPL, "aten", c10::DispatchKey::SparseCsrPrivateUse1, __FILE__,
                                   __LINE__);
  compressed.impl("empty.memory_format", TORCH_FN(at::native::empty_sparse_compressed_symint));
  compressed.impl("crow_indices", TORCH_FN(at::native::crow_indices_sparse_csr));
  compressed.impl("col_indices", TORCH_FN(at::native::col_indices_sparse_csr));
  compressed.impl("ccol_indices", TORCH_FN(at::native::ccol_indices_sparse_csr));
  compressed.impl("row_indices", TORCH_FN(at::native::row_indices_sparse_csr));
  compressed.impl("values", TORCH_FN(at::native::values_sparse_csr));
  compressed.impl("_nnz", TORCH_FN(at::native::_nnz_sparse_csr));
  compressed.impl("sparse_dim", TORCH_FN(at::native::sparse_dim_sparse_csr));
  compressed.impl("dense_dim", TORCH_FN(at::native::dense_dim_sparse_csr));
}

}  // namespace torch_fl
