// The native route without boxing, for the ops a training step, an optimizer step or a decode step
// calls most. The boxed route packs every argument into a stack, rewrites it, and the backing's
// kernel unpacks it again; here the op's own C++ signature is kept: each flagos argument becomes
// the same backing alias as in the boxed route, and the backing kernel is called directly. Calls
// this path does not serve as is (a forced or missing backing kernel, a sparse argument, inputs
// the backing kernel turns down) go to the boxed route, which handles every case.
#include "native_call.h"
#include "sparse.h"

#include <ATen/ATen.h>
#include <ATen/Operators.h>
#include <ATen/core/boxing/KernelFunction.h>
#include <c10/core/CompileTimeFunctionPointer.h>

#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace torch_fl {
namespace {

// ---- arguments: each parameter type of an op's signature as the backing kernel sees it

// Types that hold tensors, devices or generators and have no Pass of their own below.
template <class T>
constexpr bool kUnmapped =
    std::is_same_v<T, at::Tensor> || std::is_same_v<T, at::Device> || std::is_same_v<T, at::Generator> ||
    std::is_same_v<T, std::optional<at::Generator>> || std::is_same_v<T, c10::List<std::optional<at::Tensor>>> ||
    std::is_same_v<T, std::vector<at::Tensor>>;

template <class T>
struct Pass {
  static_assert(!kUnmapped<std::decay_t<T>>,
                "an argument type the unboxed native route does not map: leave the op to the boxed route");
  T value;  // anything but tensors and devices goes through as it is
  Pass(T v, NativeArguments&, Arg) : value(static_cast<T>(v)) {}
  T get() { return static_cast<T>(value); }
  static bool sparse(const T&) { return false; }
};

// A tensor argument (`Ref`: const at::Tensor& or, for in-place and out= arguments, at::Tensor&):
// its backing alias where it is a flagos tensor, written back after the call where the schema
// says it is written. The alias stays in the arguments (the call's one reference to it).
template <class Ref>
struct TensorPass {
  Ref original;
  NativeArguments* args = nullptr;  // set where the argument is a flagos tensor
  size_t alias = 0;                 // then its alias is args->aliases[alias]
  TORCH_FL_HOT TensorPass(Ref t, NativeArguments& a, Arg kind) : original(t) {
    if (is_flagos(t)) {
      args = &a;
      alias = a.argument(t, kind == Arg::kWrite);  // call() sent calls with a sparse argument elsewhere
    } else {
      a.other_tensor(t);
    }
  }
  Ref get() { return args != nullptr ? args->aliases[alias] : original; }
  std::remove_reference_t<Ref>* original_of(const c10::TensorImpl* impl) const {
    const c10::TensorImpl* own =
        args != nullptr ? args->aliases[alias].unsafeGetTensorImpl() : original.unsafeGetTensorImpl();
    return own == impl ? &original : nullptr;
  }
  static bool sparse(const at::Tensor& t) { return is_sparse_layout(t); }
};

template <>
struct Pass<const at::Tensor&> : TensorPass<const at::Tensor&> {
  using TensorPass::TensorPass;
};

template <>
struct Pass<at::Tensor&> : TensorPass<at::Tensor&> {
  using TensorPass::TensorPass;
};

// A tensor handle that holds no reference: the arguments (or the caller) that own the tensor
// outlive it. Optional and list arguments are passed as values, and a copy of each alias would cost
// two atomic reference-count updates per tensor (sixteen per call of a foreach over two 8-tensor
// lists).
using Borrowed = c10::MaybeOwnedTraits<at::Tensor>;

// The dense flagos argument `t` as a borrowed handle on its alias; `t` itself where it is not flagos.
inline at::Tensor borrowed_alias(const at::Tensor& t, NativeArguments& args, bool written) {
  return Borrowed::createBorrow(is_flagos(t) ? args.aliases[args.argument(t, written)] : t);
}

template <>
struct Pass<const std::optional<at::Tensor>&> {
  std::optional<at::Tensor> value;  // borrowed (call() sent calls with a sparse argument elsewhere)
  Pass(const std::optional<at::Tensor>& t, NativeArguments& args, Arg) {
    if (t.has_value()) value = borrowed_alias(*t, args, false);
  }
  Pass(Pass&& other) noexcept : value(std::exchange(other.value, std::nullopt)) {}  // the tuple of passes moves it
  Pass& operator=(Pass&&) = delete;
  ~Pass() {
    if (value.has_value()) Borrowed::destroyBorrow(*value);
  }
  const std::optional<at::Tensor>& get() { return value; }
  static bool sparse(const std::optional<at::Tensor>& t) { return t.has_value() && is_sparse_layout(*t); }
};

// The tensors of a list, flagos ones as their aliases (a Tensor(a!)[] list is written back after
// the call). A list of flagos tensors in one array, none of them in the list before, is passed as
// the run of aliases it borrows, which the arguments hold (their room was reserved: they do not
// move). A list that repeats the list before it, read here, passes that list's aliases: a foreach
// op's x + x, or the gradients that addcmul takes twice. Any other list passes borrowed handles,
// where a tensor that the list before held at the same position, read here, shares the alias it
// got there.
class BorrowedList {
 public:
  template <class List>
  BorrowedList(const List& list, NativeArguments& args, Arg kind) {
    const bool written = kind == Arg::kWriteList;
    const ListAliases& before = args.last_list;
    const std::optional<at::TensorList> array = contiguous(list);
    if (array.has_value() && !written && before.size == array->size() && repeats(*array, before)) {
      list_ = {before.aliases, array->size()};
    } else if (array.has_value() && fresh(*array, before, written)) {
      const size_t start = args.aliases.size();
      args.list(*array, written);
      list_ = {args.aliases.data() + start, array->size()};
    } else {
      values_.reserve(list.size());
      size_t i = 0;
      for (const at::Tensor& t : list) {
        values_.push_back(repeated(t, i, before, written) ? Borrowed::createBorrow(before.aliases[i])
                                                          : borrowed_alias(t, args, written));
        ++i;
      }
      list_ = values_;
    }
    if constexpr (std::is_same_v<List, at::TensorList>) {
      args.last_list = {list.data(), list_.data(), list.size()};  // both outlive the call
    } else {
      args.last_list = {};
    }
  }
  BorrowedList(BorrowedList&&) noexcept = default;  // leaves the other's handles empty
  BorrowedList& operator=(BorrowedList&&) = delete;
  ~BorrowedList() {
    for (at::Tensor& t : values_) Borrowed::destroyBorrow(t);
  }
  at::TensorList get() const { return list_; }

