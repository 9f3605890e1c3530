// The flagos device is PrivateUse1 backed by another device type (the "backing": CPU for the
// host-emulated reference chip, CUDA for CUDA-compatible chips). Everything here is generic over
// the backing: memory comes from the backing allocator, compute runs on zero-copy aliases.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Allocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/Device.h>
#include <c10/core/DeviceCapability.h>
#include <c10/core/DispatchKey.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <atomic>
#include <bit>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

// The functions every routed call runs: grouped in the library's hot text section, so that a call
// touches fewer instruction-cache lines and pages (in a model they are evicted between calls).
#define TORCH_FL_HOT __attribute__((hot))
// The rare branches of those functions, out of line in the cold text section: a routed call then
// reads only the cache lines of the branches it takes (in a model, each line is a miss).
#define TORCH_FL_COLD __attribute__((cold, noinline))

namespace torch_fl {

constexpr auto kFlagos = c10::DeviceType::PrivateUse1;

struct Backing {
  c10::DeviceType type = c10::DeviceType::CPU;
  c10::DispatchKey key = c10::DispatchKey::CPU;
  c10::DispatchKeySet keys{c10::DispatchKey::CPU};  // {key}, built once: the routes redispatch to it per call
  // A backing tensor's keys that name its backend (its backend bit and autocast keys), and the
  // flagos keys that replace them when it is adopted: what _change_backend_component_keys computes
  // from the two devices on every call.
  c10::BackendComponent backend = c10::BackendComponent::CPUBit;
  c10::DispatchKeySet backend_keys;
  c10::DispatchKeySet flagos_backend_keys;
  c10::DeviceIndex host_devices = 2;  // virtual device count when the backing is the host
  bool initialized = false;
};

namespace detail {
// Set once by set_backing(); read on every routed call, so defined here for the compiler to inline.
inline Backing g_backing;
}  // namespace detail
inline const Backing& backing() { return detail::g_backing; }
void set_backing(c10::DeviceType type, c10::DeviceIndex host_devices);
inline bool host_backed() { return backing().type == c10::DeviceType::CPU; }
inline bool is_flagos(const at::Tensor& t) { return t.defined() && t.device().type() == kFlagos; }

// Protected TensorImpl fields that the routes read or set where the public accessors would check
// policies, or the setters recompute, what a flagos dense tensor never changes. (A pointer to a
// protected member, formed in a derived class, may be applied to any TensorImpl.)
struct ImplFields : c10::TensorImpl {
  static const c10::impl::SizesAndStrides& geometry(const c10::TensorImpl& t) {
    return t.*&ImplFields::sizes_and_strides_;
  }
  static int64_t offset(const c10::TensorImpl& t) { return t.*&ImplFields::storage_offset_; }
  // The stored element count, which numel() returns unless the sizes are symbolic or custom.
  static int64_t numel(const c10::TensorImpl& t) { return t.*&ImplFields::numel_; }
  static void set_device(c10::TensorImpl& t, c10::Device d) { t.*& ImplFields::device_opt_ = d; }
  static void set_dtype(c10::TensorImpl& t, caffe2::TypeMeta dtype) { t.*& ImplFields::data_type_ = dtype; }
  static c10::DispatchKeySet& keys(c10::TensorImpl& t) { return t.*&ImplFields::key_set_; }
};

c10::DeviceIndex device_count();
c10::DeviceIndex current_index();  // the current flagos device index (never -1)

// A Device assembled in one 16-bit value. GCC builds a Device a byte at a time on the stack, and a
// later copy or comparison of the whole reads it back with one 16-bit load, which the CPU cannot
// forward from the two byte stores: a stall that perf put at a fifth of the alias pool's cycles.
inline c10::Device packed_device(c10::DeviceType type, c10::DeviceIndex index) {
  static_assert(sizeof(c10::Device) == 2 && std::is_trivially_copyable_v<c10::Device>);
  const auto bits = static_cast<uint16_t>(static_cast<uint8_t>(type) | static_cast<uint8_t>(index) << 8);
  return std::bit_cast<c10::Device>(bits);
}

// Device label translation between flagos and the backing.
inline c10::Device to_backing(c10::Device d) {
  if (host_backed()) return packed_device(c10::DeviceType::CPU, -1);
  return packed_device(backing().type, d.has_index() ? d.index() : current_index());
}
inline c10::Device to_flagos(c10::Device backing_device, c10::DeviceIndex host_index) {
  if (host_backed()) return packed_device(kFlagos, host_index >= 0 ? host_index : current_index());
  return packed_device(kFlagos, backing_device.index());
}

// Equal sizes, strides and storage offset of two dense tensors, compared inline over the fields
// themselves: the routes check this per tensor argument, and IntArrayRef's comparison calls memcmp
// twice. (SizesAndStrides' own == also compares the stale slots past the rank.)
inline bool same_geometry(const c10::TensorImpl& a, const c10::TensorImpl& b) {
  const c10::impl::SizesAndStrides& ga = ImplFields::geometry(a);
  const c10::impl::SizesAndStrides& gb = ImplFields::geometry(b);
  const size_t n = ga.size();
  if (n != gb.size() || ImplFields::offset(a) != ImplFields::offset(b)) return false;
  const int64_t *a_sizes = ga.sizes_data(), *b_sizes = gb.sizes_data();
  const int64_t *a_strides = ga.strides_data(), *b_strides = gb.strides_data();
  for (size_t i = 0; i < n; ++i) {
    if (a_sizes[i] != b_sizes[i] || a_strides[i] != b_strides[i]) return false;
  }
  return true;
}

// Owning alias: shares bytes and keeps the other tensor's storage alive (safe to hand out).
at::Tensor as_backing(const at::Tensor& t);
at::Tensor as_flagos(const at::Tensor& t, c10::DeviceIndex host_index = -1);
// A backing tensor as flagos: over the flagos storage it aliases where it is an owning alias of one
// (as_backing's), so that a round trip ends on the program's own storage; otherwise an owning alias
// (as_flagos).
at::Tensor as_flagos_over_source(const at::Tensor& t);
// A backing tensor over a flagos tensor's bytes that takes over their ownership: its storage frees
// the buffer through the backing allocator's own deleter (which CUDA graph trees require of the
// outputs they manage), and the flagos storage keeps it alive. An owning alias (as_backing) where
// the buffer is not the backing allocator's, and on the host backing.
at::Tensor hand_to_backing(const at::Tensor& t);
// Borrowing aliases for one call, drawn from this thread's pool of aliases that earlier calls
// handed back: a route makes one per call, so the pool is looked up once rather than per argument.
class AliasPool;
class Borrower {
 public:
  Borrower();
  // A borrowing alias: no keep-alive, only valid while `t` lives (used inside one kernel call), which
  // the kernel may write where `written`.
  at::Tensor borrow(const at::Tensor& t, bool written);
  // One taken as if written, for callers whose kernels are not sorted into readers and writers.
  at::Tensor borrow(const at::Tensor& t) { return borrow(t, true); }
  // Hands a borrowed alias back after its call, for reuse (kept only when nothing else holds it).
  void give_back(at::Tensor&& alias);
  // Hands back a call's `n` aliases, borrowed in this order, last first.
  void give_back(at::Tensor* aliases, size_t n);

