// The inputs of a compiled flagos graph as the CUDA graph machinery takes them, converted before
// every replay (torch_fl.runtime.inductor.over_backing). A decode step's graph has a parameter or
// cache tensor per input, and between two graph calls a model's Python and driver work evict what
// the conversion touches: it keeps per input what it would otherwise look up again.
#include "backing.h"

#include <torch/csrc/autograd/python_variable.h>
#include <torch/extension.h>

#include <string>
#include <vector>

// Errors are raised as pybind11's own exceptions: a c10::Error thrown out of these methods crashed
// the interpreter on the H100 board (torch 2.11, Python 3.12) where the host raised RuntimeError.
namespace torch_fl {
namespace {

class GraphInputs {
 public:
  GraphInputs(std::vector<Py_ssize_t> positions, const std::vector<bool>& keep)
      : positions_(std::move(positions)), keep_(keep.begin(), keep.end()), held_(positions_.size()) {
    if (keep_.size() != positions_.size()) throw py::value_error("GraphInputs: one keep flag per position");
    for (size_t k = 0; k < positions_.size(); ++k) {
      if (positions_[k] < 0 || (k > 0 && positions_[k] <= positions_[k - 1])) {
        throw py::value_error("GraphInputs: positions must be increasing and not negative");
      }
    }
  }

  // `inputs` with the flagos tensor at each position replaced by a backing alias: the one kept for
  // the position where it is kept (a static input), an owning one otherwise.
  py::list to_backing(const py::list& inputs) {
    PyObject* given = inputs.ptr();
    const Py_ssize_t size = PyList_GET_SIZE(given);
    if (!positions_.empty() && positions_.back() >= size) {
      throw py::index_error("GraphInputs: position " + std::to_string(positions_.back()) + " is outside the " +
                            std::to_string(size) + " inputs");
    }
    for (size_t k = 0; k < positions_.size(); ++k) {
      // A Parameter's isinstance check goes through its metaclass: the type seen last is let through.
      PyObject* item = PyList_GET_ITEM(given, positions_[k]);
      if (Py_TYPE(item) != held_[k].type && !THPVariable_Check(item)) {
        throw py::type_error("GraphInputs: input " + std::to_string(positions_[k]) + " is not a tensor");
      }
      held_[k].type = Py_TYPE(item);
    }
    py::list out(size);
    size_t k = 0;  // the next position
    for (Py_ssize_t i = 0; i < size; ++i) {
      PyObject* item = PyList_GET_ITEM(given, i);
      if (k == positions_.size() || positions_[k] != i) {
        Py_INCREF(item);
        PyList_SET_ITEM(out.ptr(), i, item);
      } else {
        PyList_SET_ITEM(out.ptr(), i, alias(item, k++));
      }
    }
    return out;
  }

  // The positions of flagos tensors among the graph's outputs (known once it has run on flagos).
  void set_outputs(std::vector<Py_ssize_t> positions) { outputs_ = std::move(positions); }

  // `outputs` (a list or tuple) with the backing tensors at the output positions as flagos, over the
  // program's own storage where they lie over a kept alias (KeptAliases::as_flagos): one call
  // instead of a Python loop, which between a model's graph calls runs from cold caches.
  py::object outputs_as_flagos(const py::object& outputs) const {
    if (outputs_.empty()) return outputs;
    const bool is_tuple = PyTuple_Check(outputs.ptr());
    if (!is_tuple && !PyList_Check(outputs.ptr()))
      throw py::type_error("GraphInputs: outputs must be a list or a tuple");
    py::list converted(outputs);
    for (const Py_ssize_t i : outputs_) {
      if (i >= PyList_GET_SIZE(converted.ptr()))
        throw py::index_error("GraphInputs: output " + std::to_string(i) + " is missing");
      PyObject* item = PyList_GET_ITEM(converted.ptr(), i);
      if (!THPVariable_Check(item))
        throw py::type_error("GraphInputs: output " + std::to_string(i) + " is not a tensor");
      PyObject* flagos = THPVariable_Wrap(kept_.as_flagos(THPVariable_Unpack(item)));
      if (flagos == nullptr) throw py::error_already_set();
      PyList_SetItem(converted.ptr(), i, flagos);  // takes `flagos`, lets go of the backing tensor
    }
    return is_tuple ? py::object(py::tuple(converted)) : py::object(converted);
  }

 private:
  // A new reference to the backing alias of `item`, the tensor at position `k`.
  PyObject* alias(PyObject* item, size_t k) {
    Held& held = held_[k];
    const at::Tensor& t = THPVariable_Unpack(item);
    if (!keep_[k]) {
      PyObject* alias = THPVariable_Wrap(as_backing(t));
      if (alias == nullptr) throw py::error_already_set();
      return alias;
    }
    const at::Tensor& kept = kept_.alias(t, k);
    // The alias's Python object is held with it, so that it is not looked up (or made) again.
    if (held.alias.ptr() == nullptr ||
        THPVariable_Unpack(held.alias.ptr()).unsafeGetTensorImpl() != kept.unsafeGetTensorImpl()) {
      held.alias = py::reinterpret_steal<py::object>(THPVariable_Wrap(kept));
      if (held.alias.ptr() == nullptr) throw py::error_already_set();
    }
    return held.alias.inc_ref().ptr();
  }

  struct Held {
    PyTypeObject* type = nullptr;  // the Python type of the position's last input
    py::object alias;              // the Python object of the position's kept alias
  };
  std::vector<Py_ssize_t> positions_;
  std::vector<char> keep_;
  KeptAliases kept_;
  std::vector<Held> held_;
  std::vector<Py_ssize_t> outputs_;
};

}  // namespace

void bind_graph_inputs(py::module_& m) {
  py::class_<GraphInputs>(m, "GraphInputs",
                          "the flagos inputs of a compiled graph, at `positions`, as backing aliases for the CUDA "
                          "graph machinery: kept from one call to the next where `keep` says so (static inputs), "
                          "while they alias the same bytes; kept aliases hold nothing alive")
      .def(py::init<std::vector<Py_ssize_t>, const std::vector<bool>&>(), py::arg("positions"), py::arg("keep"))
      .def("to_backing", &GraphInputs::to_backing, py::arg("inputs"),
           "a new list: `inputs` with the flagos tensors at the positions as backing aliases (a kept one is "
           "valid while the call lasts)")
      .def("set_outputs", &GraphInputs::set_outputs, py::arg("positions"),
           "the positions of flagos tensors among the graph's outputs")
      .def("outputs_as_flagos", &GraphInputs::outputs_as_flagos, py::arg("outputs"),
           "`outputs` (a list or tuple) with the tensors at the output positions as flagos, over the program's "
           "own storage where they lie over a kept alias");
}

}  // namespace torch_fl