 private:
  static std::optional<at::TensorList> contiguous(at::TensorList list) { return list; }
  static std::optional<at::TensorList> contiguous(const at::ITensorListRef& list) {
    if (list.isUnboxed()) return list.toUnboxed();
    return std::nullopt;
  }
  static bool repeated(const at::Tensor& t, size_t i, const ListAliases& before, bool written) {
    return !written && i < before.size && before.tensors[i].unsafeGetTensorImpl() == t.unsafeGetTensorImpl();
  }
  // Whether `list` holds the tensors of the list before, of its size.
  static bool repeats(at::TensorList list, const ListAliases& before) {
    for (size_t i = 0; i < list.size(); ++i) {
      if (before.tensors[i].unsafeGetTensorImpl() != list[i].unsafeGetTensorImpl()) return false;
    }
    return true;
  }
  // Dense flagos tensors only, none of them sharing an alias with the list before.
  static bool fresh(at::TensorList list, const ListAliases& before, bool written) {
    for (size_t i = 0; i < list.size(); ++i) {
      if (!is_flagos(list[i]) || repeated(list[i], i, before, written)) return false;
    }
    return true;
  }

  std::vector<at::Tensor> values_;  // borrowed handles, where the list is not a run of aliases
  at::TensorList list_;
};

// Parameter types that pass a list of tensors.
template <class T>
constexpr bool kIsList =
    std::is_same_v<std::decay_t<T>, at::TensorList> || std::is_same_v<std::decay_t<T>, at::ITensorListRef>;

// The most aliases an argument borrows: one per tensor of a list, one for anything else.
template <class T>
size_t aliases_at_most(const T& value) {
  if constexpr (kIsList<T>) {
    return value.size();
  } else {
    return 1;
  }
}

template <class List>
bool any_sparse(const List& list) {
  for (const at::Tensor& t : list) {
    if (is_sparse_layout(t)) return true;
  }
  return false;
}

template <>
struct Pass<at::TensorList> {
  BorrowedList values;
  Pass(at::TensorList list, NativeArguments& args, Arg kind) : values(list, args, kind) {}
  at::TensorList get() { return values.get(); }
  static bool sparse(at::TensorList list) { return any_sparse(list); }
};

template <>
struct Pass<const at::ITensorListRef&> {
  BorrowedList values;
  at::ITensorListRef ref;
  Pass(const at::ITensorListRef& list, NativeArguments& args, Arg kind) : values(list, args, kind), ref(values.get()) {}
  const at::ITensorListRef& get() { return ref; }
  static bool sparse(const at::ITensorListRef& list) { return any_sparse(list); }
};

template <>
struct Pass<std::optional<at::Device>> {
  std::optional<at::Device> value;
  Pass(std::optional<at::Device> d, NativeArguments&, Arg) {
    value = d.has_value() && d->type() == kFlagos ? std::optional<at::Device>(to_backing(*d)) : d;
  }
  std::optional<at::Device> get() { return value; }
  static bool sparse(std::optional<at::Device>) { return false; }
};

// ---- results: the backing kernel's results as flagos tensors

template <class T>
struct IsTuple : std::false_type {};
template <class... T>
struct IsTuple<std::tuple<T...>> : std::true_type {};
template <class T>
struct HasReferenceElement : std::false_type {};
template <class... T>
struct HasReferenceElement<std::tuple<T...>> : std::bool_constant<(std::is_reference_v<T> || ...)> {};

template <class R, class Passes>
R original_result(const at::Tensor& r, Passes& passes) {
  using Ptr = std::conditional_t<std::is_same_v<R, at::Tensor&>, at::Tensor*, const at::Tensor*>;
  Ptr found = nullptr;
  auto look = [&](auto& pass) {
    using P = std::decay_t<decltype(pass)>;
    if constexpr (std::is_same_v<P, Pass<at::Tensor&>> ||
                  (std::is_same_v<P, Pass<const at::Tensor&>> && !std::is_same_v<R, at::Tensor&>)) {
      if (found == nullptr) found = pass.original_of(r.unsafeGetTensorImpl());
    }
  };
  std::apply([&](auto&... p) { (look(p), ...); }, passes);
  TORCH_CHECK(found != nullptr, "torch_fl: a kernel returned a reference to a tensor that is not its argument");
  return *found;
}

template <class T>
T flagos_value(T&& value, NativeArguments& args, c10::DeviceIndex index) {
  if constexpr (std::is_same_v<std::decay_t<T>, at::Tensor>) {
    return to_flagos_result(std::move(value), args.swaps, index);
  } else if constexpr (std::is_same_v<std::decay_t<T>, std::vector<at::Tensor>>) {
    for (auto& t : value) t = to_flagos_result(std::move(t), args.swaps, index);
    return std::move(value);
  } else {
    return std::forward<T>(value);
  }
}

// ---- the kernel

// An in-place op (its name ends in _) leaves its written arguments' geometry and buffers as they
// were: PyTorch refuses one whose result would need another shape. Only out= overloads may resize
// or restride what they write, so only theirs are written back.
template <class Op>
constexpr bool kWritesInPlace = std::string_view(Op::name).ends_with('_');

template <class Op, class Signature = typename Op::schema>
struct Unboxed;

template <class Op, class R, class... A>
struct Unboxed<Op, R(A...)> {
  static_assert(!HasReferenceElement<R>::value, "ops returning tuples of references stay on the boxed route");
  static constexpr bool kTakesList = (kIsList<A> || ...);

