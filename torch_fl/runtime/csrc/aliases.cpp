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

// A borrowing alias, which the pool hands from call to call. It takes each argument's geometry as a
// copy of the argument's sizes, strides and contiguity flags, which the argument's own
// computation already settled: TensorImpl's setters recompute the flags from the sizes and strides,
// which in a model, where consecutive ops take different shapes, cost more than the rest of a
// borrow. (The fields are protected: a subclass sets its own.)
class PooledAlias final : public c10::TensorImpl {
 public:
  using TensorImpl::TensorImpl;

  // Its own device, read without TensorImpl::device()'s policy check: an alias has no custom device.
  c10::Device own_device() const { return *device_opt_; }

  // `t`'s geometry (a dense tensor with TensorImpl's default size and stride policy, as flagos's are),
  // unless the alias has it already: a call that passes the same shapes again finds them.
  void take_geometry(const c10::TensorImpl& t) {
    if (same_geometry(*this, t)) return;
    const c10::impl::SizesAndStrides& geometry = ImplFields::geometry(t);
    if (C10_UNLIKELY(geometry.size() > kInlineRank || sizes_and_strides_.size() > kInlineRank ||
                     t.has_symbolic_sizes_strides())) {
      return take_any_geometry(t);
    }
    sizes_and_strides_ = geometry;  // both inline: a fixed-size copy
    storage_offset_ = ImplFields::offset(t);
    numel_ = ImplFields::numel(t);
    take_flags(t);
  }

 private:
  // SizesAndStrides keeps up to this many dimensions in place (no heap buffer to grow or free).
  static constexpr size_t kInlineRank = 5;

  // The contiguity flags: only ranks 4 and 5 have channels-last flags (TensorImpl's own refresh
  // clears them for the others), which spares most arguments four reads of them.
  void take_flags(const c10::TensorImpl& t) {
    is_contiguous_ = t.is_contiguous();
    is_non_overlapping_and_dense_ = t.is_non_overlapping_and_dense();
    const size_t rank = sizes_and_strides_.size();
    if (rank == 4 || rank == 5) {
      take_channels_last_flags(t, rank);
    } else {
      is_channels_last_contiguous_ = is_channels_last_ = false;
      is_channels_last_3d_contiguous_ = is_channels_last_3d_ = false;
    }
  }

  // Out of line: more than five dimensions on either side, or symbolic sizes.
  TORCH_FL_COLD void take_any_geometry(const c10::TensorImpl& t) {
    sizes_and_strides_ = ImplFields::geometry(t);
    storage_offset_ = ImplFields::offset(t);
    numel_ = t.numel();
    take_flags(t);
  }

  // Out of line: most of a model's arguments have another rank.
  C10_NOINLINE void take_channels_last_flags(const c10::TensorImpl& t, size_t rank) {
    is_channels_last_contiguous_ = t.is_contiguous(c10::MemoryFormat::ChannelsLast);
    is_channels_last_ = t.is_strides_like(c10::MemoryFormat::ChannelsLast);
    is_channels_last_3d_contiguous_ = rank == 5 && t.is_contiguous(c10::MemoryFormat::ChannelsLast3d);
    is_channels_last_3d_ = rank == 5 && t.is_strides_like(c10::MemoryFormat::ChannelsLast3d);
  }
};

TORCH_FL_COLD void copy_lazy_bits(c10::TensorImpl* alias, const c10::TensorImpl& t) {
  if (alias->is_conj() != t.is_conj()) alias->_set_conj(t.is_conj());
  if (alias->is_neg() != t.is_neg()) alias->_set_neg(t.is_neg());
}

// The lazy conjugate and negative bits of `t` on `alias`: rarely set on either side, so checked
// once for both.
void take_lazy_bits(c10::TensorImpl* alias, const c10::TensorImpl& t) {
  constexpr c10::DispatchKeySet lazy_bits({c10::DispatchKey::Conjugate, c10::DispatchKey::Negative});
  if (C10_UNLIKELY((alias->key_set() | t.key_set()).has_any(lazy_bits))) copy_lazy_bits(alias, t);
}

// A new borrowing alias, empty (of bytes): a borrow fills it from its argument, dtype included, as
// it does a reused one (reset_alias). Resizable through the backing allocator: an out= kernel may
// grow it, and the caller then moves the new buffer into the flagos storage. Not TensorImpl's VIEW
// constructor, for the reason like_over gives. Cold: once a model runs, its calls find aliases in
// the pool.
TORCH_FL_COLD at::Tensor new_alias(c10::Device device, c10::Allocator* allocator) {
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0, c10::DataPtr(nullptr, device), allocator, true);
  return at::detail::make_tensor<PooledAlias>(std::move(storage), backing().keys, caffe2::TypeMeta::Make<uint8_t>());
}

