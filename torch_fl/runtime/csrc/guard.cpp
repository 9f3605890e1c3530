// Device guard, streams and events. On a device backing (CUDA) everything forwards to the backing's
// guard with the device type relabelled; on the host backing, flagos has `host_devices` virtual
// devices, labelled streams and timestamp events, so device indices, guards and Event timing
// behave as on a real accelerator (work on the host is synchronous, so waits are no-ops).
#include "backing.h"
#include "constants.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <array>
#include <atomic>
#include <chrono>

namespace torch_fl {
namespace {

thread_local c10::DeviceIndex tl_host_device = 0;
thread_local std::array<c10::StreamId, kMaxHostDevices> tl_host_stream{};
std::atomic<c10::StreamId> g_next_host_stream{1};

struct HostEvent {
  std::chrono::steady_clock::time_point when;
};

void check_host_index(c10::DeviceIndex i) {
  TORCH_CHECK(i >= 0 && i < backing().host_devices, "Invalid device index ", static_cast<int>(i), ": flagos has ",
              static_cast<int>(backing().host_devices), " device(s) on this platform");
}

c10::DeviceIndex norm(c10::Device d) { return d.has_index() ? d.index() : tl_host_device; }

struct HostGuard final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kFlagos; }
  c10::Device exchangeDevice(c10::Device d) const override {
    const auto old = tl_host_device;
    setDevice(d);
    return packed_device(kFlagos, old);
  }
  c10::Device getDevice() const override { return packed_device(kFlagos, tl_host_device); }
  void setDevice(c10::Device d) const override {
    check_host_index(norm(d));
    tl_host_device = norm(d);
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override { tl_host_device = norm(d); }
  c10::Stream getStream(c10::Device d) const override {
    const auto i = norm(d);
    return c10::Stream(c10::Stream::UNSAFE, {kFlagos, i}, tl_host_stream.at(i));
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::UNSAFE, {kFlagos, norm(d)}, 0);
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool) const override { return getNewStream(d, 0); }
  c10::Stream getNewStream(c10::Device d, int) const override {
    return c10::Stream(c10::Stream::UNSAFE, {kFlagos, norm(d)}, g_next_host_stream++);
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    const auto old = getStream(s.device());
    tl_host_stream.at(s.device_index()) = s.id();
    return old;
  }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    delete static_cast<HostEvent*>(event);
  }
  void record(void** event, const c10::Stream&, const c10::DeviceIndex, const c10::EventFlag) const override {
    if (*event == nullptr) *event = new HostEvent();
    static_cast<HostEvent*>(*event)->when = std::chrono::steady_clock::now();
  }
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  c10::DeviceIndex deviceCount() const noexcept override { return backing().host_devices; }
  c10::DeviceCapability getDeviceCapability(c10::Device) const override { return device_capability(); }
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream&) const override {}
  void synchronizeEvent(void*) const override {}
  void synchronizeDevice(const c10::DeviceIndex) const override {}
  void recordDataPtrOnStream(const c10::DataPtr&, const c10::Stream&) const override {}
  double elapsedTime(void* start, void* end, const c10::DeviceIndex) const override {
    TORCH_CHECK(start && end, "Both events must be recorded before calculating elapsed time.");
    const auto dt = static_cast<HostEvent*>(end)->when - static_cast<HostEvent*>(start)->when;
    return std::chrono::duration<double, std::milli>(dt).count();
  }
};

c10::Stream on_backing(const c10::Stream& s) {
  return c10::Stream(c10::Stream::UNSAFE, to_backing(s.device()), s.id());
}
c10::Stream on_flagos(const c10::Stream& s) {
  return c10::Stream(c10::Stream::UNSAFE, {kFlagos, s.device_index()}, s.id());
}