 private:
  AliasPool& pool_;
};
inline at::Tensor borrow_as_backing(const at::Tensor& t) { return Borrower().borrow(t); }
std::optional<at::Tensor> borrow_optional_as_backing(const std::optional<at::Tensor>& t);
// A backing tensor built by a backing kernel becomes a flagos tensor; its buffer is taken over
// without a copy when nothing else holds it, otherwise it is aliased.
at::Tensor adopt_as_flagos(at::Tensor&& t, c10::DeviceIndex host_index);
// A tensor sharing `flagos_storage` with the geometry and dtype of `view` (a backing view).
at::Tensor rebase_view(const at::Tensor& view, const c10::Storage& flagos_storage);
// A DataPtr over the bytes of `s`, labelled `device`, that keeps `s` alive (what owning aliases use).
c10::DataPtr hold_storage(const c10::Storage& s, c10::Device device);
// The storage a DataPtr made by hold_storage keeps alive; nullptr for any other DataPtr.
const c10::Storage* held_storage(const c10::DataPtr& dp);

// ---- allocator and memory statistics
c10::Allocator* flagos_allocator();
// Wraps a host DataPtr so that its bytes count in the flagos statistics of `index`.
c10::DataPtr track_host(c10::DataPtr&& inner, size_t nbytes, c10::DeviceIndex index);
// The DataPtr a tracked host DataPtr wraps (`dp` itself when it is not tracked).
const c10::DataPtr& untracked(const c10::DataPtr& dp);
c10::CachingDeviceAllocator::DeviceStats device_stats(c10::DeviceIndex index);
void reset_peak_stats(c10::DeviceIndex index);
void reset_accumulated_stats(c10::DeviceIndex index);
// Grows (or shrinks) a storage's buffer on its device, keeping the common prefix.
void resize_storage_bytes(c10::StorageImpl* storage, size_t nbytes);
c10::Allocator* pinned_host_allocator();
bool is_pinned_host_ptr(const void* p);  // any address inside a live pinned buffer

// ---- sharing with other processes (sharing.cpp)
// The CPU storage whose bytes a host-backed flagos tensor's storage uses, as a byte tensor over all
// of it (undefined when the flagos storage owns plain allocator memory).
at::Tensor host_bytes(const at::Tensor& t);
// Copies the flagos storage of `t` into `cpu_bytes` (a CPU buffer at least as large, typically in
// shared memory) and makes the storage use those bytes from now on.
void move_host_storage(const at::Tensor& t, const at::Tensor& cpu_bytes);

// ---- device capability (capability.cpp)
void set_supported_dtypes(const std::vector<c10::ScalarType>& dtypes);
c10::DeviceCapability device_capability();

// ---- generators (hooks.cpp)
const at::Generator& default_generator(c10::DeviceIndex index);
at::Generator new_generator(c10::DeviceIndex index);
// The backing generator a flagos generator drives (same object, same state).
at::Generator backing_generator(const at::Generator& g);

// ---- registration steps run by init() in this order
void register_allocator();
void register_guard();
void register_hooks();
void register_profiler_stubs();
void register_backing_kernels();
void register_attention_kernels();
void enable_native_route();

// ---- per-op statistics of the C++ routes (fallback.cpp)
struct RouteCounts {
  std::string op;
  uint64_t native = 0;
  uint64_t cpu = 0;
};
std::vector<RouteCounts> route_counts();
void reset_route_counts();
// Forces the explicit CPU route for one op ("aten::name.overload"), or clears it.
void set_cpu_route(const std::string& op, bool on);
void set_log_cpu_fallback(bool on);
// The native route itself: the backing's kernel on aliases (or the cpu route where it has none).
void native_route(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// ---- route filters (route_filter.cpp)
// One named extent of a call (torch_fl/routing/extents.py measures the same): generic when
// `arg` < 0 (0: the numel of the box of all tensor arguments, 1: its rank, 2: its last dim),
// else dimension `dim` of tensor argument `arg` (0 when that argument has no such dimension).
struct ExtentRef {
  int64_t arg = -1;
  int64_t dim = 0;
};
struct RouteSpan {
  std::optional<c10::ScalarType> dtype;  // of the first tensor argument; none: any
  int64_t min_numel = 0;
  int64_t max_numel = -1;                           // of the largest tensor argument; < 0: no bound
  std::vector<std::pair<int64_t, int64_t>> limits;  // per ExtentRef: inclusive (min, max; < 0: none)
};
struct RouteFilterHandle {
  explicit RouteFilterHandle(c10::RegistrationHandleRAII r, std::shared_ptr<std::atomic<int64_t>> outside)
      : registration(std::move(r)), outside(std::move(outside)) {}
  c10::RegistrationHandleRAII registration;
  std::shared_ptr<std::atomic<int64_t>> outside;  // calls a span's dtype and size took but its extents refused
};
// Puts a filter in front of `op` ("aten::name.overload"): calls in `spans` (measured by `refs`
// where a span has limits) go to its Python route kernel (registered on PrivateUse2), the others
// to the native route, or to PyTorch's composite when `composite` (what serves the op on flagos
// without a route kernel).
std::shared_ptr<RouteFilterHandle> install_route_filter(const std::string& op, const std::vector<RouteSpan>& spans,
                                                        const std::vector<ExtentRef>& refs, bool composite);

}  // namespace torch_fl
