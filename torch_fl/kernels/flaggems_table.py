"""The aten overloads FlagGems 5.0.2 implements, for the ``flaggems`` route.

Why this module exists: the flagos runtime offers a ``flaggems`` route candidate for every aten
overload FlagGems registers, and calls the implementation directly on CUDA aliases of flagos
tensors. ``flag_gems.enable()`` is never called: it would register every kernel into torch's
dispatcher for the whole process.

* GPU side: ``registered_ops()`` reads FlagGems' own table (``flag_gems._FULL_CONFIG``, built at
  import after vendor/arch overrides, e.g. the Hopper ``mm``/``mul``/``sqrt``/``fill``) and runs it
  through FlagGems' own ``Register`` filter with a recording stand-in for ``torch.library.Library``.
* CPU side (route tables, no triton): the committed snapshot ``flaggems_5_0_2_ops.txt``, generated
  from the wheel's source by ``write_snapshot`` / ``snapshot_from_source`` (``ast``, no import).
  ``check_snapshot()`` diffs the two on the GPU.

Facts about FlagGems 5.0.2 that the router must respect (``SPECIAL`` lists the affected overloads):

* Registration: every entry goes to ONE key, the vendor's backend key (``CUDA`` on NVIDIA); nothing
  is registered under Autograd keys. Overloads that are CompositeImplicitAutograd in torch
  (``conv2d``, ``pad``, ``var``...) decompose above the backend, so a backend-level route never
  sees them; FlagGems overrides the decomposition with a CUDA kernel, which leaves them with no
  autograd formula. Overloads torch implements only as CompositeExplicitAutograd (``abs``, ``sum``,
  ``full``...) are caught by that kernel before any boxed fallback; routing them needs an explicit
  PrivateUse1 kernel. Some entries name overloads torch does not have (``ABSENT_IN_TORCH``):
  ``lib.impl`` accepts them silently and they are never called.
* Calling convention: call as torch.library would: schema positionals positionally, kwarg-only
  arguments by their schema name (``out=`` included). A few callables differ from the schema.
* RNG: random ops take (seed, offset) from a CUDA ``torch.Generator`` via ``get_state()`` and
  advance its Philox offset with ``set_state()``; without a ``generator`` (and in ``normal*``,
  which ignore it) they use ``torch.cuda.default_generators[torch.cuda.current_device()]``: the
  CURRENT device's, not the tensor's. ``torch.manual_seed`` therefore makes them reproducible, but
  their streams differ from native CUDA kernels for the same seed (measured on the H200), so
  switching the route changes the numbers and the generator's offset advances differently.
* Outputs are allocated with ``torch.empty(..., device=<input device>)`` (the CUDA caching
  allocator, not flagos memory). In-place variants return ``self``; ``out=`` variants expect a
  correctly sized ``out`` (most do not resize). Factory overloads need ``device=`` to name the
  backing CUDA device. Some callables fall back to ``torch.ops.aten.<same op>`` for inputs they do
  not handle (``arcsinh_``, ``log1p_``, ``copy_``, ``_to_copy``...): with FlagGems not enabled this
  runs the native CUDA kernel, so the route is not always Triton.
* Aliases: kernels launch on the current CUDA device and stream, and FlagGems caches launchers per
  ``torch.cuda.current_device()``: make both the alias's. The Hopper ``mm``/``mm.out`` (TMA) fail
  on an alias whose ``data_ptr`` is not 16-byte aligned ("base must be 16-byte aligned", measured).
  Autotuned kernels (``mm``...) tune on the first call per shape bucket (about 30 s for bf16 mm on
  the H200) and keep the result in ``$FLAGGEMS_CACHE_DIR`` (default ``~/.flaggems``).
"""

from __future__ import annotations

import ast
import hashlib
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = [
    "ABSENT_IN_TORCH",
    "FLAGGEMS_VERSION",
    "SNAPSHOT_PATH",
    "SPECIAL",
    "check_snapshot",
    "registered_ops",
    "snapshot_from_source",
    "snapshot_header",
    "snapshot_ops",
    "write_snapshot",
]

