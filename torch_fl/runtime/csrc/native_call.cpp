// The per-op facts and counters of the C++ routes, and the native route's argument aliases and
// result mapping (native_call.h).
#include "native_call.h"

#include <ATen/ATen.h>
#include <c10/core/TensorOptions.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

namespace torch_fl {
namespace {

struct Registry {
  std::mutex mu;
  std::unordered_map<const void*, std::unique_ptr<OpInfo>> by_schema;
  std::unordered_set<std::string> forced_cpu;
};
Registry& registry() {
  static Registry r;
  return r;
}

std::string full_name(const c10::OperatorHandle& op) {
  const auto& n = op.operator_name();
  return n.overload_name.empty() ? n.name : n.name + "." + n.overload_name;
}

}  // namespace

OpInfo& info_for(const c10::OperatorHandle& op) {
  // A per-thread cache keeps the shared map (and its lock) off the hot path.
  thread_local std::unordered_map<const void*, OpInfo*> cache;
  const void* key = &op.schema();
  if (auto it = cache.find(key); it != cache.end()) return *it->second;
  auto& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  auto& slot = r.by_schema[key];
  if (!slot) {
    auto info = std::make_unique<OpInfo>();
    info->name = full_name(op);
    const auto& schema = op.schema();
    for (size_t i = 0; i < schema.arguments().size(); ++i) {
      const auto& a = schema.arguments()[i];
      auto type = a.type();
      if (type->kind() == c10::TypeKind::OptionalType) {
        const auto element = type->castRaw<c10::OptionalType>()->getElementType()->kind();
        if (element == c10::TypeKind::DeviceObjType || element == c10::TypeKind::GeneratorType) {
          type = type->castRaw<c10::OptionalType>()->getElementType();  // Device? / Generator?
        }
      }
      const auto kind = type->kind();
      const auto* alias = a.alias_info();
      Arg arg = Arg::kOther;
      if (kind == c10::TypeKind::TensorType) {
        arg = alias && alias->isWrite() ? Arg::kWrite : Arg::kTensor;
      } else if (kind == c10::TypeKind::ListType || kind == c10::TypeKind::OptionalType) {
        // lists and optional tensors are inspected value by value; Tensor(a!)[] are out= lists
        arg = alias && alias->isWrite() ? Arg::kWriteList : Arg::kList;
      } else if (kind == c10::TypeKind::GeneratorType) {
        arg = Arg::kGenerator;
      } else if (kind == c10::TypeKind::DeviceObjType) {
        arg = Arg::kDevice;
      }
      if (a.name() == "generator") {
        arg = Arg::kGenerator;
        info->generator_arg = static_cast<int>(i);
      }
      info->args.push_back(arg);
    }
    const auto& returns = schema.returns();
    info->returns_fresh =
        std::none_of(returns.begin(), returns.end(), [](const c10::Argument& r) { return r.alias_info() != nullptr; });
    // Composite kernels count: on backing aliases they run as they would for the backing.
    info->backing_has_kernel = op.hasComputedKernelForDispatchKey(backing().key);
    info->backing_composite = info->backing_has_kernel && !op.hasKernelForDispatchKey(backing().key);
    info->force_cpu = r.forced_cpu.count(info->name) != 0;
    slot = std::move(info);
  }
  cache.emplace(key, slot.get());
  return *slot;
}

void KernelKey::note(const at::Tensor& t) {
  if (t.layout() == c10::kSparse) {
    if (layout == c10::kStrided) layout = c10::kSparse;
  } else if (t.layout() != c10::kStrided) {
    layout = t.layout();
  }
}

c10::DispatchKeySet KernelKey::on(c10::DeviceType type) const {
  return c10::DispatchKeySet(c10::computeDispatchKey(std::nullopt, layout, c10::Device(type)));
}

void refuse_two_devices(c10::DeviceIndex seen, c10::DeviceIndex other) {
  TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two devices, flagos:",
              static_cast<int>(seen), " and flagos:", static_cast<int>(other), "!");
}

// Invariant: the flagos argument ends up as the backing kernel left its alias, storage,
// geometry and the lazy conjugate/negative bits alike (linalg_lu_solve with left=False marks its
// out= as a conjugate view instead of conjugating the bytes).
TORCH_FL_HOT void write_back(Swap& s) {
  c10::StorageImpl* alias_si = s.alias_storage;
  const at::Tensor& original = s.original();
  c10::TensorImpl* orig = original.unsafeGetTensorImpl();
  if (alias_si->data() != s.alias_data) {
    const size_t n = alias_si->nbytes();
    c10::DataPtr grown = alias_si->set_data_ptr(c10::DataPtr(nullptr, alias_si->device()));
    c10::StorageImpl* target = original.storage().unsafeGetStorageImpl();
    const auto dev = c10::Device(kFlagos, original.device().index());
    if (host_backed()) {
      target->set_data_ptr_noswap(track_host(std::move(grown), n, dev.index()));
    } else {
      grown.unsafe_set_device(dev);
      target->set_data_ptr_noswap(std::move(grown));
    }
    target->set_nbytes(n);
  }
  const c10::TensorImpl* alias = s.alias_impl;
  if (!same_geometry(*alias, *orig)) {
    orig->set_sizes_and_strides(alias->sizes(), alias->strides(), alias->storage_offset());
  }
  if (alias->is_conj() != orig->is_conj()) orig->_set_conj(alias->is_conj());
  if (alias->is_neg() != orig->is_neg()) orig->_set_neg(alias->is_neg());
}

