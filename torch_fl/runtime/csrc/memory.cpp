// Memory: the flagos allocator delegates to the backing device's allocator and relabels the
// DataPtr as flagos. On the host the bytes are tracked here (the CPU allocator keeps no
// statistics); on CUDA the caching allocator's own statistics are the source of truth.
#include "backing.h"
#include "constants.h"

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <array>
#include <cstring>
#include <mutex>
#include <iterator>
#include <map>

#include <unistd.h>

namespace torch_fl {
namespace {

constexpr auto kAggregate = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);

struct HostStats {
  std::mutex mu;
  std::array<c10::CachingDeviceAllocator::DeviceStats, kMaxHostDevices> per_device;
};
HostStats& host_stats() {
  static HostStats s;
  return s;
}

void count_alloc(c10::DeviceIndex idx, size_t n) {
  auto& s = host_stats();
  std::lock_guard<std::mutex> g(s.mu);
  auto& d = s.per_device.at(idx);
  for (auto* stat : {&d.allocated_bytes[kAggregate], &d.reserved_bytes[kAggregate], &d.active_bytes[kAggregate],
                     &d.requested_bytes[kAggregate]})
    stat->increase(n);
  d.allocation[kAggregate].increase(1);
  d.segment[kAggregate].increase(1);
  d.active[kAggregate].increase(1);
  d.num_device_alloc++;
}

void count_free(c10::DeviceIndex idx, size_t n) {
  auto& s = host_stats();
  std::lock_guard<std::mutex> g(s.mu);
  auto& d = s.per_device.at(idx);
  for (auto* stat : {&d.allocated_bytes[kAggregate], &d.reserved_bytes[kAggregate], &d.active_bytes[kAggregate],
                     &d.requested_bytes[kAggregate]})
    stat->decrease(n);
  d.allocation[kAggregate].decrease(1);
  d.segment[kAggregate].decrease(1);
  d.active[kAggregate].decrease(1);
  d.num_device_free++;
}

struct TrackedCtx {
  c10::DataPtr inner;
  size_t nbytes;
  c10::DeviceIndex index;
};

void delete_tracked(void* ctx) {
  auto* c = static_cast<TrackedCtx*>(ctx);
  count_free(c->index, c->nbytes);
  delete c;
}

c10::DeviceAllocator* backing_device_allocator() { return c10::getDeviceAllocator(backing().type); }

struct FlagosAllocator final : c10::DeviceAllocator {
  c10::DataPtr allocate(size_t n) override {
    if (host_backed()) {
      const auto idx = current_index();
      if (n == 0) return {nullptr, c10::Device(kFlagos, idx)};
      return track_host(c10::GetCPUAllocator()->allocate(n), n, idx);
    }
    // Allocates on the backing's current device, which the flagos guard keeps in step.
    c10::DataPtr dp = c10::GetAllocator(backing().type)->allocate(n);
    dp.unsafe_set_device(packed_device(kFlagos, dp.device().index()));
    return dp;
  }
  c10::DeleterFnPtr raw_deleter() const override {
    return host_backed() ? nullptr : c10::GetAllocator(backing().type)->raw_deleter();
  }
  void copy_data(void* dst, const void* src, std::size_t n) const override {
    if (host_backed()) {
      std::memcpy(dst, src, n);
    } else {
      c10::GetAllocator(backing().type)->copy_data(dst, src, n);
    }
  }
  bool initialized() override { return backing().initialized; }
  void emptyCache(c10::MempoolId_t id) override {
    if (!host_backed()) backing_device_allocator()->emptyCache(id);
  }
  void recordStream(const c10::DataPtr& ptr, c10::Stream stream) override {
    if (host_backed()) return;
    c10::impl::getDeviceGuardImpl(kFlagos)->recordDataPtrOnStream(ptr, stream);
  }
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex idx) override { return device_stats(idx); }
  void resetAccumulatedStats(c10::DeviceIndex idx) override { reset_accumulated_stats(idx); }
  void resetPeakStats(c10::DeviceIndex idx) override { reset_peak_stats(idx); }
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex idx) override {
    if (!host_backed()) return backing_device_allocator()->getMemoryInfo(idx);
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    return {static_cast<size_t>(sysconf(_SC_AVPHYS_PAGES)) * page, static_cast<size_t>(sysconf(_SC_PHYS_PAGES)) * page};
  }
};

FlagosAllocator g_allocator;

