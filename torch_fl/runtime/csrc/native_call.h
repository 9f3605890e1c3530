// What the C++ routes share about one op call: the per-op facts and counters, and the native
// route's view of the arguments (backing aliases) with the mapping of the results back to flagos.
// Used by the boxed route (fallback.cpp) and the unboxed one (native_unboxed.cpp).
#pragma once

#include "backing.h"
#include "sparse.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/record_function.h>
#include <c10/util/SmallVector.h>

#include <atomic>
#include <optional>
#include <string>
#include <vector>

namespace torch_fl {

enum class Arg : uint8_t { kOther, kTensor, kWrite, kList, kWriteList, kGenerator, kDevice };

// What the routes need to know about one op's schema, computed once per op.
struct OpInfo {
  std::string name;
  std::vector<Arg> args;
  int generator_arg = -1;
  bool backing_has_kernel = true;
  // The backing's kernel is a composite of other ops (mul.Scalar's calls mul.Tensor), not its own.
  bool backing_composite = false;
  // The schema gives no return an alias annotation: no result is an argument or a view of one.
  bool returns_fresh = false;
  std::atomic<bool> force_cpu{false};
  std::atomic<bool> logged{false};
  std::atomic<uint64_t> native_calls{0};
  std::atomic<uint64_t> cpu_calls{0};
};

// The op's facts, made on its first call (thread-safe; cached per thread).
OpInfo& info_for(const c10::OperatorHandle& op);

// Adds to a route counter. The counts are statistics: a locked add on every routed call costs more
// than an increment that two threads counting the same op at the same instant may lose.
inline void tally(std::atomic<uint64_t>& counter, int64_t by = 1) {
  counter.store(counter.load(std::memory_order_relaxed) + by, std::memory_order_relaxed);
}

// Where a route's second call goes: straight to a kernel of the device that runs it, for the layout
// of the call's arguments (a compressed sparse argument over a COO one over dense ones, as the
// dispatcher picks). The first dispatch, on the flagos tensors, already ran autograd, autocast,
// functionalization and the profiler's RecordFunction; calling the op again on the aliases would
// run them all again and show every routed op twice in a profile.
struct KernelKey {
  c10::Layout layout = c10::kStrided;
  void note(const at::Tensor& t);
  c10::DispatchKeySet on(c10::DeviceType type) const;
};

// One flagos argument replaced by a backing alias for the duration of the call, as the results and
// the write-back see it (the alias itself is in NativeArguments::aliases).
struct Swap {
  c10::TensorImpl* alias_impl;
  c10::StorageImpl* alias_storage;
  void* alias_data;
  // The flagos argument. A route whose arguments outlive the call points at them: copying a tensor
  // that only Python holds takes the GIL twice (PyTorch keeps its Python object alive while C++
  // holds a second reference), per tensor argument and call. The boxed route overwrites its stack
  // with the aliases, so it keeps a reference here instead.
  const at::Tensor* argument;
  at::Tensor kept;
  bool written;
  const at::Tensor& original() const { return kept.defined() ? kept : *argument; }
};

// One flagos sparse argument replaced by a backing sparse tensor over aliases of its members.
struct SparseSwap {
  at::Tensor original;
  at::Tensor alias;
  bool written;
};

// Refuses two virtual host devices in one call (see note_device).
[[noreturn]] void refuse_two_devices(c10::DeviceIndex seen, c10::DeviceIndex other);
// Records the device of a flagos argument in `seen`; refuses two virtual host devices in one call.
inline void note_device(c10::DeviceIndex& seen, const at::Tensor& t) {
  const auto i = t.device().index();
  if (seen < 0) {
    seen = i;
  } else if (C10_UNLIKELY(seen != i) && host_backed() && t.dim() > 0) {
    // Virtual host devices share one address space; refuse mixing as a real accelerator would.
    refuse_two_devices(seen, i);
  }
}

// After the call: a write argument whose alias was resized, restrided or relabelled hands that
// back (see native_call.cpp).
void write_back(Swap& s);

// A backing result as flagos: an argument itself where the kernel returned its alias, a view of an
// argument's storage, or the backing tensor adopted.
at::Tensor to_flagos_result(at::Tensor&& t, c10::SmallVectorImpl<Swap>& swaps, c10::DeviceIndex index);
std::vector<at::Tensor> flagos_members(const at::Tensor& t, c10::SmallVectorImpl<Swap>& swaps, c10::DeviceIndex index);

// A list argument's flagos tensors and the aliases a call passes for them, by position.
struct ListAliases {
  const at::Tensor* tensors = nullptr;
  const at::Tensor* aliases = nullptr;
  size_t size = 0;
};

// The native route's view of the arguments: zero-copy backing aliases, remembered for the results
// and handed back for reuse when the call is over.
struct NativeArguments {
  Borrower borrower;  // this call's view of the thread's alias pool
  // Every dense alias of the call in borrow order, the call's one reference to each. Room for a
  // foreach op's two 8-tensor lists without a heap buffer.
  c10::SmallVector<at::Tensor, 24> aliases;
  c10::SmallVector<Swap, 6> swaps;
  std::vector<SparseSwap> sparse_swaps;
  c10::DeviceIndex index = -1;
  std::optional<c10::Device> host_operand;
  KernelKey kernel;
  // The flagos arguments outlive the call (the unboxed route's own arguments): swaps point at them.
  bool arguments_outlive_call = false;
  bool any_written = false;  // a swap is written back after the call
  // No result can be a list's member and none is written back (a void in-place op): list members
  // need no swaps.
  bool lists_unmapped = false;
  // No result can be an argument or a view of one (a dense call of an op whose returns carry no
  // alias annotation): read arguments need no swaps.
  bool reads_unmapped = false;
  ListAliases last_list;  // the last list argument borrowed