FLAGGEMS_VERSION = "5.0.2"
SNAPSHOT_PATH = Path(__file__).with_name("flaggems_5_0_2_ops.txt")
_TABLE_NAME = "_FULL_CONFIG"  # the tuple enable()/only_enable() pass to Register

# Overloads FlagGems 5.0.2 registers that torch's registry lacks (checked on torch 2.11.0+cu130 and
# 2.13.0+cpu with torch._C._dispatch_find_schema_or_throw). Their callables are never reached.
ABSENT_IN_TORCH: dict[str, str] = {
    "aten::bitwise_left_shift": "torch has .Tensor/.Tensor_Scalar/.Scalar_Tensor only",
    "aten::bitwise_right_shift": "torch has .Tensor/.Tensor_Scalar/.Scalar_Tensor only",
    "aten::copysign": "torch has copysign.Tensor/.Scalar only",
    "aten::greater.out": "torch has greater.Tensor_out/.Scalar_out only",
    "aten::new_full.Tensor": "torch has new_full (default overload) only",
    "aten::nll_loss_nd_backward": "not an aten op",
    "aten::nll_loss_nd_forward": "not an aten op (aten::nll_loss_nd is CompositeImplicit)",
    "aten::scaled_softmax_backward": "not an aten op",
    "aten::scaled_softmax_forward": "not an aten op",
}

# CompositeImplicitAutograd in torch 2.11 and 2.13 (a test re-derives it from the running torch).
_COMPOSITE_IMPLICIT = frozenset(
    "aten::" + name
    for name in """
    __ior__.Scalar __ior__.Tensor __or__.Scalar __or__.Tensor absolute arcsinh arcsinh.out arcsinh_
    arctanh_ clip clip_ conj_physical conv1d conv1d.padding conv2d conv2d.padding conv3d
    conv3d.padding diag divide.Scalar divide.Scalar_mode divide.Tensor divide.Tensor_mode
    divide_.Scalar divide_.Scalar_mode divide_.Tensor divide_.Tensor_mode embedding_backward
    gather_backward greater.Scalar greater.Scalar_out greater.Tensor hstack isclose isfinite kron
    log_sigmoid margin_ranking_loss one_hot pad prelu quantile relu6 repeat_interleave.self_Tensor
    repeat_interleave.self_int resolve_conj resolve_neg rms_norm selu selu_ silu_backward square
    square.out square_ tile true_divide.Scalar true_divide.Tensor true_divide_.Scalar
    true_divide_.Tensor var var.dim vstack
    """.split()
)

_RANDOM = frozenset(
    "aten::" + name
    for name in """
    _flash_attention_forward bernoulli_.float exponential_ multinomial native_dropout
    normal.Tensor_Tensor normal.Tensor_float normal.float_Tensor normal_ rand rand_like randn
    randn_like randperm uniform_
    """.split()
)

# Factory overloads: device= comes from the caller and must name the backing CUDA device.
_FACTORY = frozenset(
    "aten::" + name
    for name in "arange arange.start arange.start_step eye eye.m full linspace logspace ones "
    "rand randn randperm zeros".split()
)

# Individually checked ways the FlagGems callable's signature or behaviour differs from aten's.
_CALL: dict[str, str] = {
    "aten::max_pool2d_backward": "callable takes (grad_output, input, indices, kernel_size, ...):"
    " the max_pool2d_with_indices_backward argument set, not this schema's",
    "aten::var.dim": "callable var_dim(x, dim, *, correction, keepdim) cannot take the positional"
    " unbiased/keepdim of the schema",
    "aten::multinomial": "callable names the generator gen=, not generator=",
    "aten::normal.Tensor_float": "generator= is ignored (default generator used), and the"
    " callable has no default for std: always pass std",
    "aten::normal.Tensor_Tensor": "generator= is ignored (default generator used)",
    "aten::normal.float_Tensor": "generator= is ignored (default generator used)",
    "aten::normal_": "generator= is ignored (default generator used)",
    "aten::_grouped_mm": "callable group_mm(A, B, offs) takes no bias/out_dtype",
    "aten::_flash_attention_forward": "no varlen (cum_seq_* must be None), no block_table/"
    "num_splits, returns (out, lse, philox_seed, philox_offset, p), not the schema's"
    " rng_state/unused",
    "aten::native_dropout": "train=None is treated as eval (aten treats it as train)",
    "aten::_assert_async": "tl.device_assert: a no-op unless TRITON_DEBUG=1",
    "aten::_functional_sym_constrain_range_for_size": "returns dep_token itself (an alias), checks no range",
    "aten::_to_copy": "cross-device/complex inputs redispatch to aten (CompositeExplicitAutograd),"
    " and device= must be the alias device",
    "aten::copy_": "cross-device, overlapping, complex or >2**31-element copies redispatch to aten",
}


