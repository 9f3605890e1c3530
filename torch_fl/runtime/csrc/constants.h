// Limits shared by the core's translation units, in one place.
#pragma once

#include <cstddef>

namespace torch_fl {

// A host-backed platform emulates at most this many devices: per-device state (current streams,
// allocator statistics) lives in fixed arrays indexed by device, so the limit is checked once, in
// set_backing, and every array is sized by it.
constexpr std::size_t kMaxHostDevices = 16;

}  // namespace torch_fl
