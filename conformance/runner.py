"""Runs the conformance plugin in a pytest subprocess with pytest-xdist workers.

The subprocess is the controller (it never imports torch); its workers activate the platform.
Always at least one worker, so a kernel that crashes or hangs kills a worker, never the run.
pytest's own output goes to a log in the run folder; progress goes to stderr (count lines only
when quiet, as under --json).

What a run may replace: one run at a time per record (a lock file beside it, `torch-<line>.lock`);
the record itself only when the run completes (until then its merges go to the run folder); and
a record only by a full run or by `--add` (which starts one where there is none): a subset run
writes `torch-<line>.partial.json` beside it instead. A plain run whose complete record is stale only because platform sources
changed re-runs just the cases they decide (torch_fl.conformance.incremental), as an `--add` run
that drops those cases' old verdicts first; `--full` runs everything. `--shard i/N` runs a share of
the items into a record of its own, for `merge_shards` (torch_fl.conformance.shards). The pytest
process and everything it starts form a process group of their own that ends with this process,
however it ends.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch_fl.conformance import incremental, journal, shards
from torch_fl.conformance.recordfile import partial_path
from torch_fl.conformance.summary import summary_path
from torch_fl.fileio import RefusedFile, load_json
from torch_fl.filelock import hold
from torch_fl.platform.errors import RecordError
from torch_fl.platform.record import load_raw

SUITES: tuple[str, ...] = (
    "ops",
    "sweep",
    "amp",
    "rng",
    "ddp",
    "fsdp2",
    "compile",
    "profiler",
    "sharing",
    "sparse",
    "model",
    "workload",
    "captured",
)
"""Every suite, in the order they run (the short ones first, so their results show early)."""
RUN_ORDER: tuple[str, ...] = (
    "rng",
    "amp",
    "profiler",
    "sharing",
    "sparse",
    "ddp",
    "fsdp2",
    "compile",
    "model",
    "workload",
    "captured",
    "sweep",
    "ops",
)
PATHS: tuple[str, ...] = ("native", "flaggems", "vendor", "emulated", "cpu")
_SCRUBBED_PREFIXES = ("FLAGOS_ROUTE_",)
_SCRUBBED = ("FLAGOS_ROUTES", "FLAGOS_STRICT", "FLAGOS_ALLOW_UNVALIDATED")
SWEEP_SCOPES = ("all", "routed")
"""What the sweep suite sweeps: every op a gated path implements, or only the ops the platform's
route table can send off native (a non-native candidate before native, or a tuned bucket). With
`routed`, the other ops' routes are proven at the ops suite's sizes only, so their larger calls run
native: a board with hundreds of FlagGems kernels sweeps what its table uses in minutes."""


@dataclass
class RunOptions:
    """What `torch-fl conformance run` was asked for."""

    platform: str
    k: str | None = None
    workers: str = "auto"
    suites: list[str] | None = None
    paths: list[str] | None = None
    resume: bool = False
    discard: bool = False
    add: bool = False
    full: bool = False
    replace_ops: list[str] = field(default_factory=list)
    timeout: float = 60.0
    record_dir: Path | None = None
    quiet: bool = False
    samples: int = 2
    sweep: str = "all"
    warmup_timeout: float = 900.0
    shard: str | None = None
    """`i/N`: run shard i of N (torch_fl.conformance.shards) into its own record, for `merge`."""
    items: list[str] | None = None
    """Only these pytest node ids (an incremental run's: exact, where -k matches substrings and
    pytest cannot compile an expression of a thousand names)."""
    pytest_args: list[str] = field(default_factory=list)


@dataclass
class RunOutcome:
    """What a run left: `record_file` is the record it completed (the partial one for a subset run
    beside a complete record), or, when it did not complete, its interim record in the run folder."""

    returncode: int
    record_file: Path
    summary_file: Path
    log_file: Path
    wall_s: float
    record: dict[str, Any] | None
    complete: bool
    partial: bool
    plan: incremental.Plan | None = None
    """What an incremental run re-ran (None: the run was what it was asked to be)."""
    error: str | None = None
    """Why a run whose pytest ended well did not complete: the record is not the one it wrote."""


def record_file_for(platform: str, record_dir: Path | None, shard: str | None = None) -> Path:
    """Where the record goes: `<record_dir>/torch-<line>.json`, default the platform's records folder;
    a shard's beside it (`torch-<line>.shard-i-of-N.json`)."""
    from torch_fl.platform.discovery import load_platform
    from torch_fl.platform.record import RECORDS_DIR, installed_version
    from torch_fl.platform.versions import minor_line

    descriptor = load_platform(platform)
    line = minor_line(installed_version("torch") or "0")
    # Absolute: the run's pytest works in the run folder, where a relative path means another place.
    folder = Path(record_dir).absolute() if record_dir is not None else Path(descriptor.directory) / RECORDS_DIR
    record = folder / f"torch-{line}.json"
    return shards.Shard.parse(shard).record_file(record) if shard else record


