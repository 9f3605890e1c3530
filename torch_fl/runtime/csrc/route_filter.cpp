// Route filters: the C++ front of an op whose route is native for most calls and another path for
// some (a tuned shape bucket, or the sizes a conformance record proved). Such an op needs a Python
// route kernel, but a Python kernel on PrivateUse1 costs every call of the op the Python entry
// (tens of microseconds on a CUDA backing), native calls included. So the Python kernel goes on
// PrivateUse2, which no tensor carries, and this filter takes the op's PrivateUse1 slot: a call
// whose (dtype, element count) no span covers runs what would have served it without the Python
// kernel, at C++ speed; the others are redispatched to the Python kernel.
#include "backing.h"

#include <torch/library.h>

#include <memory>
#include <vector>

namespace torch_fl {
namespace {

// Of the first tensor argument (any dtype when `any_dtype`), by the largest tensor argument's numel.
struct Span {
  c10::ScalarType dtype;
  bool any_dtype;
  int64_t min_numel;
  int64_t max_numel;  // < 0: no upper bound
};

struct CallShape {
  std::optional<c10::ScalarType> dtype;
  int64_t numel = 0;

  void see(const at::Tensor& t) {
    if (!t.defined()) return;
    if (!dtype) dtype = t.scalar_type();
    numel = std::max<int64_t>(numel, t.numel());
  }
};

CallShape shape_of(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  const size_t n = op.schema().arguments().size();
  CallShape shape;
  for (size_t i = stack.size() - n; i < stack.size(); ++i) {
    const auto& v = stack[i];
    if (v.isTensor()) {
      shape.see(v.toTensor());
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) shape.see(t);
    } else if (v.isList()) {  // Tensor?[] (index lists)
      for (const c10::IValue& item : v.toListRef()) {
        if (item.isTensor()) shape.see(item.toTensor());
      }
    }
  }
  return shape;
}

class RouteFilter final : public c10::OperatorKernel {
 public:
  RouteFilter(std::vector<Span> spans, bool composite) : spans_(std::move(spans)), composite_(composite) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
    if (covered(shape_of(op, *stack))) {
      op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::PrivateUse2), stack);
    } else if (composite_) {
      // What served the op before any route kernel: PyTorch's composite, run on flagos tensors.
      op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CompositeExplicitAutograd), stack);
    } else {
      native_route(op, stack);
    }
  }

 private:
  bool covered(const CallShape& shape) const {
    for (const auto& s : spans_) {
      if (!s.any_dtype && shape.dtype != s.dtype) continue;
      if (shape.numel >= s.min_numel && (s.max_numel < 0 || shape.numel <= s.max_numel)) return true;
    }
    return false;
  }

  std::vector<Span> spans_;
  bool composite_;
};

}  // namespace

std::shared_ptr<RouteFilterHandle> install_route_filter(const std::string& op, const std::vector<RouteSpan>& spans,
                                                        bool composite) {
  const auto dot = op.find('.');
  const c10::OperatorName name(op.substr(0, dot), dot == std::string::npos ? "" : op.substr(dot + 1));
  auto& dispatcher = c10::Dispatcher::singleton();
  TORCH_CHECK(dispatcher.findOp(name).has_value(), "route filter: unknown operator ", op);
  std::vector<Span> converted;
  for (const auto& s : spans) {
    converted.push_back({s.dtype.value_or(c10::ScalarType::Undefined), !s.dtype.has_value(), s.min_numel, s.max_numel});
  }
  // Invariant: the registration lives exactly as long as the handle; dropping it restores the
  // op's previous PrivateUse1 kernel (the core's native claim, or none).
  return std::make_shared<RouteFilterHandle>(dispatcher.registerImpl(
      name, c10::DispatchKey::PrivateUse1,
      c10::KernelFunction::makeFromBoxedFunctor(std::make_unique<RouteFilter>(std::move(converted), composite)),
      std::nullopt, nullptr, "torch_fl route filter"));
}

}  // namespace torch_fl
