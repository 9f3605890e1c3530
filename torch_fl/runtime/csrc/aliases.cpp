// The backing state and zero-copy aliases between flagos and backing tensors: the same bytes seen
// with another device label, which is what lets any backing kernel run on flagos memory.
#include "backing.h"
#include "constants.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <array>
#include <memory>
#include <vector>

namespace torch_fl {
namespace {

// A tensor over `storage` with the geometry, dtype and conj/neg bits of `like`. Not TensorImpl's
// VIEW constructor: it takes the key set as given, and one without autograd keys makes an inference
// tensor, which autograd refuses to save for the backward.
at::Tensor like_over(const at::Tensor& like, c10::Storage&& storage, c10::DispatchKey key) {
  auto r = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(key), like.dtype());
  r.unsafeGetTensorImpl()->set_sizes_and_strides(like.sizes(), like.strides(), like.storage_offset());
  if (like.is_conj()) r._set_conj(true);
  if (like.is_neg()) r._set_neg(true);
  return r;
}

// A TensorImpl over `dp` with the geometry, dtype and conj/neg bits of `like`.
at::Tensor wrap(const at::Tensor& like, c10::DataPtr&& dp, size_t nbytes, c10::DispatchKey key,
                c10::Allocator* allocator, bool resizable) {
  return like_over(like, c10::Storage(c10::Storage::use_byte_size_t(), nbytes, std::move(dp), allocator, resizable),
                   key);
}

void delete_storage(void* ctx) { delete static_cast<c10::Storage*>(ctx); }

// An owning alias keeps the aliased storage alive through its DataPtr context.
at::Tensor owning_alias(const at::Tensor& t, c10::Device device, c10::DispatchKey key, c10::Allocator* a,
                        bool resizable) {
  return wrap(t, hold_storage(t.storage(), device), t.storage().nbytes(), key, a, resizable);
}

// A borrowing alias: the bytes of `t` labelled `device`, with no keep-alive. `resizable` through the
// backing allocator where a kernel may grow it (an out= argument).
at::Tensor borrowing_alias(const at::Tensor& t, c10::Device device, bool resizable) {
  const c10::Storage& s = t.storage();
  return wrap(t, c10::DataPtr(s.mutable_data(), device), s.nbytes(), backing().key, c10::GetAllocator(backing().type),
              resizable);
}

}  // namespace

c10::DataPtr hold_storage(const c10::Storage& s, c10::Device device) {
  auto* keep = new c10::Storage(s);
  void* data = keep->mutable_data();
  return c10::DataPtr(data, keep, &delete_storage, device);
}

const c10::Storage* held_storage(const c10::DataPtr& dp) {
  return dp.get_deleter() == &delete_storage ? static_cast<const c10::Storage*>(dp.get_context()) : nullptr;
}

void set_backing(c10::DeviceType type, c10::DeviceIndex host_devices) {
  Backing& g_backing = detail::g_backing;
  TORCH_CHECK(!g_backing.initialized, "the flagos backing is set once per process");
  TORCH_CHECK(type == c10::DeviceType::CPU || type == c10::DeviceType::CUDA,
              "flagos supports the backing devices cpu and cuda; got ", type);
  TORCH_CHECK(host_devices >= 1 && static_cast<std::size_t>(host_devices) <= kMaxHostDevices,
              "host_devices must be in [1, ", kMaxHostDevices, "]; got ", host_devices);
  g_backing.type = type;
  g_backing.key = type == c10::DeviceType::CPU ? c10::DispatchKey::CPU : c10::DispatchKey::CUDA;
  g_backing.keys = c10::DispatchKeySet(g_backing.key);
  g_backing.backend = g_backing.keys.highestBackendKey();
  g_backing.backend_keys = c10::getAutocastRelatedKeySetFromBackend(g_backing.backend);
  const auto flagos_backend = c10::DispatchKeySet(c10::DispatchKey::PrivateUse1).highestBackendKey();
  g_backing.flagos_backend_keys =
      c10::getAutocastRelatedKeySetFromBackend(flagos_backend) | c10::DispatchKeySet(flagos_backend);
  g_backing.host_devices = host_devices;
  g_backing.initialized = true;
}

