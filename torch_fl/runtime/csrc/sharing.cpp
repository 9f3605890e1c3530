// Sharing host-backed flagos memory with other processes. As a CPU tensor's share_memory_() does,
// the bytes of a flagos storage move into a shared-memory CPU storage, in place (every tensor on
// that storage follows); that CPU storage then travels through PyTorch's own multiprocessing path
// and is aliased as flagos on the other side.
#include "backing.h"

#include <ATen/ATen.h>

#include <cstring>

namespace torch_fl {

at::Tensor host_bytes(const at::Tensor& t) {
  const c10::Storage* held = held_storage(untracked(t.storage().data_ptr()));
  if (held == nullptr) return {};
  return at::empty({0}, at::TensorOptions().dtype(at::kByte)).set_(*held);
}

void move_host_storage(const at::Tensor& t, const at::Tensor& cpu_bytes) {
  TORCH_CHECK(host_backed(), "flagos memory moves into host shared memory only on the host backing");
  TORCH_CHECK(t.device().type() == kFlagos, "expected a flagos tensor, got one on ", t.device());
  TORCH_CHECK(cpu_bytes.device().is_cpu(), "expected a CPU byte tensor, got one on ", cpu_bytes.device());
  c10::StorageImpl* si = t.storage().unsafeGetStorageImpl();
  const size_t n = si->nbytes();
  TORCH_CHECK(cpu_bytes.storage().nbytes() >= n, "the shared buffer holds ", cpu_bytes.storage().nbytes(),
              " bytes; the flagos storage needs ", n);
  if (n) std::memcpy(cpu_bytes.storage().mutable_data(), si->data(), n);
  si->set_data_ptr_noswap(
      track_host(hold_storage(cpu_bytes.storage(), c10::Device(c10::DeviceType::CPU)), n, si->device().index()));
}

}  // namespace torch_fl
