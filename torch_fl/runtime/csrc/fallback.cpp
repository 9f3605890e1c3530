// The C++ routes, registered as the PrivateUse1 boxed fallback so that every op without a kernel
// of its own (a Python route kernel, or the unboxed native kernel of a hot op) lands here:
//   native: run the backing device's own aten kernel on zero-copy aliases (no Python, no copies);
//   cpu:    the explicit CPU fallback for ops the backing lacks (or forced per op): copy to the
//           host, run PyTorch's CPU kernel, copy back; counted and optionally logged.
#include "native_call.h"
#include "sparse.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <c10/util/SmallVector.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <iostream>
#include <unordered_set>

namespace torch_fl {
namespace {

std::atomic<bool> g_log_cpu{false};

void map_results(const c10::OperatorHandle& op, torch::jit::Stack* stack, c10::SmallVectorImpl<Swap>& swaps,
                 const std::vector<SparseSwap>& sparse_swaps, c10::DeviceIndex index) {
  const size_t n = op.schema().returns().size();
  const size_t base = stack->size() - n;
  for (size_t i = 0; i < n; ++i) {
    c10::IValue& iv = (*stack)[base + i];
    if (iv.isTensor()) {
      const c10::TensorImpl* impl = iv.toTensor().unsafeGetTensorImpl();
      // in-place and out= ops on sparse tensors return their (already written back) argument
      auto same = std::find_if(sparse_swaps.begin(), sparse_swaps.end(),
                               [&](const SparseSwap& s) { return s.alias.unsafeGetTensorImpl() == impl; });
      iv = same != sparse_swaps.end() ? same->original : to_flagos_result(std::move(iv).toTensor(), swaps, index);
    } else if (iv.isTensorList()) {
      auto list = std::move(iv).toTensorList();
      for (size_t j = 0; j < list.size(); ++j) list.set(j, to_flagos_result(list.extract(j), swaps, index));
      iv = std::move(list);
    }
  }
}

// Replaces flagos tensors inside a list or optional argument.
template <typename F>
void map_list(c10::IValue& iv, F&& fn) {
  if (iv.isTensor()) {
    if (is_flagos(iv.toTensor())) iv = fn(iv.toTensor());
  } else if (iv.isTensorList()) {
    auto list = iv.toTensorList();
    c10::List<at::Tensor> out;
    out.reserve(list.size());
    for (const at::Tensor& t : list) out.push_back(is_flagos(t) ? fn(t) : t);
    iv = std::move(out);
  } else if (iv.isList()) {
    auto list = iv.toList();
    c10::impl::GenericList out(list.elementType());
    out.reserve(list.size());
    for (const c10::IValue& e : list)
      out.push_back(e.isTensor() && is_flagos(e.toTensor()) ? c10::IValue(fn(e.toTensor())) : e);
    iv = std::move(out);
  }
}

void cpu_route(const c10::OperatorHandle& op, torch::jit::Stack* stack, OpInfo& info);

// No generator given: draw from the flagos default generator of the op's device, not the
// backing's global one.
void use_flagos_default_generator(torch::jit::Stack* stack, size_t base, const OpInfo& info, c10::DeviceIndex index) {
  if (info.generator_arg < 0) return;
  c10::IValue& g = (*stack)[base + info.generator_arg];
  if (g.isNone()) g = backing_generator(default_generator(index));
}

// Rewrites the op's arguments on the stack for a route: flagos tensors (also inside lists and
// optionals) through `route.tensor`, flagos generators and devices through `route.generator` and
// `route.device`; other tensors are shown to `route.other_tensor`.
template <typename Route>
void rewrite_arguments(torch::jit::Stack* stack, size_t base, const OpInfo& info, Route& route) {
  for (size_t i = 0; i < info.args.size(); ++i) {
    c10::IValue& iv = (*stack)[base + i];
    switch (info.args[i]) {
      case Arg::kTensor:
      case Arg::kWrite:
        if (iv.isTensor()) {
          if (is_flagos(iv.toTensor())) {
            iv = route.tensor(iv.toTensor(), info.args[i] == Arg::kWrite);
          } else {
            route.other_tensor(iv.toTensor());
          }
        }
        break;
      case Arg::kList:
      case Arg::kWriteList:
        map_list(iv, [&](const at::Tensor& t) { return route.tensor(t, info.args[i] == Arg::kWriteList); });
        break;
      case Arg::kGenerator:
        if (iv.isGenerator() && iv.toGenerator().device().type() == kFlagos) iv = route.generator(iv.toGenerator());
        break;
      case Arg::kDevice:
        if (iv.isDevice() && iv.toDevice().type() == kFlagos) iv = route.device(iv.toDevice());
        break;
      case Arg::kOther:
        break;
    }
  }
}

// The cpu route's view: host copies, the written ones remembered to copy the results back.
struct HostArguments {
  c10::SmallVector<std::pair<at::Tensor, at::Tensor>, 4> written;  // (host copy, flagos original)
  c10::DeviceIndex index = -1;
  KernelKey kernel;