// The storage of a tensor that holds none here: storage() raises its error where the tensor refuses
// access to its storage.
TORCH_FL_COLD const c10::Storage& checked_storage(const c10::TensorImpl& t) { return t.storage(); }

// Points a pooled alias's storage at `data`, of `nbytes`. A borrowing DataPtr has no deleter, so
// the address is all it holds: set in place, without the new DataPtr and the check flags a
// replaced one recomputes (an alias is never copy-on-write, nor barred from its data). A DataPtr
// that a kernel left with a deleter of its own is replaced.
void point_alias_at(c10::StorageImpl* si, void* data, size_t nbytes, c10::Device device) {
  if (C10_UNLIKELY(!si->_mutable_data_ptr_no_checks().unsafe_reset_data_and_ctx(data))) {
    si->set_data_ptr_noswap(c10::DataPtr(data, device));
  }
  si->unsafe_set_nbytes(nbytes);  // never symbolic: set by us, or by a backing allocator's resize
}

// The pooled alias `alias` made over `t`'s bytes, dtype and geometry.
void reset_alias(PooledAlias* alias, const c10::TensorImpl& t, c10::Device device) {
  // Read without storage()'s check, a call through TensorImpl's table of virtual functions: a
  // dense flagos tensor has a storage, and the tensors that refuse access to theirs (functional
  // and batching wrappers, fakes) are unwrapped before a backend kernel runs.
  const c10::Storage& s = C10_LIKELY(t.unsafe_storage()) ? t.unsafe_storage() : checked_storage(t);
  c10::StorageImpl* si = alias->unsafe_storage().unsafeGetStorageImpl();  // a plain strided alias of ours
  // mutable_data() first: it gives a lazily cloned buffer its own bytes before any kernel writes.
  void* data = s.mutable_data();
  const size_t nbytes = s.nbytes();
  // An alias that last served these bytes (the same tensor a step later, or a buffer the caching
  // allocator handed out again at the same address) keeps its pointer.
  if (si->data() != data || si->nbytes() != nbytes) point_alias_at(si, data, nbytes, device);
  if (alias->dtype() != t.dtype()) ImplFields::set_dtype(*alias, t.dtype());
  alias->take_geometry(t);
  take_lazy_bits(alias, t);
}

}  // namespace

// Borrowing aliases handed back after their call, reused by this thread's next borrows: making and
// tearing down a TensorImpl and a StorageImpl per argument is most of what the native route adds per
// tensor (the optimizer's foreach ops take every parameter in each of their lists). A stack: a call
// hands its aliases back in the reverse of the order it borrowed them, so a call that passes the
// same tensors again gets each the alias that already points at its bytes.
class AliasPool {
 public:
  static constexpr size_t kMaxAliases = 512;

  AliasPool() : allocator_(c10::GetAllocator(backing().type)) {}

  // The backing allocator the pool's aliases resize through, read once per thread rather than
  // through a call into c10 on every routed call. (One installed later leaves the pool's aliases
  // with the allocator they were made with, as it leaves any existing storage.)
  c10::Allocator* allocator() const { return allocator_; }

  // A pooled alias for an argument on `device` (as a written argument where `written`): the newest
  // one, which nearly always serves, else an older one or a new one (out of line).
  at::Tensor take(c10::Device device, bool written) {
    if (C10_LIKELY(!aliases_.empty() && usable(aliases_.back(), device, written))) {
      at::Tensor a = std::move(aliases_.back());
      aliases_.pop_back();
      return a;
    }
    return search(device, written);
  }

  // Keeps a reusable alias (the caller checked that nothing else holds it), while there is room.
  void put(at::Tensor&& alias) {
    if (aliases_.size() < kMaxAliases) aliases_.push_back(std::move(alias));
  }

 private:
  static constexpr size_t kLookedAt = 4;  // how many of the newest aliases `search` looks at

  // An alias made in inference mode has no version counter, which a kernel writing to it outside
  // inference mode would bump and refuse: it serves a written argument only in inference mode (the
  // mode is read only then, which saves a thread-local lookup on nearly every call). Any alias can
  // be read in either mode, and a normal one written in either. Its device label is its own (borrow
  // resets only its storage's).
  static bool usable(const at::Tensor& a, c10::Device device, bool written) {
    return static_cast<const PooledAlias*>(a.unsafeGetTensorImpl())->own_device() == device &&
           (!written || !a.is_inference() || c10::InferenceMode::is_enabled());
  }