// Streams and events are the backing's own objects; only the device type on their labels changes.
struct ForwardingGuard final : c10::impl::DeviceGuardImplInterface {
  const c10::impl::DeviceGuardImplInterface* b;
  explicit ForwardingGuard(const c10::impl::DeviceGuardImplInterface* inner) : b(inner) {}
  c10::Device fl(c10::Device d) const { return packed_device(kFlagos, d.index()); }
  c10::DeviceType type() const override { return kFlagos; }
  c10::Device exchangeDevice(c10::Device d) const override { return fl(b->exchangeDevice(to_backing(d))); }
  c10::Device getDevice() const override { return fl(b->getDevice()); }
  void setDevice(c10::Device d) const override { b->setDevice(to_backing(d)); }
  void uncheckedSetDevice(c10::Device d) const noexcept override { b->uncheckedSetDevice(to_backing(d)); }
  c10::Stream getStream(c10::Device d) const override { return on_flagos(b->getStream(to_backing(d))); }
  c10::Stream getDefaultStream(c10::Device d) const override { return on_flagos(b->getDefaultStream(to_backing(d))); }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool high) const override {
    return on_flagos(b->getStreamFromGlobalPool(to_backing(d), high));
  }
  c10::Stream getNewStream(c10::Device d, int priority) const override {
    return on_flagos(b->getNewStream(to_backing(d), priority));
  }
  c10::Stream exchangeStream(c10::Stream s) const override { return on_flagos(b->exchangeStream(on_backing(s))); }
  void* getStreamNativeHandle(const c10::Stream s) const override { return b->getStreamNativeHandle(on_backing(s)); }
  void destroyEvent(void* e, const c10::DeviceIndex i) const noexcept override { b->destroyEvent(e, i); }
  void record(void** e, const c10::Stream& s, const c10::DeviceIndex i, const c10::EventFlag f) const override {
    b->record(e, on_backing(s), i, f);
  }
  void block(void* e, const c10::Stream& s) const override { b->block(e, on_backing(s)); }
  bool queryEvent(void* e) const override { return b->queryEvent(e); }
  c10::DeviceIndex deviceCount() const noexcept override { return b->deviceCount(); }
  c10::DeviceCapability getDeviceCapability(c10::Device) const override { return device_capability(); }
  bool queryStream(const c10::Stream& s) const override { return b->queryStream(on_backing(s)); }
  void synchronizeStream(const c10::Stream& s) const override { b->synchronizeStream(on_backing(s)); }
  void synchronizeEvent(void* e) const override { b->synchronizeEvent(e); }
  void synchronizeDevice(const c10::DeviceIndex i) const override { b->synchronizeDevice(i); }
  void recordDataPtrOnStream(const c10::DataPtr& dp, const c10::Stream& s) const override {
    // Only blocks the backing allocator owns can be recorded (borrowed aliases are not).
    if (!dp.get() || dp.get_deleter() != c10::GetAllocator(backing().type)->raw_deleter()) return;
    // A stand-in DataPtr labelled with the backing device, carrying the allocator's deleter (the
    // allocator checks it). Invariant: it never owns the block: release_context() drops the context
    // before its destructor could run the deleter, so the block is freed once, by `dp`'s owner.
    c10::DataPtr view(dp.get(), dp.get_context(), dp.get_deleter(), to_backing(dp.device()));
    b->recordDataPtrOnStream(view, on_backing(s));
    (void)view.release_context();
  }
  double elapsedTime(void* a, void* e, const c10::DeviceIndex i) const override { return b->elapsedTime(a, e, i); }
};

}  // namespace

c10::DeviceIndex device_count() {
  return host_backed() ? backing().host_devices : c10::impl::getDeviceGuardImpl(backing().type)->deviceCount();
}

c10::DeviceIndex current_index() {
  return host_backed() ? tl_host_device : c10::impl::getDeviceGuardImpl(backing().type)->getDevice().index();
}

void register_guard() {
  static const c10::impl::DeviceGuardImplInterface* impl =
      host_backed() ? static_cast<const c10::impl::DeviceGuardImplInterface*>(new HostGuard())
                    : new ForwardingGuard(c10::impl::getDeviceGuardImpl(backing().type));
  static c10::impl::DeviceGuardImplRegistrar registrar(kFlagos, impl);
}

}  // namespace torch_fl
