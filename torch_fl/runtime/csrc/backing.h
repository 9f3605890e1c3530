// The flagos device is PrivateUse1 backed by another device type (the "backing": CPU for the
// host-emulated reference chip, CUDA for CUDA-compatible chips). Everything here is generic over
// the backing: memory comes from the backing allocator, compute runs on zero-copy aliases.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Allocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/Device.h>
#include <c10/core/DispatchKey.h>

#include <string>

namespace torch_fl {

constexpr auto kFlagos = c10::DeviceType::PrivateUse1;

struct Backing {
  c10::DeviceType type = c10::DeviceType::CPU;
  c10::DispatchKey key = c10::DispatchKey::CPU;
  c10::DeviceIndex host_devices = 2;  // virtual device count when the backing is the host
  bool initialized = false;
};

// Set once by init(); read everywhere after.
const Backing& backing();
void set_backing(c10::DeviceType type, c10::DeviceIndex host_devices);
inline bool host_backed() { return backing().type == c10::DeviceType::CPU; }

c10::DeviceIndex device_count();
c10::DeviceIndex current_index();  // the current flagos device index (never -1)

// Device label translation between flagos and the backing.
c10::Device to_backing(c10::Device d);
c10::Device to_flagos(c10::Device backing_device, c10::DeviceIndex host_index);

// Owning alias: shares bytes and keeps the other tensor's storage alive (safe to hand out).
at::Tensor as_backing(const at::Tensor& t);
at::Tensor as_flagos(const at::Tensor& t, c10::DeviceIndex host_index = -1);
// Borrowing alias: no keep-alive, only valid while `t` lives (used inside one kernel call).
at::Tensor borrow_as_backing(const at::Tensor& t);
std::optional<at::Tensor> borrow_optional_as_backing(const std::optional<at::Tensor>& t);
// A backing tensor built by a backing kernel becomes a flagos tensor; its buffer is taken over
// without a copy when nothing else holds it, otherwise it is aliased.
at::Tensor adopt_as_flagos(at::Tensor&& t, c10::DeviceIndex host_index);
// A tensor sharing `flagos_storage` with the geometry and dtype of `view` (a backing view).
at::Tensor rebase_view(const at::Tensor& view, const c10::Storage& flagos_storage);

// ---- allocator and memory statistics
c10::Allocator* flagos_allocator();
// Wraps a host DataPtr so that its bytes count in the flagos statistics of `index`.
c10::DataPtr track_host(c10::DataPtr&& inner, size_t nbytes, c10::DeviceIndex index);
c10::CachingDeviceAllocator::DeviceStats device_stats(c10::DeviceIndex index);
void reset_peak_stats(c10::DeviceIndex index);
void reset_accumulated_stats(c10::DeviceIndex index);
// Grows (or shrinks) a storage's buffer on its device, keeping the common prefix.
void resize_storage_bytes(c10::StorageImpl* storage, size_t nbytes);
c10::Allocator* pinned_host_allocator();
bool is_pinned_host_ptr(const void* p);

// ---- generators (generator.cpp)
const at::Generator& default_generator(c10::DeviceIndex index);
at::Generator new_generator(c10::DeviceIndex index);
// The backing generator a flagos generator drives (same object, same state).
at::Generator backing_generator(const at::Generator& g);

// ---- registration steps run by init() in this order
void register_allocator();
void register_guard();
void register_hooks();
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

}  // namespace torch_fl