def _special() -> dict[str, str]:
    reasons: dict[str, list[str]] = {}
    for op in sorted(_COMPOSITE_IMPLICIT):
        reasons.setdefault(op, []).append(
            "composite-implicit: torch decomposes it above the backend, and FlagGems' CUDA override has no autograd"
        )
    for op, why in ABSENT_IN_TORCH.items():
        reasons.setdefault(op, []).append(f"absent: {why}")
    for op in sorted(_RANDOM):
        reasons.setdefault(op, []).append(
            "random: Philox seed/offset from a CUDA generator (default: current device's)"
        )
    for op in sorted(_FACTORY):
        reasons.setdefault(op, []).append("factory: device= must be the backing CUDA device")
    for op, why in _CALL.items():
        reasons.setdefault(op, []).append(f"call: {why}")
    return {op: "; ".join(parts) for op, parts in sorted(reasons.items())}


# Overloads the router must not route naively: op -> "category: reason[; category: reason]".
SPECIAL: dict[str, str] = _special()


def _qualified(key: str) -> str:
    """FlagGems key ("add.Tensor", "abs") -> registry name ("aten::add.Tensor", "aten::abs")."""
    return key if key.startswith("aten::") else f"aten::{key}"


class _Recorder:
    """Stands in for ``torch.library.Library`` in FlagGems' ``Register``; registers nothing."""

    def __init__(self) -> None:
        self.impls: dict[str, Callable[..., Any]] = {}
        self.dispatch_keys: set[str] = set()

    def impl(self, op_name: str, fn: Callable[..., Any], dispatch_key: str = "", **_: Any) -> None:
        # torch.library rejects a second Python kernel for the same op/key, and Register catches
        # that, so the first entry is the one FlagGems would leave registered.
        self.impls.setdefault(_qualified(op_name), fn)
        self.dispatch_keys.add(dispatch_key)


def registered_ops() -> dict[str, Callable[..., Any]]:
    """Every aten overload FlagGems would register in ``enable()``, mapped to its callable.

    FlagGems builds no table outside ``enable()``: ``enable()`` hands the module-level
    ``_FULL_CONFIG`` to ``Register``, which drops entries whose condition is false, the vendor's
    unused ops and the C++-patched ops, then calls ``lib.impl`` per entry. Running that same
    ``Register`` with a recorder as ``lib`` reuses FlagGems' filtering as-is, registers nothing in
    torch's dispatcher and leaves FlagGems' globals (``current_work_registrar``) untouched.
    Raises ImportError where flag_gems cannot be imported (no triton, e.g. on the CPU machine).
    """
    import flag_gems
    from flag_gems.config import aten_patch_list
    from flag_gems.runtime.register import Register

    recorder = _Recorder()
    Register(
        getattr(flag_gems, _TABLE_NAME),
        user_include_ops=[],
        user_exclude_ops=[],  # what enable() resolves its default unused=None to
        cpp_patched_ops=list(set(aten_patch_list)),
        lib=recorder,
    )
    return dict(recorder.impls)