at::Tensor as_backing(const at::Tensor& t) {
  if (!t.defined() || t.device().type() != kFlagos) return t;
  return owning_alias(t, to_backing(t.device()), backing().key, c10::GetAllocator(backing().type), false);
}

at::Tensor as_flagos_over_source(const at::Tensor& t) {
  if (!t.defined() || t.device().type() != backing().type) return t;
  const c10::Storage* source = held_storage(t.storage().data_ptr());
  if (source != nullptr && source->device_type() == kFlagos) return rebase_view(t, *source);
  return as_flagos(t);
}

at::Tensor hand_to_backing(const at::Tensor& t) {
  if (!t.defined() || t.device().type() != kFlagos || host_backed()) return as_backing(t);
  c10::StorageImpl* si = t.storage().unsafeGetStorageImpl();
  c10::Allocator* allocator = c10::GetAllocator(backing().type);
  // Only a buffer the backing allocator made (flagos memory, relabelled) can change hands; an
  // alias of some other storage stays an alias.
  if (si->data_ptr().get_deleter() != allocator->raw_deleter()) return as_backing(t);
  const size_t nbytes = si->nbytes();
  const c10::Device device = to_backing(t.device());
  c10::DataPtr owned = si->set_data_ptr(c10::DataPtr(nullptr, si->device()));
  owned.unsafe_set_device(device);
  at::Tensor r = wrap(t, std::move(owned), nbytes, backing().key, allocator, false);
  // The flagos storage keeps the same bytes, now through the backing storage, which it keeps alive.
  si->set_data_ptr_noswap(hold_storage(r.storage(), t.device()));
  return r;
}

at::Tensor as_flagos(const at::Tensor& t, c10::DeviceIndex host_index) {
  if (!t.defined() || t.device().type() != backing().type) return t;
  return owning_alias(t, to_flagos(t.device(), host_index), c10::DispatchKey::PrivateUse1, flagos_allocator(), true);
}

namespace {

// The pooled alias `alias` made over `t`'s bytes, with `t`'s geometry unless it has it already.
void reset_alias(c10::TensorImpl* alias, const at::Tensor& t, c10::Device device, bool same_shape) {
  const c10::Storage& s = t.storage();
  c10::StorageImpl* si = alias->unsafe_storage().unsafeGetStorageImpl();  // a plain strided alias of ours
  // mutable_data() first: it gives a lazily cloned buffer its own bytes before any kernel writes.
  void* data = s.mutable_data();
  // An alias that last served these bytes (the same tensor a step later, or a buffer the caching
  // allocator handed out again at the same address) keeps its pointer: it borrows, so address and
  // size are all it holds.
  if (si->data() != data || si->nbytes() != s.nbytes()) {
    si->set_data_ptr_noswap(c10::DataPtr(data, device));
    si->set_nbytes(s.nbytes());
  }
  if (alias->dtype() != t.dtype()) ImplFields::set_dtype(*alias, t.dtype());
  if (!same_shape) alias->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  // The lazy conjugate and negative bits: rarely set on either side, so checked once for both.
  constexpr c10::DispatchKeySet lazy_bits({c10::DispatchKey::Conjugate, c10::DispatchKey::Negative});
  if (C10_UNLIKELY((alias->key_set() | t.key_set()).has_any(lazy_bits))) {
    if (alias->is_conj() != t.is_conj()) alias->_set_conj(t.is_conj());
    if (alias->is_neg() != t.is_neg()) alias->_set_neg(t.is_neg());
  }
}

// The bucket of a geometry, from the few fields that tell a model's shapes apart (the rank, the
// last size, the outermost stride, which is most of the element count of a contiguous tensor, and
// the offset): it is computed once per routed argument, and a bucket's entries are compared in
// full anyway.
size_t geometry_bucket(const c10::TensorImpl& t) {
  const c10::impl::SizesAndStrides& g = ImplFields::geometry(t);
  const size_t n = g.size();
  uint64_t h = n * 0x94D049BB133111EBULL + static_cast<uint64_t>(ImplFields::offset(t));
  if (n > 0) {
    h ^= static_cast<uint64_t>(g.sizes_data()[n - 1]) * 0x9E3779B97F4A7C15ULL;
    h ^= static_cast<uint64_t>(g.strides_data()[0]) * 0xBF58476D1CE4E5B9ULL;
  }
  return static_cast<size_t>((h ^ (h >> 31)) * 0x9E3779B97F4A7C15ULL >> 58);  // 64 buckets
}

}  // namespace

