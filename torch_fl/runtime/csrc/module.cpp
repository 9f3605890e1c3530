// Python bindings of the flagos core (torch_fl.runtime._C).
#include "backing.h"
#include "sparse.h"

#include <torch/csrc/Dtype.h>
#include <torch/csrc/Generator.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/device_lazy_init.h>
#include <torch/extension.h>

namespace torch_fl {
void bind_graph_inputs(py::module_& m);      // graph_inputs.cpp
void bind_autograd_threads(py::module_& m);  // autograd_threads.cpp
}  // namespace torch_fl

namespace {

using namespace torch_fl;

void init(const std::string& device, int host_devices) {
  set_backing(c10::Device(device).type(), static_cast<c10::DeviceIndex>(host_devices));
  register_allocator();
  register_guard();
  register_hooks();
  register_profiler_stubs();
  register_backing_kernels();
  register_attention_kernels();
  register_sparse_kernels();
  enable_native_route();
  // PyTorch answers is_pinned() for an accelerator only once that accelerator is marked initialised
  // (Context::isPinnedPtr); on a CUDA backing, where pinned buffers come from CUDA's allocator,
  // nothing else marks flagos, and a pinned copy reported "not pinned" until something did.
  at::globalContext().lazyInitDevice(c10::DeviceType::PrivateUse1);
}

py::object wrap_generator(const at::Generator& g) { return py::reinterpret_steal<py::object>(THPGenerator_Wrap(g)); }

py::dict stats(int index) {
  const auto s = device_stats(static_cast<c10::DeviceIndex>(index));
  constexpr auto all = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  py::dict d;
  auto put = [&](const char* name, const c10::CachingAllocator::Stat& stat) {
    d[(std::string(name) + ".current").c_str()] = stat.current;
    d[(std::string(name) + ".peak").c_str()] = stat.peak;
    d[(std::string(name) + ".allocated").c_str()] = stat.allocated;
    d[(std::string(name) + ".freed").c_str()] = stat.freed;
  };
  put("allocated_bytes.all", s.allocated_bytes[all]);
  put("reserved_bytes.all", s.reserved_bytes[all]);
  put("active_bytes.all", s.active_bytes[all]);
  put("requested_bytes.all", s.requested_bytes[all]);
  put("allocation.all", s.allocation[all]);
  put("segment.all", s.segment[all]);
  put("active.all", s.active[all]);
  d["num_alloc_retries"] = s.num_alloc_retries;
  d["num_ooms"] = s.num_ooms;
  d["num_device_alloc"] = s.num_device_alloc;
  d["num_device_free"] = s.num_device_free;
  return d;
}

// A c10::Error raised from these bindings as the Python exception PyTorch raises for it, with the
// message alone: one that reached pybind11's generic handler crashed the interpreter on the H100
// board (torch 2.11, Python 3.12) where the host raised RuntimeError, and what() there would also
// symbolize the C++ backtrace.
void translate_c10_errors(std::exception_ptr error) {
  try {
    if (error) std::rethrow_exception(error);
  } catch (const c10::IndexError& e) {
    PyErr_SetString(PyExc_IndexError, e.what_without_backtrace());
  } catch (const c10::ValueError& e) {
    PyErr_SetString(PyExc_ValueError, e.what_without_backtrace());
  } catch (const c10::TypeError& e) {
    PyErr_SetString(PyExc_TypeError, e.what_without_backtrace());
  } catch (const c10::NotImplementedError& e) {
    PyErr_SetString(PyExc_NotImplementedError, e.what_without_backtrace());
  } catch (const c10::Error& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
  }
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "flagos core: allocator, guard, generators, structural kernels and the C++ routes";
  py::register_local_exception_translator(&translate_c10_errors);
  m.def("init", &init, py::arg("device"), py::arg("host_devices"));
  m.def("device_count", [] { return static_cast<int>(device_count()); });
  m.def("current_device", [] { return static_cast<int>(current_index()); });
  m.def("as_backing", &as_backing, "zero-copy alias of a flagos tensor on the backing device");
  bind_graph_inputs(m);
  bind_autograd_threads(m);
  m.def("hand_to_backing", &hand_to_backing,
        "a backing tensor over a flagos tensor's bytes that owns them through the backing allocator");
  m.def("as_flagos", &as_flagos, py::arg("tensor"), py::arg("host_index") = -1,
        "zero-copy alias of a backing tensor as a flagos tensor");
  m.def("default_generator", [](int i) { return wrap_generator(default_generator(static_cast<c10::DeviceIndex>(i))); });
  m.def("backing_generator",
        [](py::object g) { return wrap_generator(backing_generator(THPGenerator_Unwrap(g.ptr()))); });
  m.def("memory_stats", &stats);
  m.def("reset_peak_memory_stats", [](int i) { reset_peak_stats(static_cast<c10::DeviceIndex>(i)); });
  m.def("reset_accumulated_memory_stats", [](int i) { reset_accumulated_stats(static_cast<c10::DeviceIndex>(i)); });
  m.def("route_counts", [] {
    py::dict d;
    for (const auto& c : route_counts()) d[py::str(c.op)] = py::make_tuple(c.native, c.cpu);
    return d;
  });
  m.def("reset_route_counts", &reset_route_counts);
  m.def("set_cpu_route", &set_cpu_route, py::arg("op"), py::arg("on"));
  m.def("set_log_cpu_fallback", &set_log_cpu_fallback);
  py::class_<RouteFilterHandle, std::shared_ptr<RouteFilterHandle>>(m, "RouteFilterHandle")
      .def_property_readonly(
          "outside", [](const RouteFilterHandle& h) { return h.outside->load(); },
          "calls whose dtype and size a span took but whose extents it refused (they ran native)");
  m.def(
      "install_route_filter",
      [](const std::string& op, const py::list& spans, const py::list& refs, bool composite) {
        std::vector<RouteSpan> converted;
        for (const auto& item : spans) {
          // (torch.dtype or None, min numel, max numel or -1, ((min, max or -1) per ref) or ())
          auto span = item.cast<py::tuple>();
          RouteSpan s;
          if (!span[0].is_none()) {
            TORCH_CHECK(THPDtype_Check(span[0].ptr()), "route filter span: expected a torch.dtype or None");
            s.dtype = reinterpret_cast<THPDtype*>(span[0].ptr())->scalar_type;
          }
          s.min_numel = span[1].cast<int64_t>();
          s.max_numel = span[2].cast<int64_t>();
          for (const auto& limit : span[3].cast<py::tuple>()) {
            auto pair = limit.cast<py::tuple>();
            s.limits.emplace_back(pair[0].cast<int64_t>(), pair[1].cast<int64_t>());
          }
          TORCH_CHECK(s.limits.empty() || s.limits.size() == refs.size(), "route filter span: one limit per extent");
          converted.push_back(std::move(s));
        }
        std::vector<ExtentRef> extent_refs;
        for (const auto& item : refs) {
          auto ref = item.cast<py::tuple>();  // (argument or -1, dim or generic index)
          extent_refs.push_back({ref[0].cast<int64_t>(), ref[1].cast<int64_t>()});
        }
        return install_route_filter(op, converted, extent_refs, composite);
      },
      py::arg("op"), py::arg("spans"), py::arg("refs"), py::arg("composite"),
      "put a C++ filter in front of an op: calls in `spans` reach its PrivateUse2 Python kernel");
  m.def("set_supported_dtypes", &set_supported_dtypes, py::arg("dtypes"),
        "the dtypes torch.accelerator.get_device_capability() reports");
  m.def(
      "host_bytes",
      [](const at::Tensor& t) -> py::object {
        auto bytes = host_bytes(t);
        return bytes.defined() ? py::cast(bytes) : py::none();
      },
      "the CPU storage a host-backed flagos tensor's storage uses, as a byte tensor (None if it owns its memory)");
  m.def("move_host_storage", &move_host_storage, py::arg("tensor"), py::arg("cpu_bytes"));
  m.def(
      "request_lazy_init", [] { torch::utils::set_requires_device_init(c10::DeviceType::PrivateUse1, true); },
      "the next flagos tensor creation calls torch.flagos._lazy_init() again");
}
