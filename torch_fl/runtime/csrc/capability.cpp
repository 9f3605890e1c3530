// What torch.accelerator.get_device_capability() reports for flagos: the dtypes the platform's
// descriptor declares (capabilities.dtypes), the same on every backing, so a program asks the
// platform rather than whatever the backing device could represent.
#include "backing.h"

#include <mutex>

namespace torch_fl {
namespace {

std::mutex g_mu;
c10::DeviceCapability g_capability;  // every dtype until the platform declares its own

}  // namespace

void set_supported_dtypes(const std::vector<c10::ScalarType>& dtypes) {
  c10::DeviceCapability cap;
  cap.capability_data.capability_bits = 0;
  for (const auto dtype : dtypes) {
#define FLAGOS_SET_DTYPE(_1, name) \
  if (dtype == c10::ScalarType::name) cap.capability_data.supported_scalar_types.has_##name = 1;
    AT_FORALL_SCALAR_TYPES_WITH_COMPLEX_AND_QINTS(FLAGOS_SET_DTYPE)
#undef FLAGOS_SET_DTYPE
  }
  std::lock_guard<std::mutex> g(g_mu);
  g_capability = cap;
}

c10::DeviceCapability device_capability() {
  std::lock_guard<std::mutex> g(g_mu);
  return g_capability;
}

}  // namespace torch_fl