// Borrowing aliases handed back after their call, reused by this thread's next borrows: making and
// tearing down a TensorImpl and a StorageImpl per argument is most of what the native route adds per
// tensor (the optimizer's foreach ops take every parameter in each of their lists). They are kept by
// geometry: giving an alias another geometry recomputes its contiguity, the largest cost of a routed
// call inside a model, whose consecutive ops take different shapes; and every layer repeats its
// shapes, so each call finds aliases its shapes had in the layer before.
class AliasPool {
 public:
  static constexpr size_t kBuckets = 64;
  static constexpr size_t kMaxAliases = 512;

  // A pooled alias usable for `t` on `device` (as a written argument where `written`): one with `t`'s
  // geometry (`same_shape` set) if its bucket has one, else another from a nearby bucket, else
  // undefined.
  at::Tensor take(const c10::TensorImpl& t, c10::Device device, bool written, bool& same_shape, uint8_t& home) {
    home = static_cast<uint8_t>(geometry_bucket(t));
    std::vector<at::Tensor>& bucket = buckets_[home];
    // Shapes that share a bucket are few: the newest entries are enough to look at.
    for (size_t i = bucket.size(), seen = 0; i-- > 0 && seen < kLookedAt; ++seen) {
      const at::Tensor& a = bucket[i];
      if (same_geometry(*a.unsafeGetTensorImpl(), t) && usable(a, device, written)) {
        same_shape = true;
        return pop(bucket, i);
      }
    }
    for (size_t k = 0; k < kProbed; ++k) {
      std::vector<at::Tensor>& other = buckets_[(home + k) % kBuckets];
      if (!other.empty() && usable(other.back(), device, written)) {
        same_shape = false;
        return pop(other, other.size() - 1);
      }
    }
    return {};
  }

  // Keeps a reusable alias (the caller checked that nothing else holds it) in `bucket`, while there
  // is room.
  void put(at::Tensor&& alias, uint8_t bucket) {
    if (size_ >= kMaxAliases) return;
    buckets_[bucket % kBuckets].push_back(std::move(alias));
    ++size_;
  }

 private:
  static constexpr size_t kLookedAt = 4;
  static constexpr size_t kProbed = 8;

  // An alias made in inference mode has no version counter, which a kernel writing to it outside
  // inference mode would bump and refuse: it serves a written argument only in inference mode (the
  // mode is read only then, which saves a thread-local lookup on nearly every call). Any alias can
  // be read in either mode, and a normal one written in either. Its device label is its own (borrow
  // resets only its storage's).
  static bool usable(const at::Tensor& a, c10::Device device, bool written) {
    return a.device() == device && (!written || !a.is_inference() || c10::InferenceMode::is_enabled());
  }
  at::Tensor pop(std::vector<at::Tensor>& bucket, size_t i) {
    if (i + 1 != bucket.size()) std::swap(bucket[i], bucket.back());
    at::Tensor a = std::move(bucket.back());
    bucket.pop_back();
    --size_;
    return a;
  }

  std::array<std::vector<at::Tensor>, kBuckets> buckets_;
  size_t size_ = 0;
};

namespace {

// This thread's pool, reached through a plain pointer: a thread_local object with a destructor is
// reached through its guard and a second thread-local lookup on every access, and every routed
// call makes a Borrower.
thread_local AliasPool* t_alias_pool = nullptr;
thread_local bool t_alias_pool_gone = false;

// Owns the pool and frees it with its thread; a route that runs after that, while the thread's
// other objects are destroyed, gets a pool of its own that is never freed.
struct PoolOwner {
  std::unique_ptr<AliasPool> pool = std::make_unique<AliasPool>();
  ~PoolOwner() {
    t_alias_pool = nullptr;
    t_alias_pool_gone = true;
  }
};

C10_NOINLINE AliasPool& first_alias_pool() {
  if (t_alias_pool_gone) return *(t_alias_pool = new AliasPool());
  thread_local PoolOwner owner;
  return *(t_alias_pool = owner.pool.get());
}

}  // namespace