  static const c10::OperatorHandle& handle() {
    static const c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow(Op::name, Op::overload_name);
    return op;
  }

  static OpInfo& info() {
    static OpInfo& facts = info_for(handle());
    return facts;
  }

  // Inlined into the dispatcher's thunk for the kernel, which otherwise only calls it.
  TORCH_FL_HOT C10_ALWAYS_INLINE static R call(A... a) {
    OpInfo& facts = info();
    if (facts.backing_has_kernel && !facts.force_cpu.load(std::memory_order_relaxed) && !(Pass<A>::sparse(a) || ...)) {
      tally(facts.native_calls);
      try {
        return native(a...);
      } catch (const c10::NotImplementedError&) {
        // The backing has the op but not for these inputs: the boxed route serves the call (with
        // the explicit CPU fallback), counted there.
        if (host_backed()) throw;
        tally(facts.native_calls, -1);
      }
    }
    return boxed(std::forward<A>(a)...);
  }

  // The boxed route, for the calls above that this one leaves to it.
  TORCH_FL_COLD static R boxed(A... a) {
    return c10::impl::BoxedKernelWrapper<R(A...)>::call(c10::BoxedKernel::makeFromFunction<&native_route>(), handle(),
                                                        c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                                        std::forward<A>(a)...);
  }