def _read_init_source(path: str | Path) -> str:
    """Source of flag_gems/__init__.py from a wheel, an unpacked tree, the package or the file."""
    path = Path(path)
    if path.is_file() and zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as wheel:
            return wheel.read("flag_gems/__init__.py").decode()
    for candidate in (path / "flag_gems" / "__init__.py", path / "__init__.py", path):
        if candidate.is_file():
            return candidate.read_text()
    raise FileNotFoundError(f"no flag_gems/__init__.py under {path}")


def _table_entries(source: str) -> list[tuple[str, bool]]:
    """(FlagGems key, has-condition) per entry of the module-level ``_FULL_CONFIG`` literal."""
    for node in ast.parse(source).body:
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == _TABLE_NAME for t in node.targets)
            and isinstance(node.value, (ast.Tuple, ast.List))
        ):
            entries = []
            for item in node.value.elts:
                if not (
                    isinstance(item, ast.Tuple)
                    and len(item.elts) in (2, 3)
                    and isinstance(item.elts[0], ast.Constant)
                    and isinstance(item.elts[0].value, str)
                ):
                    raise ValueError(f"unexpected {_TABLE_NAME} entry: {ast.unparse(item)}")
                entries.append((item.elts[0].value, len(item.elts) == 3))
            return entries
    raise ValueError(f"no module-level {_TABLE_NAME} tuple in flag_gems/__init__.py")


def snapshot_from_source(path: str | Path) -> list[str]:
    """Sorted, unique ``aten::name[.overload]`` of the registration table, parsed without import.

    ``path``: the flag-gems wheel, a directory it was unzipped into, the ``flag_gems`` package
    directory, or its ``__init__.py``. Conditional entries are included (in 5.0.2 both conditions
    are ``torch >= 2.4``).
    """
    return sorted({_qualified(key) for key, _ in _table_entries(_read_init_source(path))})


def _body_digest(ops: list[str]) -> str:
    return hashlib.sha256("".join(f"{op}\n" for op in ops).encode()).hexdigest()


def write_snapshot(source: str | Path, dest: str | Path = SNAPSHOT_PATH) -> list[str]:
    """Regenerate the committed snapshot from a flag-gems source (see ``snapshot_from_source``)."""
    entries = _table_entries(_read_init_source(source))
    ops = sorted({_qualified(key) for key, _ in entries})
    conditional = sorted({_qualified(key) for key, cond in entries if cond})
    header = [
        f"# aten overloads registered by flag_gems {FLAGGEMS_VERSION}: one per line, sorted.",
        f"# Generated from flag_gems/__init__.py:{_TABLE_NAME} (the table enable() passes to",
        "# flag_gems.runtime.register.Register) by torch_fl.kernels.flaggems_table.write_snapshot",
        "# (parser: snapshot_from_source). Do not edit by hand. 'conditional' entries carry a",
        "# condition callable in the table and are registered only when it returns true.",
        "# conditional: " + " ".join(conditional),
        f"# entries: {len(ops)}",
        f"# sha256: {_body_digest(ops)}",
    ]
    Path(dest).write_text("\n".join(header) + "\n" + "".join(f"{op}\n" for op in ops))
    return ops


def snapshot_ops(path: str | Path = SNAPSHOT_PATH) -> list[str]:
    """The committed snapshot's overloads, in file order."""
    lines = Path(path).read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def snapshot_header(path: str | Path = SNAPSHOT_PATH) -> dict[str, str]:
    """The snapshot header's ``# key: value`` fields (conditional, entries, sha256)."""
    header = {}
    for line in Path(path).read_text().splitlines():
        key, sep, value = line[1:].strip().partition(": ")
        if line.startswith("#") and sep and key.isidentifier():
            header[key] = value
    return header


def check_snapshot() -> list[str]:
    """Differences between the committed snapshot and what the importable FlagGems registers.

    ``+op``: registered but not in the snapshot; ``-op``: in the snapshot but not registered.
    Raises ImportError where flag_gems cannot be imported.
    """
    live, snap = set(registered_ops()), set(snapshot_ops())
    return [f"+{op}" for op in sorted(live - snap)] + [f"-{op}" for op in sorted(snap - live)]
