"""Reference workloads shared by the tuner, the benchmarks, the conformance model case and the demo."""
