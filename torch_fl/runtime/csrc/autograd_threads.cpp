// PyTorch's autograd device threads at interpreter exit. A backward pass on flagos runs on the
// engine's device threads, and the thread that ran the pass's last node may drop the pass's
// bookkeeping after the caller has returned. That bookkeeping can hold Python objects (torch 2.13
// keeps the caller's contextvars context in it), and a thread that waits for the GIL once the
// interpreter is finalizing is ended inside a C++ destructor: the process aborts. Draining the
// threads before finalization (torch_fl.runtime.autograd_exit) closes that window.
#include "backing.h"

#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/extension.h>

#include <algorithm>

namespace torch_fl {
namespace {

// The engine keeps one ready queue per device thread it has started (none before the first backward
// pass on a device). The member is protected: read through a member pointer named in a subclass.
struct EngineQueues : torch::autograd::Engine {
  static size_t started(const torch::autograd::Engine& engine) {
    return (engine.*&EngineQueues::device_ready_queues_).size();
  }
};

size_t autograd_device_threads() { return EngineQueues::started(torch::autograd::Engine::get_default_engine()); }

// One small backward pass per flagos device whose index has a device thread: the thread that serves
// the index runs it after everything queued before it, and a thread drops a pass's bookkeeping
// before it takes the next task, so once the last pass returns no thread holds an earlier one. The
// passes' own tensors are made here and have no Python objects; the caller releases the GIL, which
// a thread dropping a Python object needs meanwhile.
void drain_autograd_device_threads() {
  const size_t threads = autograd_device_threads();
  const auto devices = std::min<size_t>(threads, static_cast<size_t>(device_count()));
  c10::InferenceMode not_inference(false);
  c10::AutoGradMode grad(true);
  for (size_t i = 0; i < devices; ++i) {
    const c10::Device device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(i));
    at::Tensor leaf = at::zeros({}, at::TensorOptions().device(device)).requires_grad_(true);
    torch::autograd::backward({leaf.mul(2)});
  }
}

}  // namespace

void bind_autograd_threads(py::module_& m) {
  m.def("autograd_device_threads", &autograd_device_threads,
        "how many device threads the autograd engine has started in this process");
  m.def("drain_autograd_device_threads", &drain_autograd_device_threads, py::call_guard<py::gil_scoped_release>(),
        "waits until every autograd device thread of a flagos device index has finished its queued work");
}

}  // namespace torch_fl