  NativeArguments() = default;
  NativeArguments(const NativeArguments&) = delete;
  NativeArguments& operator=(const NativeArguments&) = delete;
  TORCH_FL_HOT ~NativeArguments() {
    // Last borrowed, first handed back: the pool is a stack, so a call that passes the same tensors
    // again gets each the alias that already points at its bytes.
    borrower.give_back(aliases.data(), aliases.size());
  }

  // The backing alias of a flagos argument (dense or sparse), kept for the results and the write-back.
  at::Tensor tensor(const at::Tensor& t, bool written) {
    if (C10_UNLIKELY(is_sparse_layout(t))) return sparse_tensor(t, written);
    return aliases[dense(t, written)];
  }
  // A dense flagos argument's alias, as its index in `aliases`, with a swap for the results and the
  // write-back.
  size_t dense(const at::Tensor& t, bool written);
  // The same without a swap, for an argument that no result can be and that is not written back.
  size_t unmapped(const at::Tensor& t, bool written) {
    note_device(index, t);
    aliases.emplace_back(borrower.borrow(t, written));
    return aliases.size() - 1;
  }
  // A dense flagos argument's alias, with a swap unless it is read and reads_unmapped.
  size_t argument(const at::Tensor& t, bool written) {
    return written || !reads_unmapped ? dense(t, written) : unmapped(t, false);
  }
  // The aliases of a list of dense flagos tensors, appended to `aliases` in its order (with swaps
  // unless lists_unmapped, or reads_unmapped for a read list).
  void list(c10::ArrayRef<at::Tensor> tensors, bool written);
  void other_tensor(const at::Tensor& t) {
    if (host_backed() && t.defined() && t.dim() > 0) host_operand = t.device();
  }
  c10::IValue generator(const at::Generator& g) { return backing_generator(g); }
  c10::IValue device(c10::Device d) { return to_backing(d); }
  // After the call: each written argument takes what the kernel did to its alias (write_back).
  void write_back_written() {
    if (!any_written) return;
    for (auto& s : swaps) {
      if (s.written) write_back(s);
    }
  }
  // Refuses a CPU operand on the host backing, as a device kernel would (0-dim CPU tensors are
  // scalars; index lists may live on the CPU, as on CUDA).
  void check_operands() const {
    if (C10_UNLIKELY(host_operand.has_value() && index >= 0)) refuse_host_operand();
  }

 private:
  at::Tensor sparse_tensor(const at::Tensor& t, bool written);
  void swap(size_t alias, const at::Tensor& t, bool written);
  [[noreturn]] void refuse_host_operand() const;
};

// Names the route in a profile as an empty event under the op's own: the backing's kernels launch
// after it has closed, so their device time stays with the aten op (as on the backing itself)
// rather than with a route event wrapped around the launch.
// Without a profiler or other observer nothing is built: this runs on every routed call.
TORCH_FL_COLD inline void record_native_route(at::StepCallbacks&& step) {
  at::RecordFunction event(std::move(step));
  event.before("flagos.route.native");
}
// A composite backing kernel makes its own calls on the aliases, as it does on the backing, where
// the profiler folds an op's call of itself into one event when that call is its only child
// (mul.Scalar's mul.Tensor): a route event beside it would show the op twice, so such calls go
// unmarked.
TORCH_FL_HOT inline void mark_native_route(const OpInfo& info) {
  if (info.backing_composite) return;
  auto step = at::getStepCallbacksUnlessEmpty(at::RecordScope::FUNCTION);
  if (C10_UNLIKELY(step.has_value())) record_native_route(std::move(*step));
}

// Serves the hottest ops (native_unboxed.cpp) with the native route in their own signature,
// without boxing; registered before the boxed route claims the rest.
void register_unboxed_native_kernels();

}  // namespace torch_fl
