// Profiler stubs for the flagos device: what PyTorch's profiler calls to time device work when it
// profiles `use_device="flagos"` (the legacy PrivateUse1 state). Without them every event got
// an unset device time (negative totals) and every op logged an assert. On a CUDA backing the
// work is CUDA work on the current stream, so the CUDA stubs (CUDA events) serve it; on the host
// backing the device works synchronously, so a steady-clock stamp is its event.
#include "backing.h"

#include <c10/core/DeviceGuard.h>
#include <c10/util/ApproximateClock.h>
#include <torch/csrc/profiler/stubs/base.h>

#include <chrono>
#include <memory>

namespace torch_fl {
namespace {

using torch::profiler::impl::ProfilerStubs;
using torch::profiler::impl::ProfilerVoidEventStub;

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct HostStubs final : ProfilerStubs {
  void record(c10::DeviceIndex* device, ProfilerVoidEventStub* event, int64_t* cpu_ns) const override {
    if (device) *device = current_index();
    *event = std::make_shared<int64_t>(steady_ns());
    if (cpu_ns) *cpu_ns = c10::getTime();
  }
  float elapsed(const ProfilerVoidEventStub* start, const ProfilerVoidEventStub* end) const override {
    if (!start || !*start || !end || !*end) return 0.f;
    const auto ns = *static_cast<const int64_t*>(end->get()) - *static_cast<const int64_t*>(start->get());
    return static_cast<float>(ns) / 1000.f;  // microseconds
  }
  // The host has no annotation tool to forward names to.
  void mark(const char*) const override {}
  void rangePush(const char*) const override {}
  void rangePop() const override {}
  bool enabled() const override { return true; }
  void onEachDevice(std::function<void(int)> op) const override {
    c10::DeviceGuard guard(c10::Device(kFlagos, 0));
    for (c10::DeviceIndex i = 0; i < device_count(); ++i) {
      guard.set_index(i);
      op(i);
    }
  }
  void synchronize() const override {}
};

// Flagos work on a CUDA backing is CUDA work: CUDA's own stubs time it on the current stream.
struct CudaBackedStubs final : ProfilerStubs {
  static const ProfilerStubs* cuda() { return torch::profiler::impl::cudaStubs(); }
  void record(c10::DeviceIndex* device, ProfilerVoidEventStub* event, int64_t* cpu_ns) const override {
    cuda()->record(device, event, cpu_ns);
  }
  float elapsed(const ProfilerVoidEventStub* start, const ProfilerVoidEventStub* end) const override {
    return cuda()->elapsed(start, end);
  }
  void mark(const char* name) const override { cuda()->mark(name); }
  void rangePush(const char* name) const override { cuda()->rangePush(name); }
  void rangePop() const override { cuda()->rangePop(); }
  bool enabled() const override { return cuda()->enabled(); }
  void onEachDevice(std::function<void(int)> op) const override { cuda()->onEachDevice(std::move(op)); }
  void synchronize() const override { cuda()->synchronize(); }
};

}  // namespace

void register_profiler_stubs() {
  static HostStubs host;
  static CudaBackedStubs cuda_backed;
  torch::profiler::impl::registerPrivateUse1Methods(host_backed() ? static_cast<ProfilerStubs*>(&host)
                                                                  : static_cast<ProfilerStubs*>(&cuda_backed));
}

}  // namespace torch_fl