TORCH_FL_HOT Borrower::Borrower() : pool_(C10_LIKELY(t_alias_pool != nullptr) ? *t_alias_pool : first_alias_pool()) {}

TORCH_FL_HOT at::Tensor Borrower::borrow(const at::Tensor& t, uint8_t& bucket, bool written) {
  const c10::Device device = to_backing(t.device());
  bool same_shape = false;
  at::Tensor alias = pool_.take(*t.unsafeGetTensorImpl(), device, written, same_shape, bucket);
  if (alias.defined()) {
    reset_alias(alias.unsafeGetTensorImpl(), t, device, same_shape);
    return alias;
  }
  // Resizable: an out= kernel may grow it; the caller then moves the new buffer into the flagos storage.
  return borrowing_alias(t, device, true);
}

TORCH_FL_HOT void Borrower::give_back(at::Tensor&& alias, uint8_t bucket) {
  c10::TensorImpl* impl = alias.unsafeGetTensorImpl();
  const c10::Storage& storage = impl->unsafe_storage();  // a plain strided alias of ours
  // Reused only when the kernel kept no reference to it or its storage and left its metadata
  // changeable (a kernel may restride or relabel an alias; borrow resets those).
  if (alias.use_count() != 1 || storage.use_count() != 1 || !impl->allow_tensor_metadata_change() ||
      impl->is_wrapped_number() || impl->device_type() != backing().type) {
    return;
  }
  c10::StorageImpl* si = storage.unsafeGetStorageImpl();
  if (!si->resizable() || si->allocator() != c10::GetAllocator(backing().type)) return;
  // The alias keeps its pointer while pooled: nothing reads it before the next borrow confirms or
  // replaces it, and one that serves the same bytes again need not set it.
  pool_.put(std::move(alias), bucket);
}

std::optional<at::Tensor> borrow_optional_as_backing(const std::optional<at::Tensor>& t) {
  if (!t.has_value() || !t->defined()) return std::nullopt;
  return borrow_as_backing(*t);
}

TORCH_FL_HOT at::Tensor adopt_as_flagos(at::Tensor&& t, c10::DeviceIndex host_index) {
  if (!t.defined() || t.device().type() != backing().type) return std::move(t);
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  const c10::Storage& storage = impl->storage();
  if (t.use_count() != 1 || storage.use_count() != 1 || !storage.resizable() || !impl->allow_tensor_metadata_change() ||
      impl->pyobj_slot()->load_pyobj() != nullptr) {
    return as_flagos(t, host_index);
  }
  // Nobody else sees this tensor or its buffer: relabel both in place instead of aliasing (no
  // keep-alive object, no new TensorImpl, and the CUDA caching allocator keeps ownership so
  // record_stream still works).
  // Invariant: `t` is the only owner of its TensorImpl and StorageImpl (use counts 1, no Python
  // object), checked above, so no other tensor observes the device change; the DataPtr keeps its
  // context and deleter, so the buffer is still freed by the allocator that made it.
  c10::StorageImpl* si = storage.unsafeGetStorageImpl();
  const auto dev = to_flagos(t.device(), host_index);
  if (host_backed()) {
    const size_t n = si->nbytes();
    c10::DataPtr inner = si->set_data_ptr(c10::DataPtr(nullptr, si->device()));
    si->set_data_ptr_noswap(track_host(std::move(inner), n, dev.index()));
  } else {
    si->mutable_data_ptr().unsafe_set_device(dev);
  }
  si->set_allocator(flagos_allocator());
  // The device follows the storage's (what set_storage_keep_dtype would set, without handing the
  // storage over), and the backend and autocast keys follow the device.
  ImplFields::set_device(*impl, dev);
  c10::DispatchKeySet& keys = ImplFields::keys(*impl);
  if (C10_LIKELY(keys.highestBackendKey() == backing().backend)) {
    keys = (keys - backing().backend_keys).remove_backend(backing().backend) | backing().flagos_backend_keys;
  } else {
    impl->_change_backend_component_keys(dev);
  }
  return std::move(t);
}

at::Tensor rebase_view(const at::Tensor& view, const c10::Storage& flagos_storage) {
  return like_over(view, c10::Storage(flagos_storage), c10::DispatchKey::PrivateUse1);
}

}  // namespace torch_fl