  // The backing's kernel on aliases of the flagos arguments; its results as flagos tensors. The
  // arguments are taken as lvalues: the boxed route may still need them intact.
  TORCH_FL_HOT static R native(A&... a) {
    NativeArguments args;  // declared first: its aliases return to the pool after the passes let go
    args.arguments_outlive_call = true;
    // Dense calls only (call() sends the others to the boxed route): a sparse result may hold an
    // argument as its member (the indices a sparse kernel shares), which no annotation says.
    args.reads_unmapped = info().returns_fresh;
    if constexpr (kTakesList) {
      // Room for every alias at once: a list passes the run of aliases it borrows, which must not
      // move; growing the swaps would move every one made (a foreach op's lists would regrow them
      // twice). Where neither list members nor read arguments get swaps, none is reserved: the
      // room would be a heap buffer per call for a list longer than the swaps' inline six.
      const size_t most = (aliases_at_most(a) + ...);
      args.aliases.reserve(most);
      args.lists_unmapped = std::is_void_v<R> && kWritesInPlace<Op>;
      if (!args.lists_unmapped && !args.reads_unmapped) args.swaps.reserve(most);
    }
    size_t i = 0;
    std::tuple<Pass<A>...> passes{Pass<A>(a, args, info().args[i++])...};
    args.check_operands();
    if constexpr (std::is_void_v<R>) {
      backing_call(passes);
      if constexpr (!kWritesInPlace<Op>) args.write_back_written();
    } else {
      decltype(auto) r = backing_call(passes);
      if constexpr (!kWritesInPlace<Op>) args.write_back_written();
      if constexpr (std::is_reference_v<R>) {
        return original_result<R>(r, passes);
      } else {
        const c10::DeviceIndex index = args.index >= 0 ? args.index : current_index();
        if constexpr (IsTuple<R>::value) {
          return std::apply([&](auto&&... v) { return R(flagos_value(std::move(v), args, index)...); }, std::move(r));
        } else {
          return flagos_value(std::move(r), args, index);
        }
      }
    }
  }

  // Straight to the backing's dense kernel (calls with a sparse argument take the boxed route).
  static R backing_call(std::tuple<Pass<A>...>& passes) {
    mark_native_route(info());
    return std::apply([&](auto&... p) -> R { return Op::redispatch(backing().keys, p.get()...); }, passes);
  }
};

template <class Op>
void serve_unboxed(std::vector<c10::RegistrationHandleRAII>& handles) {
  auto& dispatcher = c10::Dispatcher::singleton();
  const c10::OperatorName name(Op::name, Op::overload_name);
  auto op = dispatcher.findOp(name);
  // Where flagos has no kernel and the backing has one of its own, or a CompositeExplicitAutograd
  // one, which runs whole on the aliases as it would on the backing (the host's foreach ops: one
  // routed call instead of one per tensor, through the same list path as on a CUDA backing). Where
  // the backing has only a CompositeImplicitAutograd kernel, it runs on flagos, for autograd.
  if (!op || op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1) ||
      !(op->hasKernelForDispatchKey(backing().key) ||
        op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd))) {
    return;
  }
  handles.push_back(dispatcher.registerImpl(
      name, c10::DispatchKey::PrivateUse1, c10::KernelFunction::makeFromUnboxedFunction(TORCH_FN(Unboxed<Op>::call)),
      c10::impl::CppSignature::make<typename Op::schema>(), nullptr, "torch_fl native route (unboxed)"));
}

