// PrivateUse1 hooks and generators. A flagos generator drives a backing generator (a CPU
// Mersenne-Twister on the host, the CUDA Philox generator on CUDA), so the backing's random
// kernels consume exactly the state the user seeded through torch.Generator(device="flagos").
#include "backing.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/GeneratorForPrivateuseone.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/GeneratorImpl.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <mutex>
#include <vector>

namespace torch_fl {
namespace {

struct FlagosGenerator final : c10::GeneratorImpl {
  at::Generator inner;
  FlagosGenerator(at::Generator g, c10::DeviceIndex index)
      : c10::GeneratorImpl(c10::Device(kFlagos, index), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
        inner(std::move(g)) {}
  void set_current_seed(uint64_t seed) override { inner.set_current_seed(seed); }
  void set_offset(uint64_t offset) override { inner.set_offset(offset); }
  uint64_t get_offset() const override { return inner.get_offset(); }
  uint64_t current_seed() const override { return inner.current_seed(); }
  uint64_t seed() override { return inner.seed(); }
  void set_state(const c10::TensorImpl& state) override { inner.unsafeGetGeneratorImpl()->set_state(state); }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override { return inner.unsafeGetGeneratorImpl()->get_state(); }

 private:
  FlagosGenerator* clone_impl() const override { return new FlagosGenerator(inner.clone(), device().index()); }
};

c10::DeviceIndex resolve(c10::DeviceIndex i) { return i < 0 ? current_index() : i; }

at::Generator fresh_backing_generator(c10::DeviceIndex i) {
  if (host_backed()) return at::detail::createCPUGenerator(c10::default_rng_seed_val);
  return at::detail::getCUDAHooks().getNewGenerator(i);
}

at::Generator default_backing_generator(c10::DeviceIndex i) {
  // Each virtual host device gets its own stream of numbers (not the global CPU generator), so
  // torch.flagos.manual_seed does not disturb CPU randomness. On CUDA the flagos default generator
  // is the CUDA default generator of that GPU: flagos dropout equals CUDA dropout.
  if (host_backed()) return fresh_backing_generator(i);
  return at::detail::getCUDAHooks().getDefaultGenerator(i);
}

struct FlagosHooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasPrimaryContext(c10::DeviceIndex i) const override {
    return host_backed() || at::detail::getCUDAHooks().hasPrimaryContext(i);
  }
  c10::DeviceIndex deviceCount() const override { return device_count(); }
  c10::DeviceIndex getCurrentDevice() const override { return current_index(); }
  void setCurrentDevice(c10::DeviceIndex i) const override {
    c10::impl::getDeviceGuardImpl(kFlagos)->setDevice({kFlagos, i});
  }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex i) const override {
    return c10::impl::getDeviceGuardImpl(kFlagos)->exchangeDevice({kFlagos, i}).index();
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex i) const override { return exchangeDevice(i); }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex i) const override { return default_generator(i); }
  at::Generator getNewGenerator(c10::DeviceIndex i) const override { return new_generator(i); }
  at::Device getDeviceFromPtr(void* p) const override {
    if (host_backed()) return {kFlagos, current_index()};
    return {kFlagos, at::detail::getCUDAHooks().getDeviceFromPtr(p).index()};
  }
  bool isPinnedPtr(const void* p) const override {
    return host_backed() ? is_pinned_host_ptr(p) : at::detail::getCUDAHooks().isPinnedPtr(p);
  }
  at::Allocator* getPinnedMemoryAllocator() const override {
    return host_backed() ? pinned_host_allocator() : at::detail::getCUDAHooks().getPinnedMemoryAllocator();
  }
  void resizePrivateUse1Bytes(const c10::Storage& s, size_t n) const override {
    resize_storage_bytes(s.unsafeGetStorageImpl(), n);
  }
};

}  // namespace

const at::Generator& default_generator(c10::DeviceIndex index) {
  static std::once_flag once;
  static std::vector<at::Generator> gens;
  std::call_once(once, [] {
    for (c10::DeviceIndex d = 0; d < device_count(); ++d)
      gens.push_back(at::make_generator<FlagosGenerator>(default_backing_generator(d), d));
  });
  const auto i = resolve(index);
  TORCH_CHECK(i < static_cast<c10::DeviceIndex>(gens.size()), "Invalid flagos device index ", static_cast<int>(i));
  return gens[i];
}

at::Generator new_generator(c10::DeviceIndex index) {
  const auto i = resolve(index);
  return at::make_generator<FlagosGenerator>(fresh_backing_generator(i), i);
}

at::Generator backing_generator(const at::Generator& g) {
  if (!g.defined() || g.device().type() != kFlagos) return g;
  return g.get<FlagosGenerator>()->inner;
}

void register_hooks() {
  static FlagosHooks hooks;
  at::RegisterPrivateUse1HooksInterface(&hooks);
}

}  // namespace torch_fl
