// The structural kernels: allocation, views, resizing, copies and scalar reads. They act on
// flagos tensors themselves (views share the flagos storage), never through the native route.
#include "backing.h"

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/native/DispatchStub.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/is_set_to_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <ATen/ops/view_native.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

namespace torch_fl {
namespace {

const auto kFlagosKeys = c10::DispatchKeySet(c10::DispatchKey::PrivateUse1);

at::Tensor empty_memory_format(at::IntArrayRef size, std::optional<at::ScalarType> dtype, std::optional<at::Layout>,
                               std::optional<at::Device> device, std::optional<bool>,
                               std::optional<at::MemoryFormat> memory_format) {
  c10::OptionalDeviceGuard guard(device);
  return at::detail::empty_generic(size, flagos_allocator(), kFlagosKeys, c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(at::IntArrayRef size, at::IntArrayRef stride, std::optional<at::ScalarType> dtype,
                         std::optional<at::Layout>, std::optional<at::Device> device, std::optional<bool>) {
  c10::OptionalDeviceGuard guard(device);
  return at::detail::empty_strided_generic(size, stride, flagos_allocator(), kFlagosKeys, c10::dtype_or_default(dtype));
}

// A ZeroTensor (autograd's "this gradient is zero") has no memory: PyTorch's ZeroTensor fallback
// materialises it when an op needs values. Built on flagos itself so it keeps its ZeroTensor key.
struct NoMemory final : c10::Allocator {
  c10::DataPtr allocate(size_t) override { return {nullptr, c10::Device(kFlagos, current_index())}; }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void*, const void*, std::size_t) const override {}
};
NoMemory g_no_memory;

at::Tensor efficient_zero_tensor(at::IntArrayRef size, std::optional<at::ScalarType> dtype, std::optional<at::Layout>,
                                 std::optional<at::Device> device, std::optional<bool>) {
  c10::OptionalDeviceGuard guard(device);
  return at::detail::empty_generic(size, &g_no_memory, kFlagosKeys | c10::DispatchKeySet(c10::DispatchKey::ZeroTensor),
                                   c10::dtype_or_default(dtype), std::nullopt);
}

at::Tensor view(const at::Tensor& self, c10::SymIntArrayRef size) {
  return at::native::view(self, C10_AS_INTARRAYREF_SLOW(size));
}

at::Tensor reshape_alias(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride) {
  return at::native::_reshape_alias(self, C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride));
}

const at::Tensor& resize(const at::Tensor& self, c10::SymIntArrayRef size, std::optional<at::MemoryFormat> format) {
  const auto sizes = C10_AS_INTARRAYREF_SLOW(size);
  const size_t needed =
      at::detail::computeStorageNbytesContiguous(sizes, self.dtype().itemsize(), self.storage_offset());
  c10::StorageImpl* storage = self.storage().unsafeGetStorageImpl();
  // Grow on the device first, so the generic resize below only restrides (it would memcpy).
  if (needed > storage->nbytes()) resize_storage_bytes(storage, needed);
  return at::native::resize_(self, sizes, format);
}

// copy_ with a flagos side: the backing's copy on aliases of the flagos sides, which handles
// host<->device, device<->device, dtype conversion and conjugate/negative bits on the current
// stream. Straight to the backing's kernel: PyTorch's generic copy_ sends a device it does not know
// to _copy_from, whose copy of the aliases went through the dispatcher again (the generic checks
// twice, and a cast recorded as copy_, _copy_from and copy_ in a profile).
at::Tensor& copy(at::Tensor& self, const at::Tensor& src, bool non_blocking) {
  if (self.is_same(src)) return self;
  Borrower borrower;
  const bool to_flagos = is_flagos(self), from_flagos = is_flagos(src);
  at::Tensor target = to_flagos ? borrower.borrow(self, true) : self;
  at::Tensor source = from_flagos ? borrower.borrow(src, false) : src;
  at::_ops::copy_::redispatch(backing().keys, target, source, non_blocking);
  // Last borrowed, first handed back, as the native route does: a repeated copy gets each alias back.
  if (from_flagos) borrower.give_back(std::move(source));
  if (to_flagos) borrower.give_back(std::move(target));
  return self;
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  at::Tensor target = dst;
  return copy(target, self, non_blocking);
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  resize(dst, self.sym_sizes(), std::nullopt);
  return copy_from(self, dst, false);
}

at::Scalar local_scalar_dense(const at::Tensor& self) { return at::_local_scalar_dense(borrow_as_backing(self)); }

at::Tensor& set_empty(at::Tensor& self) {
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0, flagos_allocator()->allocate(0), flagos_allocator(), true);
  return self.set_(storage, 0, {0}, {});
}

at::Tensor& set_source_tensor(at::Tensor& self, const at::Tensor& source) {
  return at::native::set_tensor_(self, source);
}

at::Tensor& set_source_storage(at::Tensor& self, at::Storage source) { return at::native::set_(self, source); }

at::Tensor& set_source_storage_offset(at::Tensor& self, at::Storage source, c10::SymInt offset,
                                      c10::SymIntArrayRef size, c10::SymIntArrayRef stride) {
  return at::native::set_storage_cpu_(self, source, offset.expect_int(), C10_AS_INTARRAYREF_SLOW(size),
                                      C10_AS_INTARRAYREF_SLOW(stride));
}

// PyTorch's rule (TensorImpl::has_compatible_shallow_copy_type) lists the dense backends it knows
// and leaves PrivateUse1 to the device. A dense flagos tensor is a plain TensorImpl over a plain
// storage, as a dense CPU or CUDA one is, so `param.data = moved` may cross between them; that is
// what lets Module._apply move a Parameter in place (keeping tied parameters one object) and what
// `set_data` checks. Invariant: compatible exactly when PyTorch says so, or when both tensors are
// dense on flagos or on a backend PyTorch counts as dense.
bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  if (self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set())) return true;
  const c10::DispatchKeySet dense_backends({c10::BackendComponent::PrivateUse1Bit, c10::BackendComponent::CPUBit,
                                            c10::BackendComponent::CUDABit, c10::BackendComponent::MPSBit,
                                            c10::BackendComponent::HIPBit, c10::BackendComponent::XPUBit,
                                            c10::BackendComponent::HPUBit, c10::BackendComponent::MTIABit});
  auto dense = [&](c10::DispatchKeySet ks) {
    return ks.has_any(c10::DispatchKeySet(c10::DispatchKey::Dense)) && ks.has_any(dense_backends);
  };
  return dense(self.key_set()) && dense(from.key_set());
}