template <class... Ops>
std::vector<c10::RegistrationHandleRAII> serve_all_unboxed() {
  std::vector<c10::RegistrationHandleRAII> handles;
  (serve_unboxed<Ops>(handles), ...);
  return handles;
}

}  // namespace

void register_unboxed_native_kernels() {
  namespace ops = at::_ops;
  // The ops of the model zoo's training, prefill and decode steps and of AdamW, by call count.
  static std::vector<c10::RegistrationHandleRAII> handles = serve_all_unboxed<
      // elementwise
      ops::add_Tensor, ops::add__Tensor, ops::mul_Tensor, ops::mul__Tensor, ops::mul_Scalar, ops::sub_Tensor,
      ops::div_Tensor, ops::div__Tensor, ops::neg, ops::rsqrt, ops::sqrt, ops::exp, ops::cos, ops::sin,
      ops::pow_Tensor_Scalar, ops::where_self, ops::masked_fill__Scalar, ops::fill__Scalar, ops::zero_, ops::eq_Scalar,
      ops::lerp__Scalar, ops::addcmul_, ops::addcdiv_,
      // activations and their gradients
      ops::silu, ops::silu_backward, ops::gelu, ops::gelu_backward, ops::tanh, ops::tanh_backward, ops::relu,
      ops::threshold_backward,
      // matrix products and convolution (PyTorch's own PrivateUse1 entry point, convolution_overrideable,
      // would be a second pass through the dispatcher)
      ops::mm, ops::addmm, ops::bmm, ops::baddbmm, ops::_convolution, ops::convolution_backward,
      // reductions, softmax, losses, normalisation
      ops::sum_dim_IntList, ops::mean_dim, ops::argmax, ops::_softmax, ops::_softmax_backward_data, ops::_log_softmax,
      ops::_log_softmax_backward_data, ops::nll_loss_forward, ops::nll_loss_backward, ops::native_layer_norm,
      ops::native_layer_norm_backward,
      // gathering and joining
      ops::cat, ops::index_select, ops::gather, ops::embedding_dense_backward, ops::index_copy_,
      // the fused attention kernels a CUDA backing picks for scaled_dot_product_attention
      ops::_scaled_dot_product_cudnn_attention, ops::_scaled_dot_product_cudnn_attention_backward,
      ops::_scaled_dot_product_flash_attention, ops::_scaled_dot_product_flash_attention_backward,
      ops::_scaled_dot_product_efficient_attention, ops::_scaled_dot_product_efficient_attention_backward,
      // a decode step's bookkeeping (positions, stopping criteria, sampling masks)
      ops::arange_start_out, ops::isin_Tensor_Tensor, ops::bitwise_or_Tensor, ops::bitwise_and_Tensor, ops::bitwise_not,
      ops::any, ops::any_dim, ops::all, ops::max, ops::lt_Scalar, ops::gt_Scalar, ops::le_Tensor, ops::cumsum,
      ops::minimum, ops::log, ops::abs,
      // the optimizers' multi-tensor ops
      ops::_foreach_add__Scalar, ops::_foreach_add__List, ops::_foreach_add__Tensor, ops::_foreach_add__ScalarList,
      ops::_foreach_add_Scalar, ops::_foreach_add_List, ops::_foreach_mul__Scalar, ops::_foreach_mul__Tensor,
      ops::_foreach_mul__List, ops::_foreach_mul__ScalarList, ops::_foreach_lerp__Scalar, ops::_foreach_lerp__List,
      ops::_foreach_addcmul__Scalar, ops::_foreach_addcmul__ScalarList, ops::_foreach_addcdiv__Scalar,
      ops::_foreach_addcdiv__ScalarList, ops::_foreach_addcdiv__Tensor, ops::_foreach_sqrt, ops::_foreach_sqrt_,
      ops::_foreach_div__Scalar, ops::_foreach_div__ScalarList, ops::_foreach_div__Tensor, ops::_foreach_div__List,
      ops::_foreach_neg, ops::_foreach_norm_Scalar, ops::_foreach_maximum__List, ops::_foreach_zero_>();
}

}  // namespace torch_fl