// Pinned host memory has no meaning on the host backing, but PyTorch asks for it (pin_memory(),
// DataLoader); handing out tracked host memory keeps is_pinned() truthful. Buffers are kept by
// address range, because a tensor may view any address inside one (as CUDA answers too).
struct PinnedHostAllocator final : c10::Allocator {
  std::mutex mu;
  std::map<uintptr_t, size_t> live;  // start address -> size in bytes
  static void del(void* p) {
    auto* self = static_cast<PinnedHostAllocator*>(pinned_host_allocator());
    {
      std::lock_guard<std::mutex> g(self->mu);
      self->live.erase(reinterpret_cast<uintptr_t>(p));
    }
    c10::free_cpu(p);
  }
  c10::DataPtr allocate(size_t n) override {
    void* p = n ? c10::alloc_cpu(n) : nullptr;
    if (p) {
      std::lock_guard<std::mutex> g(mu);
      live.emplace(reinterpret_cast<uintptr_t>(p), n);
    }
    return {p, p, &del, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &del; }
  void copy_data(void* dst, const void* src, std::size_t n) const override { std::memcpy(dst, src, n); }
};
PinnedHostAllocator g_pinned;

}  // namespace

c10::Allocator* flagos_allocator() { return &g_allocator; }

void register_allocator() { c10::SetAllocator(kFlagos, &g_allocator); }
c10::Allocator* pinned_host_allocator() { return &g_pinned; }

bool is_pinned_host_ptr(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> g(g_pinned.mu);
  auto after = g_pinned.live.upper_bound(address);  // the first buffer starting past p
  if (after == g_pinned.live.begin()) return false;
  const auto& [start, size] = *std::prev(after);
  return address < start + size;
}

const c10::DataPtr& untracked(const c10::DataPtr& dp) {
  if (dp.get_deleter() != &delete_tracked) return dp;
  return static_cast<const TrackedCtx*>(dp.get_context())->inner;
}

c10::DataPtr track_host(c10::DataPtr&& inner, size_t nbytes, c10::DeviceIndex index) {
  void* data = inner.get();
  count_alloc(index, nbytes);
  auto* ctx = new TrackedCtx{std::move(inner), nbytes, index};
  return {data, ctx, &delete_tracked, packed_device(kFlagos, index)};
}

c10::CachingDeviceAllocator::DeviceStats device_stats(c10::DeviceIndex idx) {
  if (!host_backed()) return backing_device_allocator()->getDeviceStats(idx);
  auto& s = host_stats();
  std::lock_guard<std::mutex> g(s.mu);
  return s.per_device.at(idx);
}

void reset_peak_stats(c10::DeviceIndex idx) {
  if (!host_backed()) return backing_device_allocator()->resetPeakStats(idx);
  auto& s = host_stats();
  std::lock_guard<std::mutex> g(s.mu);
  auto& d = s.per_device.at(idx);
  // Peaks restart from what is live now: live allocations are never forgotten.
  for (auto* arr : {&d.allocated_bytes, &d.reserved_bytes, &d.active_bytes, &d.requested_bytes, &d.allocation,
                    &d.segment, &d.active})
    for (auto& stat : *arr) stat.reset_peak();
}

void reset_accumulated_stats(c10::DeviceIndex idx) {
  if (!host_backed()) return backing_device_allocator()->resetAccumulatedStats(idx);
  auto& s = host_stats();
  std::lock_guard<std::mutex> g(s.mu);
  auto& d = s.per_device.at(idx);
  for (auto* arr : {&d.allocated_bytes, &d.reserved_bytes, &d.active_bytes, &d.requested_bytes, &d.allocation,
                    &d.segment, &d.active})
    for (auto& stat : *arr) stat.reset_accumulated();
  d.num_device_alloc = d.num_device_free = 0;
}

void resize_storage_bytes(c10::StorageImpl* storage, size_t nbytes) {
  TORCH_CHECK(storage->resizable(), "Trying to resize storage that is not resizable");
  c10::DeviceGuard guard(storage->device());
  c10::DataPtr fresh = g_allocator.allocate(nbytes);
  const size_t keep = std::min(nbytes, storage->nbytes());
  if (keep && storage->data()) {
    if (host_backed()) {
      std::memcpy(fresh.get(), storage->data(), keep);
    } else {
      // Device-to-device on the current stream, through the backing's own copy kernel.
      const auto dev = to_backing(storage->device());
      auto bytes = [&](void* p) {
        return at::from_blob(p, {static_cast<int64_t>(keep)}, at::TensorOptions().dtype(at::kByte).device(dev));
      };
      bytes(fresh.get()).copy_(bytes(storage->mutable_data()));
    }
  }
  storage->set_data_ptr_noswap(std::move(fresh));
  storage->set_nbytes(nbytes);
}

}  // namespace torch_fl