def suite_file(name: str) -> str:
    spec = importlib.util.find_spec(f"torch_fl.conformance.suites.{name}")
    if spec is None or spec.origin is None:
        raise ValueError(f"unknown suite {name!r}; suites: {', '.join(SUITES)}")
    return spec.origin


def validate(options: RunOptions) -> None:
    unknown = [s for s in options.suites or [] if s not in SUITES]
    if unknown:
        raise ValueError(f"unknown suite(s) {unknown}; suites: {', '.join(SUITES)}")
    unknown = [p for p in options.paths or [] if p not in PATHS]
    if unknown:
        raise ValueError(f"unknown path(s) {unknown}; paths: {', '.join(PATHS)}")
    if options.sweep not in SWEEP_SCOPES:
        raise ValueError(f"--sweep takes one of {', '.join(SWEEP_SCOPES)}; got {options.sweep!r}")
    if options.workers != "auto" and (not str(options.workers).isdigit() or int(options.workers) < 1):
        raise ValueError("-n takes 'auto' or a number of workers >= 1 (a worker is what survives a crashing kernel)")
    if options.discard and options.resume:
        raise ValueError("--discard drops the journal that --resume would continue: pass one of them")
    if options.add and options.resume:
        raise ValueError(
            "--add and --resume cannot be combined: an interrupted --add run leaves the record as it was; run it again"
        )
    if options.shard is not None:
        shards.Shard.parse(options.shard)
        if options.add:
            raise ValueError("--shard and --add cannot be combined: merge the shards, then add to the record")
    if options.full and (options.add or options.resume or is_subset(options)):
        raise ValueError(
            "--full runs every suite on every path from scratch: leave out --add, --resume, -k, --suite, --paths"
        )


def incremental_plan(options: RunOptions, record_file: Path) -> incremental.Plan | None:
    """The incremental run a plain run becomes (None: it stays what it was asked to be)."""
    if options.full or options.add or options.resume or options.shard or is_subset(options):
        return None
    from torch_fl.conformance.recordfile import identity
    from torch_fl.platform.discovery import load_platform
    from torch_fl.platform.record import Binding

    descriptor = load_platform(options.platform)
    return incremental.plan(descriptor, record_file, Binding(**identity(descriptor)["binding"]))


def _as_incremental(options: RunOptions, plan: incremental.Plan) -> RunOptions:
    """The plan's run: its items, on the vendor path, added to the record in place of their old cases."""
    options.suites, options.paths, options.items = plan.suites, [incremental.VENDOR], plan.items
    options.add, options.replace_ops = True, plan.ops
    return options


