// Route filters: the C++ front of an op whose route is native for most calls and another path for
// some (a tuned shape bucket, or the sizes a conformance record proved). Such an op needs a Python
// route kernel, but a Python kernel on PrivateUse1 costs every call of the op the Python entry
// (tens of microseconds on a CUDA backing), native calls included. So the Python kernel goes on
// PrivateUse2, which no tensor carries, and this filter takes the op's PrivateUse1 slot: a call
// whose (dtype, element count) no span covers runs what would have served it without the Python
// kernel, at C++ speed; the others are redispatched to the Python kernel. A span may also limit
// the call's extents (what a record proved, within what the platform declares): calls beyond run
// what would have served them, and are counted.
#include "backing.h"

#include <torch/library.h>

#include <c10/util/Exception.h>
#include <c10/util/SmallVector.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

namespace torch_fl {
namespace {

// Of the first tensor argument (any dtype when `any_dtype`), by the largest tensor argument's numel,
// and, where `limits` is set, by the call's extents.
struct Span {
  c10::ScalarType dtype;
  bool any_dtype;
  int64_t min_numel;
  int64_t max_numel;  // < 0: no upper bound
  std::vector<std::pair<int64_t, int64_t>> limits;
};

// What a span is checked against: the first tensor's dtype, the largest numel, and the box of all
// tensor arguments (right-aligned per-dimension maxima) from which the generic extents come.
struct CallShape {
  std::optional<c10::ScalarType> dtype;
  int64_t numel = 0;
  c10::SmallVector<int64_t, 6> box;

  void see(const at::Tensor& t) {
    if (!t.defined()) return;
    if (!dtype) dtype = t.scalar_type();
    numel = std::max<int64_t>(numel, t.numel());
    const auto sizes = t.sizes();
    if (sizes.size() > box.size()) box.insert(box.begin(), sizes.size() - box.size(), 0);
    const size_t offset = box.size() - sizes.size();
    for (size_t i = 0; i < sizes.size(); ++i) box[offset + i] = std::max(box[offset + i], sizes[i]);
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

int64_t extent(const ExtentRef& ref, const CallShape& shape, const c10::OperatorHandle& op,
               const torch::jit::Stack& stack) {
  if (ref.arg < 0) {
    if (ref.dim == 0) {
      int64_t numel = 1;
      for (int64_t size : shape.box) numel *= size;
      return numel;
    }
    if (ref.dim == 1) return static_cast<int64_t>(shape.box.size());
    return shape.box.empty() ? 0 : shape.box.back();
  }
  const size_t n = op.schema().arguments().size();
  if (static_cast<size_t>(ref.arg) >= n) return 0;
  const auto& v = stack[stack.size() - n + ref.arg];
  if (!v.isTensor()) return 0;
  const at::Tensor& t = v.toTensor();
  const int64_t dim = ref.dim < 0 ? ref.dim + t.dim() : ref.dim;
  return t.defined() && dim >= 0 && dim < t.dim() ? t.size(dim) : 0;
}

class RouteFilter final : public c10::OperatorKernel {
 public:
  RouteFilter(std::vector<Span> spans, std::vector<ExtentRef> refs, bool composite,
              std::shared_ptr<std::atomic<int64_t>> outside)
      : spans_(std::move(spans)), refs_(std::move(refs)), composite_(composite), outside_(std::move(outside)) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
    if (covered(op, *stack)) {
      op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::PrivateUse2), stack);
    } else if (composite_) {
      // What served the op before any route kernel: PyTorch's composite, run on flagos tensors.
      op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CompositeExplicitAutograd), stack);
    } else {
      native_route(op, stack);
    }
  }

 private:
  bool covered(const c10::OperatorHandle& op, const torch::jit::Stack& stack) const {
    const CallShape shape = shape_of(op, stack);
    bool sized = false;
    c10::SmallVector<int64_t, 8> extents;  // measured once, for the first span with limits
    for (const auto& s : spans_) {
      if (!s.any_dtype && shape.dtype != s.dtype) continue;
      if (shape.numel < s.min_numel || (s.max_numel >= 0 && shape.numel > s.max_numel)) continue;
      sized = true;
      if (s.limits.empty()) return true;
      if (extents.empty()) {
        for (const auto& ref : refs_) extents.push_back(extent(ref, shape, op, stack));
      }
      if (within(s, extents)) return true;
    }
    if (sized) outside_->fetch_add(1, std::memory_order_relaxed);
    return false;
  }

  static bool within(const Span& s, const c10::SmallVector<int64_t, 8>& extents) {
    for (size_t i = 0; i < s.limits.size(); ++i) {
      const auto& [low, high] = s.limits[i];
      if (extents[i] < low || (high >= 0 && extents[i] > high)) return false;
    }
    return true;
  }

  std::vector<Span> spans_;
  std::vector<ExtentRef> refs_;
  bool composite_;
  std::shared_ptr<std::atomic<int64_t>> outside_;
};

// Taking the op's PrivateUse1 slot over the core's native claim is what a filter is for; PyTorch
// warns of any such override, in several lines, and would do so at every activation of a platform
// with a gated route. Other warnings pass on to the handler in place.
class DropOverrideWarning : public c10::WarningHandler {
 public:
  explicit DropOverrideWarning(c10::WarningHandler* next) : next_(next) {}
  void process(const c10::Warning& warning) override {
    if (warning.msg().find("Overriding a previously registered kernel") == std::string::npos) next_->process(warning);
  }

 private:
  c10::WarningHandler* next_;
};

}  // namespace

std::shared_ptr<RouteFilterHandle> install_route_filter(const std::string& op, const std::vector<RouteSpan>& spans,
                                                        const std::vector<ExtentRef>& refs, bool composite) {
  const auto dot = op.find('.');
  const c10::OperatorName name(op.substr(0, dot), dot == std::string::npos ? "" : op.substr(dot + 1));
  auto& dispatcher = c10::Dispatcher::singleton();
  TORCH_CHECK(dispatcher.findOp(name).has_value(), "route filter: unknown operator ", op);
  std::vector<Span> converted;
  for (const auto& s : spans) {
    converted.push_back(
        {s.dtype.value_or(c10::ScalarType::Undefined), !s.dtype.has_value(), s.min_numel, s.max_numel, s.limits});
  }
  auto outside = std::make_shared<std::atomic<int64_t>>(0);
  DropOverrideWarning quiet(c10::WarningUtils::get_warning_handler());
  c10::WarningUtils::WarningHandlerGuard guard(&quiet);
  // Invariant: the registration lives exactly as long as the handle; dropping it restores the
  // op's previous PrivateUse1 kernel (the core's native claim, or none).
  return std::make_shared<RouteFilterHandle>(
      dispatcher.registerImpl(name, c10::DispatchKey::PrivateUse1,
                              c10::KernelFunction::makeFromBoxedFunctor(
                                  std::make_unique<RouteFilter>(std::move(converted), refs, composite, outside)),
                              std::nullopt, nullptr, "torch_fl route filter"),
      outside);
}

}  // namespace torch_fl