  at::Tensor tensor(const at::Tensor& t, bool is_written) {
    note_device(index, t);
    kernel.note(t);
    at::Tensor alias = is_sparse_layout(t) ? backing_sparse_alias(t) : borrow_as_backing(t);
    at::Tensor host = alias.to(at::kCPU, /*non_blocking=*/false, /*copy=*/true);
    if (is_written) written.emplace_back(host, t);
    return host;
  }
  void other_tensor(const at::Tensor&) {}
  // A flagos generator drives a host generator only when the backing is the host.
  c10::IValue generator(const at::Generator& g) {
    return host_backed() ? c10::IValue(backing_generator(g)) : c10::IValue();
  }
  c10::IValue device(c10::Device) { return c10::Device(at::kCPU); }
};

void run_native(const c10::OperatorHandle& op, torch::jit::Stack* stack, OpInfo& info) {
  tally(info.native_calls);

  const size_t base = stack->size() - info.args.size();
  // Kept to retry on the host if the backing kernel turns these inputs down (see below); on the
  // host backing there is nothing to retry with.
  c10::SmallVector<c10::IValue, 8> arguments;
  if (!host_backed()) arguments.assign(stack->begin() + base, stack->end());
  NativeArguments args;
  rewrite_arguments(stack, base, info, args);
  // On the host backing a CPU operand would silently work: refused as a device kernel would.
  args.check_operands();
  use_flagos_default_generator(stack, base, info, args.index);
  try {
    mark_native_route(info);
    op.redispatchBoxed(args.kernel.on(backing().type), stack);
  } catch (const c10::NotImplementedError&) {
    // The backing has the op but not for these inputs (an integer matmul on CUDA, say): the
    // explicit CPU fallback serves this call, counted and logged as such.
    if (host_backed()) throw;
    tally(info.native_calls, -1);
    stack->resize(base);
    for (auto& v : arguments) stack->push_back(std::move(v));
    args.swaps.clear();
    args.aliases.clear();
    return cpu_route(op, stack, info);
  }
  args.write_back_written();
  const c10::DeviceIndex index = args.index >= 0 ? args.index : current_index();
  // A sparse argument the kernel changed takes the alias's structure and (mapped) members.
  for (auto& s : args.sparse_swaps) {
    if (s.written) set_sparse_structure(s.original, s.alias, flagos_members(s.alias, args.swaps, index));
  }
  map_results(op, stack, args.swaps, args.sparse_swaps, index);
}

}  // namespace

void native_route(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  OpInfo& info = info_for(op);
  if (!info.backing_has_kernel || info.force_cpu.load(std::memory_order_relaxed)) return cpu_route(op, stack, info);
  run_native(op, stack, info);
}

namespace {

// Ops on flagos sparse tensors: the backing's sparse kernels (its dispatcher says when it has none).
void sparse_route(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  OpInfo& info = info_for(op);
  if (info.force_cpu.load(std::memory_order_relaxed)) return cpu_route(op, stack, info);
  run_native(op, stack, info);
}

void cpu_route(const c10::OperatorHandle& op, torch::jit::Stack* stack, OpInfo& info) {
  tally(info.cpu_calls);
  if (g_log_cpu.load(std::memory_order_relaxed) && !info.logged.exchange(true)) {
    std::cerr << "torch_fl: cpu fallback for " << info.name
              << (info.force_cpu            ? " (forced by route)"
                  : info.backing_has_kernel ? " (the backing kernel does not support these inputs)"
                                            : " (no kernel on the backing device)")
              << std::endl;
  }
  const size_t base = stack->size() - info.args.size();
  HostArguments args;
  rewrite_arguments(stack, base, info, args);
  const c10::DeviceIndex index = args.index >= 0 ? args.index : current_index();
  if (host_backed()) use_flagos_default_generator(stack, base, info, index);
  {
    RECORD_FUNCTION("flagos.route.cpu", std::vector<c10::IValue>());
    op.redispatchBoxed(args.kernel.on(at::kCPU), stack);
  }
  for (auto& [host, original] : args.written) {
    // An out= the kernel resized takes the kernel's geometry, as it would on the backing; an
    // argument written in place keeps its own (the host copy of a strided view is dense). A
    // sparse copy takes the source's structure by itself.
    if (!is_sparse_layout(original) && host.sizes() != original.sizes()) {
      original.resize_(host.sizes());
      if (host.strides() != original.strides()) original.as_strided_(host.sizes(), host.strides());
    }
    original.copy_(host);
  }
  const size_t nr = op.schema().returns().size();
  const size_t rb = stack->size() - nr;
  auto back = [&](const at::Tensor& t) -> at::Tensor {
    if (!t.defined() || t.device().type() != at::kCPU) return t;
    for (auto& [host, original] : args.written) {
      if (host.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) return original;
    }
    if (is_sparse_layout(t)) return t.to(c10::Device(kFlagos, index));
    at::Tensor out = at::empty_strided(t.sizes(), t.strides(), t.options().device(c10::Device(kFlagos, index)));
    return out.copy_(t);
  };
  for (size_t i = 0; i < nr; ++i) {
    c10::IValue& iv = (*stack)[rb + i];
    if (iv.isTensor()) {
      iv = back(iv.toTensor());
    } else if (iv.isTensorList()) {
      auto list = iv.toTensorList();
      for (size_t j = 0; j < list.size(); ++j) list.set(j, back(list.get(j)));
    }
  }
}

// Composite kernels that refuse devices they do not know (a device-type check, or a DispatchStub
// with no PrivateUse1 entry): on aliases they run as on the backing.
const std::unordered_set<std::string> kDeviceCheckedComposites = {"aten::mode.values", "aten::conj_physical_."};

// PyTorch's composite kernels also serve PrivateUse1, ahead of any fallback: without this, flagos
// would run decompositions (layer norm as batch norm, add as empty + add.out, foreach ops one
// tensor at a time, mish_backward as its formula) where the backing has a fused kernel. Every aten
// op the backing implements itself is claimed for the native route, which is also what the
// backing's own dispatch does (a backend kernel wins over CompositeImplicitAutograd there too).
// The same holds for sparse tensors, where a composite can even be wrong for the layout (mm's
// builds a sparse output for a dense product): each flagos key is claimed against the backing's
// key of the same kind.
struct ClaimedKey {
  c10::DispatchKey flagos;
  c10::DispatchKey backing;
  c10::KernelFunction route;
};

std::vector<c10::RegistrationHandleRAII> claim_backing_kernels() {
  const bool host = host_backed();
  const ClaimedKey claims[] = {
      {c10::DispatchKey::PrivateUse1, backing().key, c10::KernelFunction::makeFromBoxedFunction<&native_route>()},
      {c10::DispatchKey::SparsePrivateUse1, host ? c10::DispatchKey::SparseCPU : c10::DispatchKey::SparseCUDA,
       c10::KernelFunction::makeFromBoxedFunction<&sparse_route>()},
      {c10::DispatchKey::SparseCsrPrivateUse1, host ? c10::DispatchKey::SparseCsrCPU : c10::DispatchKey::SparseCsrCUDA,
       c10::KernelFunction::makeFromBoxedFunction<&sparse_route>()},
  };
  auto& dispatcher = c10::Dispatcher::singleton();
  std::vector<c10::RegistrationHandleRAII> handles;
  for (const auto& claim : claims) {
    std::unordered_set<std::string> seen;
    for (auto key :
         {c10::DispatchKey::CompositeExplicitAutograd, c10::DispatchKey::CompositeExplicitAutogradNonFunctional,
          c10::DispatchKey::CompositeImplicitAutograd}) {
      for (const auto& name : dispatcher.getAllOpNamesForDispatchKey(key)) {
        if (name.name.rfind("aten::", 0) != 0 || !seen.insert(name.name + "." + name.overload_name).second) continue;
        auto op = dispatcher.findOp(name);
        const bool device_checked = claim.flagos == c10::DispatchKey::PrivateUse1 &&
                                    kDeviceCheckedComposites.count(name.name + "." + name.overload_name) != 0;
        if (!op || op->hasKernelForDispatchKey(claim.flagos) ||
            !(op->hasKernelForDispatchKey(claim.backing) || device_checked)) {
          continue;
        }
        handles.push_back(
            dispatcher.registerImpl(name, claim.flagos, claim.route, std::nullopt, nullptr, "torch_fl native route"));
      }
    }
  }
  return handles;
}

}  // namespace

void enable_native_route() {
  static torch::Library lib(torch::Library::IMPL, "_", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  static bool done = false;
  if (done) return;
  lib.fallback(torch::CppFunction::makeFromBoxedFunction<&native_route>());
  static torch::Library coo(torch::Library::IMPL, "_", c10::DispatchKey::SparsePrivateUse1, __FILE__, __LINE__);
  coo.fallback(torch::CppFunction::makeFromBoxedFunction<&sparse_route>());
  static torch::Library compressed(torch::Library::IMPL, "_", c10::DispatchKey::SparseCsrPrivateUse1, __FILE__,
                                   __LINE__);
  compressed.fallback(torch::CppFunction::makeFromBoxedFunction<&sparse_route>());
  register_unboxed_native_kernels();  // first: the claims below leave the ops it serves alone
  static std::vector<c10::RegistrationHandleRAII> claimed = claim_backing_kernels();
  done = true;
}

void set_log_cpu_fallback(bool on) { g_log_cpu = on; }

}  // namespace torch_fl