def check_addable(platform: str, record_file: Path, sources_changed: bool = False) -> None:
    """--add adds cases to a complete record made here: same descriptor, torch and kernel libraries,
    and platform sources (unless `sources_changed`: an incremental run re-runs what they decide).
    Where there is no record yet, --add starts it with the run's cases."""
    from torch_fl.conformance.recordfile import identity
    from torch_fl.platform.discovery import load_platform

    if not record_file.is_file():
        return  # nothing to match: the run starts the record with its cases
    try:
        record = load_raw(record_file)
    except RecordError as exc:
        raise ValueError(f"--add: {exc}; run the conformance without --add") from None
    expected = identity(load_platform(platform))
    if not record.get("complete"):
        raise ValueError(f"--add: {record_file} is not complete; finish it with --resume first")
    from torch_fl.platform.record import Binding, binding_differences

    if record.get("platform") != expected["platform"]:
        raise ValueError(
            f"--add: {record_file} is a record of platform {record.get('platform')!r}; "
            "run the whole conformance without --add"
        )
    try:
        binding = Binding.model_validate(record.get("binding"))
        now = Binding(**expected["binding"])
        if sources_changed:
            now = now.model_copy(update={"sources": binding.sources})
        differences = binding_differences(binding, now)
    except ValueError as exc:
        differences = [f"its binding is unreadable ({str(exc)[:200]})"]
    if differences:
        raise ValueError(
            f"--add: {record_file} was made for another checkout or machine: {'; '.join(differences)}; "
            "run the whole conformance without --add"
        )


def resume_selection(options: RunOptions, record_file: Path) -> RunOptions:
    """With --resume, the selection of the interrupted run (from its journal) is the one continued."""
    path = journal.journal_path(record_file)
    header = journal.header(path)
    if header is None:
        raise ValueError(
            f"--resume: there is no journal of an interrupted run to continue ({path} is missing or has "
            "no run header); run without --resume to start a fresh run"
        )
    chosen = header.get("selection", {})
    if chosen.get("replace_ops"):
        raise ValueError(
            "--resume: the interrupted run re-validated edited platform sources, which leaves the record "
            "as it was until it completes; run without --resume to re-validate them again"
        )
    for key, given, stored in (
        ("suites", options.suites, chosen.get("suites")),
        ("paths", options.paths, chosen.get("paths")),
        ("-k", options.k, chosen.get("k")),
    ):
        if not _same(given, stored):
            raise ValueError(f"--resume continues the journaled run, whose {key} is {stored!r}; you passed {given!r}")
    options.suites = chosen.get("suites") or None
    options.paths = chosen.get("paths") or None
    options.k = chosen.get("k") or None
    options.samples = int(chosen.get("samples", options.samples))
    options.sweep = str(chosen.get("sweep", options.sweep))
    return options


def _same(given: list[str] | str | None, stored: list[str] | str | None) -> bool:
    if given is None:
        return True  # not given: the journaled value is used
    if isinstance(given, list):
        return sorted(given) == sorted(stored or [])
    return given == (stored or None)


def is_subset(options: RunOptions) -> bool:
    """Does the run check less than everything (-k, some suites, some paths)?"""
    return (
        bool(options.k or options.items)
        or set(options.suites or SUITES) != set(SUITES)
        or set(options.paths or PATHS) != set(PATHS)
    )


def keep_interrupted(options: RunOptions, record_file: Path) -> None:
    """A run that does not resume must not replace the journal of an interrupted run, the one way to
    finish it: that journal goes only with --discard."""
    path = journal.journal_path(record_file)
    if options.resume or not os.path.lexists(path):
        return
    if not options.discard:
        raise ValueError(
            f"{path} is the journal of an interrupted run: continue it with --resume, "
            "or pass --discard to drop it and start this run"
        )
    path.unlink()


def not_written(output: Path, folder: Path) -> str | None:
    """Why `output` is not the record the run's pytest says it wrote (in the run folder's WRITTEN),
    or None when it is: a run is reported only by the record it left on disk."""
    try:
        said = load_json(folder / journal.WRITTEN, 1 << 16)
        on_disk = load_raw(output)
    except (RefusedFile, RecordError) as exc:
        return f"{output}: not confirmed as this run's record ({exc}); see the log"
    if (
        not isinstance(said, dict)
        or said.get("record") != str(output)
        or said.get("checksum") != on_disk.get("checksum")
    ):
        return f"{output}: not the record this run wrote (it says it wrote {str(said)[:300]}); see the log"
    return None


