// The boundary of a compiled flagos graph under the CUDA graph machinery
// (torch_fl.runtime.inductor.over_backing), crossed on every replay. The graph's static inputs (a
// decode step's parameters and cache tensors, most of its inputs) cross as the program's own flagos
// tensors: the machinery only reads their addresses. The others become backing aliases, which the
// machinery copies into its own buffers; the outputs come back as flagos. One C++ call each way:
// between two graph calls a model's Python and driver work leave the caches cold, and a Python loop
// over the inputs costs about 1 us per input there.
#include "backing.h"

#include <torch/csrc/autograd/python_variable.h>
#include <torch/extension.h>

#include <string>
#include <vector>

// Errors are raised as pybind11's own exceptions: a c10::Error thrown out of these methods crashed
// the interpreter on the H100 board (torch 2.11, Python 3.12), with or without the module's
// translator, where the host raised the translated error.
namespace torch_fl {
namespace {

class GraphInputs {
 public:
  explicit GraphInputs(std::vector<Py_ssize_t> positions) : positions_(std::move(positions)) {
    for (size_t k = 0; k < positions_.size(); ++k) {
      if (positions_[k] < 0 || (k > 0 && positions_[k] <= positions_[k - 1])) {
        throw py::value_error("GraphInputs: positions must be increasing and not negative");
      }
    }
  }

  // A new list: `inputs` with the flagos tensor at each position as an owning backing alias.
  py::list to_backing(const py::list& inputs) const {
    PyObject* given = inputs.ptr();
    const Py_ssize_t size = PyList_GET_SIZE(given);
    if (!positions_.empty() && positions_.back() >= size) {
      throw py::index_error("GraphInputs: position " + std::to_string(positions_.back()) + " is outside the " +
                            std::to_string(size) + " inputs");
    }
    py::list out(size);
    size_t k = 0;  // the next position
    for (Py_ssize_t i = 0; i < size; ++i) {
      PyObject* item = PyList_GET_ITEM(given, i);
      if (k == positions_.size() || positions_[k] != i) {
        Py_INCREF(item);
        PyList_SET_ITEM(out.ptr(), i, item);
        continue;
      }
      ++k;
      if (!THPVariable_Check(item))
        throw py::type_error("GraphInputs: input " + std::to_string(i) + " is not a tensor");
      PyObject* alias = THPVariable_Wrap(as_backing(THPVariable_Unpack(item)));
      if (alias == nullptr) throw py::error_already_set();
      PyList_SET_ITEM(out.ptr(), i, alias);
    }
    return out;
  }

  // The positions of flagos tensors among the graph's outputs (known once it has run on flagos).
  void set_outputs(std::vector<Py_ssize_t> positions) { outputs_ = std::move(positions); }

  // `outputs` (a list or tuple) with the backing tensors at the output positions as flagos: over the
  // program's own storage where the machinery returns an alias of a static input
  // (as_flagos_over_source), an owning alias otherwise.
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
      PyObject* flagos = THPVariable_Wrap(as_flagos_over_source(THPVariable_Unpack(item)));
      if (flagos == nullptr) throw py::error_already_set();
      PyList_SetItem(converted.ptr(), i, flagos);  // takes `flagos`, lets go of the backing tensor
    }
    return is_tuple ? py::object(py::tuple(converted)) : py::object(converted);
  }

 private:
  std::vector<Py_ssize_t> positions_;
  std::vector<Py_ssize_t> outputs_;
};

}  // namespace

void bind_graph_inputs(py::module_& m) {
  py::class_<GraphInputs>(m, "GraphInputs",
                          "a compiled graph's boundary with the CUDA graph machinery: the flagos inputs at "
                          "`positions` as backing aliases, the flagos outputs back as flagos")
      .def(py::init<std::vector<Py_ssize_t>>(), py::arg("positions"))
      .def("to_backing", &GraphInputs::to_backing, py::arg("inputs"),
           "a new list: `inputs` with the flagos tensors at the positions as owning backing aliases")
      .def("set_outputs", &GraphInputs::set_outputs, py::arg("positions"),
           "the positions of flagos tensors among the graph's outputs")
      .def("outputs_as_flagos", &GraphInputs::outputs_as_flagos, py::arg("outputs"),
           "`outputs` (a list or tuple) with the tensors at the output positions as flagos, over the program's "
           "own storage where they alias it");
}

}  // namespace torch_fl