  // Below the newest: aliases of other devices, or made in inference mode, are few, so the newest
  // few entries are enough to look at; where none serves, a new alias.
  TORCH_FL_COLD at::Tensor search(c10::Device device, bool written) {
    for (size_t i = aliases_.size(), seen = 0; i-- > 0 && seen < kLookedAt; ++seen) {
      if (usable(aliases_[i], device, written)) {
        std::swap(aliases_[i], aliases_.back());
        at::Tensor a = std::move(aliases_.back());
        aliases_.pop_back();
        return a;
      }
    }
    return new_alias(device, allocator_);
  }

  c10::Allocator* allocator_;
  std::vector<at::Tensor> aliases_;
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

TORCH_FL_HOT at::Tensor Borrower::borrow(const at::Tensor& t, bool written) {
  const c10::Device device = to_backing(t.device());
  at::Tensor alias = pool_.take(device, written);
  // the pool holds only these
  reset_alias(static_cast<PooledAlias*>(alias.unsafeGetTensorImpl()), *t.unsafeGetTensorImpl(), device);
  return alias;
}

namespace {

// Whether a borrowed alias can serve again: the kernel kept no reference to it or its storage and
// left its metadata changeable (a kernel may restride or relabel an alias; borrow resets those).
// The alias keeps its pointer while pooled: nothing reads it before the next borrow confirms or
// replaces it, and one that serves the same bytes again need not set it.
inline bool reusable(const at::Tensor& alias, const c10::Allocator* allocator) {
  const c10::TensorImpl* impl = alias.unsafeGetTensorImpl();
  const c10::Storage& storage = impl->unsafe_storage();  // a plain strided alias of ours
  if (alias.use_count() != 1 || storage.use_count() != 1 || !impl->allow_tensor_metadata_change() ||
      impl->is_wrapped_number() || impl->device_type() != backing().type) {
    return false;
  }
  const c10::StorageImpl* si = storage.unsafeGetStorageImpl();
  return si->resizable() && si->allocator() == allocator;
}

}  // namespace

TORCH_FL_HOT void Borrower::give_back(at::Tensor&& alias) {
  if (reusable(alias, pool_.allocator())) pool_.put(std::move(alias));
}

TORCH_FL_HOT void Borrower::give_back(at::Tensor* aliases, size_t n) {
  const c10::Allocator* allocator = pool_.allocator();
  for (size_t i = n; i-- > 0;) {
    if (reusable(aliases[i], allocator)) pool_.put(std::move(aliases[i]));
  }
}

std::optional<at::Tensor> borrow_optional_as_backing(const std::optional<at::Tensor>& t) {
  if (!t.has_value() || !t->defined()) return std::nullopt;
  return borrow_as_backing(*t);
}

namespace {

// A host buffer relabelled as flagos: its bytes count in the flagos statistics of the device.
C10_NOINLINE void track_adopted_host_bytes(c10::StorageImpl* si, c10::DeviceIndex index) {
  const size_t n = si->nbytes();
  c10::DataPtr inner = si->set_data_ptr(c10::DataPtr(nullptr, si->device()));
  si->set_data_ptr_noswap(track_host(std::move(inner), n, index));
}

TORCH_FL_COLD at::Tensor alias_as_flagos(const at::Tensor& t, c10::DeviceIndex host_index) {
  return as_flagos(t, host_index);
}

}  // namespace

TORCH_FL_HOT at::Tensor adopt_as_flagos(at::Tensor&& t, c10::DeviceIndex host_index) {
  if (!t.defined() || t.device().type() != backing().type) return std::move(t);
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  const c10::Storage& storage = impl->unsafe_storage();  // a backing kernel's dense result
  if (C10_UNLIKELY(t.use_count() != 1 || storage.use_count() != 1 || !storage.resizable() ||
                   !impl->allow_tensor_metadata_change() || impl->pyobj_slot()->load_pyobj() != nullptr)) {
    return alias_as_flagos(t, host_index);
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
    track_adopted_host_bytes(si, dev.index());
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
    impl->_change_backend_component_keys(dev);  // out of line in c10 already
  }
  return std::move(t);
}

at::Tensor rebase_view(const at::Tensor& view, const c10::Storage& flagos_storage) {
  return like_over(view, c10::Storage(flagos_storage), c10::DispatchKey::PrivateUse1);
}

}  // namespace torch_fl