def destination(options: RunOptions, record_file: Path) -> Path:
    """Where the run's record goes when it completes: the record, unless a subset run (without
    --add) would write it; then beside it. A subset would lose a complete record's validated
    routes, and where there is none it would become the record the gate serves from, unasked (a
    new chip's first quick check). --add asks for exactly that. A shard's record is never the one
    the gate reads: the merge of all shards decides where the whole goes."""
    if options.add or options.shard or not is_subset(options):
        return record_file
    return partial_path(record_file)


def items_file(folder: Path) -> Path:
    """The node ids a run is limited to, one per line, in its run folder."""
    return folder / "items.txt"


def pytest_command(options: RunOptions, record_file: Path, ini: Path, output: Path) -> list[str]:
    suites = [s for s in RUN_ORDER if s in (options.suites or SUITES)]
    item_timeout = max(600.0, 10 * options.timeout)
    argv = [
        sys.executable,
        "-m",
        "pytest",
        *[suite_file(s) for s in suites],
        "-c",
        str(ini),
        "--rootdir",
        str(Path(suite_file("ops")).parent),
        # Plugin autoloading is off (see subprocess_env): exactly these plugins run, whatever else is installed.
        "-p",
        "torch_fl.conformance.plugin",
        "-p",
        "xdist.plugin",
        "-p",
        "pytest_timeout",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:faulthandler",
        "-n",
        str(options.workers),
        # Idle workers take pending items from busy ones: an incremental run's few costly items
        # (board-size GEMMs) would otherwise sit in one worker's first batch while the other idles.
        "--dist",
        "worksteal",
        "--max-worker-restart",
        "100000",
        # pytest-timeout is the backstop; the plugin's own watchdog ends a case first (and a GIL-holding one too).
        "--timeout",
        str(int(item_timeout * 3)),
        "--timeout-method",
        "thread",
        # Suite files are named on the command line, so they are collected whatever python_files says
        # (and python_files must stay narrow: pytest rewrites the assertions of every module it matches).
        "-o",
        "python_functions=test_*",
        "-o",
        "python_classes=Test*",
        "-q",
        "-rfE",
        "--tb=short",
        "-W",
        "ignore::UserWarning",
        "--fl-platform",
        options.platform,
        "--fl-record",
        str(record_file),
        "--fl-output",
        str(output),
        "--fl-parent-pid",
        str(os.getpid()),
        "--fl-suites",
        ",".join(suites),
        "--fl-paths",
        ",".join(options.paths or []),
        "--fl-samples",
        str(options.samples),
        "--fl-sweep",
        options.sweep,
        "--fl-case-timeout",
        str(options.timeout),
        "--fl-item-timeout",
        str(item_timeout),
        "--fl-warmup-timeout",
        str(max(options.timeout, options.warmup_timeout)),
    ]
    if options.k:
        argv += ["-k", options.k]
    if options.resume:
        argv.append("--fl-resume")
    if options.add and record_file.is_file():  # with no record yet there is nothing to extend
        argv.append("--fl-add")
    if options.replace_ops:
        argv += ["--fl-replace-ops", ",".join(options.replace_ops)]
    if options.shard:
        argv += ["--fl-shard", options.shard]
    if options.items is not None:
        argv += ["--fl-items", str(items_file(ini.parent))]
    if options.quiet:
        argv.append("--fl-quiet")
    return argv + list(options.pytest_args)


