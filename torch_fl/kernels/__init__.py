"""Execution paths ("kernel sets") a route can choose: native, flaggems, vendor, emulated, cpu.

Each path is a `KernelSet` (see base.py): a name, the ops it offers, and `call(op, args, kwargs)`
on flagos tensors. `native` and `cpu` are normally served by the C++ core without Python; their
Python forms here are used when a route must pick per shape or a path is forced.
"""