void record_stream(at::Tensor& self, c10::Stream stream) {
  c10::impl::getDeviceGuardImpl(kFlagos)->recordDataPtrOnStream(self.storage().data_ptr(), stream);
}

}  // namespace

}  // namespace torch_fl

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  using namespace torch_fl;
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided);
  m.impl("_efficientzerotensor", efficient_zero_tensor);
  m.impl("as_strided", at::native::as_strided_tensorimpl);
  m.impl("view", view);
  m.impl("_reshape_alias", reshape_alias);
  m.impl("unfold", at::native::unfold);
  m.impl("view_as_real", at::native::view_as_real);
  m.impl("view_as_complex", at::native::view_as_complex);
  m.impl("is_set_to", at::native::is_set_to);
  m.impl("resize_", resize);
  m.impl("copy_", copy);
  m.impl("_copy_from", copy_from);
  m.impl("_copy_from_and_resize", copy_from_and_resize);
  m.impl("_local_scalar_dense", local_scalar_dense);
  m.impl("set_", set_empty);
  m.impl("set_.source_Tensor", set_source_tensor);
  m.impl("set_.source_Storage", set_source_storage);
  m.impl("set_.source_Storage_storage_offset", set_source_storage_offset);
  m.impl("record_stream", record_stream);
  m.impl("_has_compatible_shallow_copy_type", has_compatible_shallow_copy_type);
}

// _copy_from honours conjugate and negative bits itself (the backing copy kernel resolves them);
// PyTorch's generic resolution of those bits would clone, which copies, which recurses.
TORCH_LIBRARY_IMPL(aten, Conjugate, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}
TORCH_LIBRARY_IMPL(aten, Negative, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}