std::vector<at::Tensor> flagos_members(const at::Tensor& t, c10::SmallVectorImpl<Swap>& swaps, c10::DeviceIndex index) {
  std::vector<at::Tensor> members;
  for (at::Tensor m : sparse_members(t)) members.push_back(to_flagos_result(std::move(m), swaps, index));
  return members;
}

namespace {

TORCH_FL_COLD at::Tensor sparse_flagos_result(const at::Tensor& t, c10::SmallVectorImpl<Swap>& swaps,
                                              c10::DeviceIndex index) {
  return with_sparse_members(t, flagos_members(t, swaps, index), c10::Device(kFlagos, index));
}

}  // namespace

TORCH_FL_HOT at::Tensor to_flagos_result(at::Tensor&& t, c10::SmallVectorImpl<Swap>& swaps, c10::DeviceIndex index) {
  if (!t.defined() || t.device().type() != backing().type) return std::move(t);
  if (C10_UNLIKELY(is_sparse_layout(t))) return sparse_flagos_result(t, swaps, index);
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  const c10::Storage& storage = impl->unsafe_storage();  // a dense backing result
  // Each swap holds its alias and so the alias's storage: a result nothing else holds is new.
  if (t.use_count() == 1 && storage.use_count() == 1) return adopt_as_flagos(std::move(t), index);
  for (auto& s : swaps) {
    if (s.alias_impl == impl) return s.original();  // in-place and out= ops return their argument
  }
  for (auto& s : swaps) {
    if (s.alias_storage == storage.unsafeGetStorageImpl())
      return rebase_view(t, s.original().storage());  // a view of an input
  }
  return adopt_as_flagos(std::move(t), index);
}

at::Tensor NativeArguments::sparse_tensor(const at::Tensor& t, bool written) {
  kernel.note(t);
  std::vector<at::Tensor> members;
  for (const at::Tensor& m : sparse_members(t)) members.push_back(tensor(m, written));
  at::Tensor alias = with_sparse_members(t, members, to_backing(t.device()));
  sparse_swaps.push_back({t, alias, written});
  return alias;
}

// Inlined into dense and list, which run it per tensor argument.
C10_ALWAYS_INLINE void NativeArguments::swap(size_t alias, const at::Tensor& t, bool written) {
  c10::TensorImpl* impl = aliases[alias].unsafeGetTensorImpl();
  c10::StorageImpl* si = impl->unsafe_storage().unsafeGetStorageImpl();
  swaps.emplace_back(impl, si, const_cast<void*>(si->data()), &t, arguments_outlive_call ? at::Tensor() : t, written);
  any_written = any_written || written;
}

TORCH_FL_HOT size_t NativeArguments::dense(const at::Tensor& t, bool written) {
  const size_t i = unmapped(t, written);
  swap(i, t, written);
  return i;
}

TORCH_FL_HOT void NativeArguments::list(c10::ArrayRef<at::Tensor> tensors, bool written) {
  const size_t start = aliases.size();
  for (const at::Tensor& t : tensors) unmapped(t, written);
  if (lists_unmapped || (reads_unmapped && !written)) return;
  for (size_t i = 0; i < tensors.size(); ++i) swap(start + i, tensors[i], written);
}

void NativeArguments::refuse_host_operand() const {
  TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two devices, flagos:",
              static_cast<int>(index), " and ", host_operand.value_or(c10::Device(at::kCPU)), "!");
}

std::vector<RouteCounts> route_counts() {
  auto& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  std::vector<RouteCounts> out;
  for (auto& [key, info] : r.by_schema) {
    const auto native = info->native_calls.load(), cpu = info->cpu_calls.load();
    if (native || cpu) out.push_back({info->name, native, cpu});
  }
  return out;
}

void reset_route_counts() {
  auto& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  for (auto& [key, info] : r.by_schema) {
    info->native_calls = 0;
    info->cpu_calls = 0;
  }
}

void set_cpu_route(const std::string& op, bool on) {
  auto& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  if (on) {
    r.forced_cpu.insert(op);
  } else {
    r.forced_cpu.erase(op);
  }
  for (auto& [key, info] : r.by_schema) {
    if (info->name == op) info->force_cpu = on;
  }
}

}  // namespace torch_fl