def subprocess_env(platform: str) -> dict[str, str]:
    """The environment of the run: the platform named, no route overrides of the caller's shell."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_SCRUBBED_PREFIXES) and k not in _SCRUBBED}
    env["FLAGOS_PLATFORM"] = platform
    env["PYTHONUNBUFFERED"] = "1"
    # Workers pin FlagGems' autotuners to untimed choices (Session.activate); a throw-away
    # database keeps those choices out of the tuning results the runtime reads. In memory, one
    # per worker, shared by its threads (autograd runs backward kernels in a thread of its own).
    env["FLAGGEMS_DB_URL"] = "sqlite:///file:flaggems_conformance?mode=memory&cache=shared&uri=true"
    env.pop("PYTEST_ADDOPTS", None)
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    env.pop("PYTEST_XDIST_AUTO_NUM_WORKERS", None)
    return env


def _run_pytest(argv: list[str], platform: str, log: Any, cwd: Path) -> int:
    """pytest in a process group of its own; the group is killed when this process is stopped
    (SIGTERM, SIGHUP, Ctrl-C); when it is killed outright, the plugin's watch of its parent ends it."""
    proc = subprocess.Popen(
        argv,
        env=subprocess_env(platform),
        stdout=log,
        stderr=None,  # progress lines (count lines only under --json, whose document is stdout)
        stdin=subprocess.DEVNULL,
        cwd=cwd,
        start_new_session=True,
    )
    try:
        return proc.wait()
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise


def run(options: RunOptions) -> RunOutcome:
    """Run the suites; returns where the record is and what it says (None when none was written)."""
    validate(options)
    record_file = record_file_for(options.platform, options.record_dir, options.shard)
    line = record_file.stem.removeprefix("torch-")
    what = f"a conformance run of {options.platform} on torch {line} into {record_file.parent}"
    with hold(record_file.with_suffix(".lock"), what):
        keep_interrupted(options, record_file)
        if options.resume:
            options = resume_selection(options, record_file)
        plan = incremental_plan(options, record_file)
        if plan is not None:
            options = _as_incremental(options, plan)
        if options.add:
            check_addable(options.platform, record_file, sources_changed=plan is not None)
        output = destination(options, record_file)
        folder = journal.run_dir(record_file)
        folder.mkdir(parents=True, exist_ok=True)
        ini = folder / "pytest.ini"
        ini.write_text("[pytest]\n")
        if options.items is not None:
            items_file(folder).write_text("".join(f"{item}\n" for item in options.items))
        log_file = folder / "pytest.log"
        (folder / journal.WRITTEN).unlink(missing_ok=True)  # an earlier run's word is not this one's
        argv = pytest_command(options, record_file, ini, output)
        started = time.monotonic()
        with open(log_file, "w") as log:
            log.write(" ".join(argv) + "\n\n")
            log.flush()
            returncode = _run_pytest(argv, options.platform, log, folder)
        wall = time.monotonic() - started
        # The controller writes the interim record whenever it stops short of completing, and
        # removes it when it completes; a pytest that died before either leaves the exit status.
        interim = journal.interim_record(record_file)
        complete = returncode in (0, 1, 5) and not interim.is_file() and output.is_file()
        error = not_written(output, folder) if complete else None
        complete = complete and error is None
        written = output if complete else interim
        record = None
        if written.is_file():
            try:
                record = load_raw(written)
            except RecordError:
                record = None
        outcome = RunOutcome(
            returncode,
            written,
            summary_path(written),
            log_file,
            wall,
            record,
            complete,
            output != record_file,
            plan,
            error,
        )
        if complete:
            shutil.rmtree(folder, ignore_errors=True)  # the record says it all; the log only helps a failed start
    return outcome


def merge_shards(platform: str, record_dir: Path | None) -> shards.Merged:
    """Merge the shards of a sharded run into the record, or into the partial record beside a
    complete one when the shards ran a subset (as the run itself would have written it)."""
    record_file = record_file_for(platform, record_dir)
    chosen = shards.selection_of(record_file)
    ran = RunOptions(
        platform, k=chosen.get("k") or None, suites=chosen.get("suites") or None, paths=chosen.get("paths") or None
    )
    return shards.merge(record_file, destination(ran, record_file))
