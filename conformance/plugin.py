"""The conformance pytest plugin: `pytest -p torch_fl.conformance.plugin --fl-platform NAME ...`.

Two roles, as pytest-xdist splits a run:

- the controller (no torch imported) owns the run: it starts or resumes the journal, turns dead
  workers into `crashed`/`timeout` cases and re-queues their item (the re-run skips the cases
  already journaled, so it goes on past the one that killed the worker), merges the journal into
  an interim record in the run folder every few seconds, writes the record (`--fl-output`) only
  when the run completes, shows progress, and writes the Markdown summary;
- each worker activates the platform (FLAGOS_PLATFORM is set for it), runs items, and journals
  their cases: an item is one case unless it records finer cases itself through the `fl` fixture
  (the ops suite: one item per OpInfo x dtype, one case per path x overload).

Without xdist one process plays both roles (no crash recovery then; `torch-fl conformance run`
always uses at least one worker).
"""

from __future__ import annotations

import json
import os
import platform as host_platform
import signal
import socket
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from torch_fl.conformance import crash, incremental, journal, recordfile, shards, summary
from torch_fl.conformance.progress import Progress
from torch_fl.conformance.recorder import CaseInfo, Recorder
from torch_fl.conformance.runner import SWEEP_SCOPES
from torch_fl.conformance.session import Session
from torch_fl.fileio import write_atomically
from torch_fl.platform.record import declared_constraints, evidence_path, load_raw

MERGE_EVERY_S = 10.0
MAX_RERUNS = 50
"""How often one item may be re-queued after killing its worker (each time one case further)."""
WARMUP_PATHS = frozenset({"flaggems"})
"""Paths whose first call per op and dtype may compile or autotune (FlagGems' Triton kernels)."""


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("torch-fl conformance")
    group.addoption("--fl-platform", default=None, help="Platform under test (enables the plugin).")
    group.addoption(
        "--fl-record", default=None, help="The record (torch-<line>.json); the journal and run folder are beside it."
    )
    group.addoption("--fl-output", default=None, help="Where the completed run's record goes (default: --fl-record).")
    group.addoption(
        "--fl-parent-pid",
        type=int,
        default=None,
        help="End the run (this process's group, which it must lead) when that process ends.",
    )
    group.addoption("--fl-paths", default="", help="Comma-separated route paths to exercise (default: all).")
    group.addoption("--fl-suites", default="", help="Suites selected (recorded in the run's selection).")
    group.addoption("--fl-samples", type=int, default=2, help="Samples per OpInfo x dtype.")
    group.addoption(
        "--fl-sweep",
        default="all",
        choices=SWEEP_SCOPES,
        help="Ops the sweep suite sweeps: all a gated path implements, or those the route table routes.",
    )
    group.addoption("--fl-case-timeout", type=float, default=60.0, help="Seconds one case may take.")
    group.addoption("--fl-item-timeout", type=float, default=600.0, help="Seconds an item may spend outside its cases.")
    group.addoption(
        "--fl-warmup-timeout", type=float, default=900.0, help="Seconds for the first call of a compiling path."
    )
    group.addoption("--fl-resume", action="store_true", default=False, help="Continue the run in the journal.")
    group.addoption(
        "--fl-add", action="store_true", default=False, help="Add the cases to the existing complete record."
    )
    group.addoption(
        "--fl-replace-ops",
        default="",
        help="With --fl-add: comma-separated ops whose vendor cases this run re-runs (the record's are dropped).",
    )
    group.addoption("--fl-shard", default=None, help="i/N: run only the items of shard i of N.")
    group.addoption("--fl-items", default=None, help="A file of node ids, one per line: run only those items.")
    group.addoption(
        "--fl-quiet", action="store_true", default=False, help="Progress as count lines only (no bar, for --json)."
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "fl_timeout(seconds): this item's case may take up to `seconds`")
    config.addinivalue_line("markers", "fl_case(op=None, dtype=None, path=None): the op/dtype/path of this item's case")
    name = config.getoption("fl_platform")
    if not name:
        return
    worker = hasattr(config, "workerinput")
    distributed = not worker and config.getoption("dist", "no") != "no"
    if not worker:
        config.pluginmanager.register(Controller(config, distributed), "fl-controller")
    if worker or not distributed:
        config.pluginmanager.register(Worker(config), "fl-worker")


def _paths(config: pytest.Config) -> list[str]:
    return [p for p in str(config.getoption("fl_paths") or "").split(",") if p]


def _replace_ops(config: pytest.Config) -> list[str]:
    return [o for o in str(config.getoption("fl_replace_ops") or "").split(",") if o]


def _suite_of(nodeid: str) -> str:
    return Path(nodeid.split("::")[0]).stem


def item_case_id(nodeid: str) -> str:
    """The id of an item's own case: `<suite>/<test name[params]>`."""
    return f"{_suite_of(nodeid)}/{nodeid.split('::')[-1]}"


def _record_file(config: pytest.Config, descriptor: Any, torch_line: str) -> Path:
    given = config.getoption("fl_record")
    if given:
        return Path(given)
    from torch_fl.platform.record import record_path

    return record_path(descriptor.directory, torch_line)


def _run_header(config: pytest.Config, descriptor: Any, made_here: dict[str, Any], workers: int) -> dict[str, Any]:
    """The journal's first line: what the run checks (platform, binding, which source decides
    which cases), on which machine, and the selection it was asked for."""
    return {
        **made_here,
        "sources_decide": incremental.sources_decide(descriptor),
        "constraints": declared_constraints(descriptor),
        "started": recordfile.now(),
        "machine": {
            "hostname": socket.gethostname(),
            "cpu_count": os.cpu_count(),
            "python": host_platform.python_version(),
            "os": host_platform.platform(),
            "backing": descriptor.backing.device,
            "workers": workers,
        },
        "selection": {
            "suites": [s for s in str(config.getoption("fl_suites") or "").split(",") if s],
            "paths": _paths(config),
            "k": config.getoption("keyword") or "",
            "samples": config.getoption("fl_samples"),
            "sweep": config.getoption("fl_sweep"),
            "case_timeout_s": config.getoption("fl_case_timeout"),
            "replace_ops": _replace_ops(config),
            "shard": config.getoption("fl_shard"),
        },
    }


class Controller:
    """Owns the journal, the record, crash handling and progress."""

    def __init__(self, config: pytest.Config, distributed: bool) -> None:
        from torch_fl.platform.discovery import load_platform

        self.config = config
        self.distributed = distributed
        name = config.getoption("fl_platform")
        os.environ["FLAGOS_PLATFORM"] = name  # the workers inherit it and activate this platform
        descriptor = load_platform(name)
        made_here = recordfile.identity(descriptor)
        self.record_file = _record_file(config, descriptor, made_here["binding"]["torch"])
        self.output_file = Path(config.getoption("fl_output") or self.record_file)
        self.journal_file = journal.journal_path(self.record_file)
        self.run_dir = journal.run_dir(self.record_file)
        self.interim_file = journal.interim_record(self.record_file)
        self.parent = config.getoption("fl_parent_pid")
        if self.parent is not None:
            _end_with(self.parent)
        workers = config.getoption("numprocesses", None) if distributed else 0
        self.workers = int(workers) if isinstance(workers, int) or str(workers).isdigit() else (os.cpu_count() or 1)
        header = _run_header(config, descriptor, made_here, self.workers)
        # --add: the existing record's cases are the base (checked addable by the runner); this
        # run's cases replace those of the same id, and the record is written only once complete.
        self.adding = bool(config.getoption("fl_add"))
        base = load_raw(self.record_file) if self.adding else None
        if base is not None:
            # the run whose cases this one extends, with its machine: one record, several boards' runs
            header["machine"]["added_to"] = {k: base.get(k) for k in ("started", "finished", "machine")}
        self._open_journal(header, resume=bool(config.getoption("fl_resume")))
        (self.run_dir / "inflight").mkdir(parents=True, exist_ok=True)
        self.reader = journal.Reader(self.journal_file)
        self.collector = recordfile.Collector()
        if base is not None:
            ops = frozenset(_replace_ops(config))
            self.collector.seed(self.record_file, (lambda case: incremental.replaced(case, ops)) if ops else None)
        self.collector.feed(self.reader.new())
        self.done_items = sorted(self.collector.items_done | self._items_with_own_case())
        config.stash[DONE_ITEMS] = self.done_items
        config.stash[WORKERS] = max(1, self.workers)
        self.session_started = time.monotonic()
        self.items_done = 0
        self.requeued: set[str] = set()
        self.reruns: Counter[str] = Counter()
        self.last_merge = 0.0
        self.progress = Progress(name, plain=config.getoption("fl_quiet"))

    def _open_journal(self, header: dict[str, Any], resume: bool) -> None:
        """Continue the journal of an interrupted run of the same platform and binding (`resume`),
        or start a fresh one, clearing what an earlier run left in the run folder."""
        previous = journal.header(self.journal_file) if resume else None
        if resume and previous is None:
            raise pytest.UsageError(
                f"cannot resume: there is no journal {self.journal_file} with a run header; run without --resume"
            )
        if previous is not None:
            for key in ("platform", "binding"):
                if previous.get(key) != header[key]:
                    raise pytest.UsageError(
                        f"cannot resume {self.journal_file}: its {key} is {previous.get(key)!r}, now {header[key]!r}; run without --resume"
                    )
            journal.append(self.journal_file, {"kind": "session", "resumed": recordfile.now(), "workers": self.workers})
            return
        journal.start(self.journal_file, header)
        for stale in (self.run_dir / "inflight").glob("*"):
            stale.unlink(missing_ok=True)
        self.interim_file.unlink(missing_ok=True)
        evidence_path(self.interim_file).unlink(missing_ok=True)

    def _items_with_own_case(self) -> set[str]:
        """Items whose own case is journaled (they failed or died outside finer cases): not re-run."""
        done = set()
        for entry in journal.read_all(self.journal_file):
            if entry.get("kind") == "case" and entry.get("item_level") and entry.get("item"):
                done.add(entry["item"])
        return done

    # ---- xdist
    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput["fl_done_items"] = self.done_items
        node.workerinput["fl_workers"] = max(1, self.workers)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        if not self.progress.total:
            self.progress.start(len(ids))

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        if not self.distributed:
            self.progress.start(len(session.items))

    @pytest.hookimpl(optionalhook=True)
    def pytest_handlecrashitem(self, crashitem: str, report: Any, sched: Any) -> None:
        node = getattr(report, "node", None)
        worker = node.gateway.id if node is not None else "main"
        entry = crash.diagnose(self.run_dir, worker, crashitem)
        if entry is None:
            message = "the worker process died outside any case (no in-flight marker)"
            entry = {
                "kind": "case",
                "id": item_case_id(crashitem),
                "suite": _suite_of(crashitem),
                "op": None,
                "dtype": None,
                "path": None,
                "status": "crashed",
                "message": message,
                "duration_s": 0.0,
                "item": crashitem,
                "item_level": True,
            }
            from torch_fl.conformance.fingerprint import fingerprint

            entry["fingerprint"] = fingerprint("crashed", None, message)
        if entry["kind"] != "restart":
            journal.append(self.journal_file, entry)
        if entry.get("item_level"):
            return  # died outside the finer cases: a re-run would die the same way
        self.reruns[crashitem] += 1
        if self.reruns[crashitem] > MAX_RERUNS:
            return
        try:
            sched.mark_test_pending(crashitem)
        except (NotImplementedError, AttributeError):
            return  # a scheduler that cannot re-queue: --resume continues the item later
        self.requeued.add(crashitem)

    # ---- progress and merging
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        finished = report.when == "call" or (report.when == "setup" and not report.passed) or report.when == "???"
        if report.when == "???" and report.nodeid in self.requeued:
            self.requeued.discard(report.nodeid)
            finished = False  # it runs again
        if finished:
            self.items_done += 1
        now = time.monotonic()
        if now - self.last_merge >= MERGE_EVERY_S:
            self.merge(complete=False)
        else:
            self.progress.update(self.items_done, self._statuses())

    def _statuses(self) -> Counter[str]:
        self.collector.feed(self.reader.new())
        return Counter(c["status"] for c in self.collector.cases.values())

    def merge(
        self, complete: bool, finished: str | None = None, extra: dict[str, Any] | None = None
    ) -> tuple[Path, dict[str, Any]]:
        """Write the record so far: the run's record once complete, the interim record until then."""
        self.last_merge = time.monotonic()
        statuses = self._statuses()
        self.progress.update(self.items_done, statuses)
        record, cases = recordfile.build(self.collector, complete, finished, extra)
        path = self.output_file if complete else self.interim_file
        return path, recordfile.write(path, record, cases)

    def _orphaned(self) -> bool:
        """Has the command that started this run ended? Then nothing of the run may write the record."""
        return self.parent is not None and os.getppid() != self.parent

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        wall = time.monotonic() - self.session_started
        complete = int(exitstatus) in (0, 1, 5) and not session.shouldstop and not self._orphaned()
        journal.append(
            self.journal_file,
            {
                "kind": "session",
                "finished": recordfile.now(),
                "wall_s": round(wall, 1),
                "workers": self.workers,
                "exitstatus": int(exitstatus),
            },
        )
        self.collector.feed(self.reader.new())
        changed = self.collector.changed_sources()
        for problem in changed:
            print(f"torch-fl: {problem}; the run does not complete", file=sys.stderr, flush=True)
        complete = complete and not changed
        total_wall = sum(s.get("wall_s", 0.0) for s in self.collector.sessions)
        cases = len(self.collector.cases)
        rate = round(cases / total_wall, 1) if total_wall > 0 else None
        path, record = self.merge(complete, recordfile.now(), {"wall_s": round(total_wall, 1), "cases_per_s": rate})
        self.progress.close()
        summary.write(path, record)
        if complete:
            # Everything is in the record now; the journal and the interim record only served to resume.
            self.journal_file.unlink(missing_ok=True)
            self.interim_file.unlink(missing_ok=True)
            evidence_path(self.interim_file).unlink(missing_ok=True)
            summary.summary_path(self.interim_file).unlink(missing_ok=True)
            for leftover in (self.run_dir / "inflight").glob("*"):
                leftover.unlink(missing_ok=True)
            # Last, once the record reads back as written: what the command reports the run by.
            write_atomically(
                self.run_dir / journal.WRITTEN, json.dumps({"record": str(path), "checksum": record["checksum"]})
            )
        self.config.stash[OUTCOME] = {"record": str(path), "complete": complete}


def _end_with(parent: int) -> None:
    """Kill this process's group, the whole run, as soon as `parent` is no longer its parent.

    The command that started the run may be killed outright (SIGKILL, a CI timeout): a thread
    watching for that is the one way its pytest, workers and their children still end at once
    and never go on journaling or writing the record.
    """
    if os.getpgid(0) != os.getpid():
        raise pytest.UsageError("--fl-parent-pid: this pytest process must lead its own process group")

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.1)
        os.killpg(0, signal.SIGKILL)

    threading.Thread(target=watch, name="fl-end-with-parent", daemon=True).start()


@pytest.fixture(scope="session")
def fl(request: pytest.FixtureRequest) -> Session:
    """The run as suites see it (see session.py); activates the platform on first use."""
    worker = request.config.pluginmanager.get_plugin("fl-worker")
    if worker is None:
        pytest.skip("not a conformance run (pass --fl-platform NAME)")
    return worker.ready_session()


DONE_ITEMS = pytest.StashKey[list]()
WORKERS = pytest.StashKey[int]()
OUTCOME = pytest.StashKey[dict]()


class Worker:
    """Runs items: activates the platform lazily, journals each item's case(s)."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        workerinput = getattr(config, "workerinput", None)
        if workerinput is not None:
            self.done_items = set(workerinput.get("fl_done_items", []))
            self.workers = int(workerinput.get("fl_workers", 1))
        else:
            self.done_items = set(config.stash.get(DONE_ITEMS, []))
            self.workers = config.stash.get(WORKERS, 1)
        from torch_fl.platform.discovery import load_platform
        from torch_fl.platform.record import installed_version
        from torch_fl.platform.versions import minor_line

        name = config.getoption("fl_platform")
        descriptor = load_platform(name)
        record_file = _record_file(config, descriptor, minor_line(installed_version("torch") or "0"))
        self.recorder = Recorder(
            journal.journal_path(record_file),
            journal.run_dir(record_file),
            worker=str(workerinput["workerid"]) if workerinput is not None else "main",
            case_timeout=config.getoption("fl_case_timeout"),
            item_timeout=max(config.getoption("fl_item_timeout"), config.getoption("fl_case_timeout")),
            warmup_timeout=config.getoption("fl_warmup_timeout"),
            warmup_paths=WARMUP_PATHS,
        )
        paths = _paths(config)
        self.session = Session(
            name,
            self.recorder,
            frozenset(paths) if paths else None,
            config.getoption("fl_samples"),
            sweep=config.getoption("fl_sweep"),
        )
        self.session.descriptor = descriptor
        self.recorder.constraints = declared_constraints(descriptor)
        self.reports: list[pytest.TestReport] = []
        self._announced = False
        self._imported: dict[str, str] = {}

    def ready_session(self) -> Session:
        self.session.activate()
        if not self._announced:
            self._announced = True
            self._announce()
        return self.session

    def _announce(self) -> None:
        import torch

        torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, self.workers)))
        info: dict[str, Any] = {"kind": "worker", "pid": os.getpid(), "torch": torch.__version__}
        if self.session.backing == "cuda":
            info["device"] = torch.cuda.get_device_name()
        journal.append(self.recorder.journal_file, info)

    def pytest_collection_modifyitems(
        self, session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        spec = config.getoption("fl_shard")
        shard = shards.Shard.parse(spec) if spec else None
        listed = config.getoption("fl_items")
        order = (
            {nodeid: i for i, nodeid in enumerate(Path(listed).read_text().split("\n")) if nodeid} if listed else None
        )
        keep, drop = [], []
        for item in items:
            out = item.nodeid in self.done_items or (shard is not None and not shard.holds(item.nodeid))
            out = out or (order is not None and item.nodeid not in order)
            (drop if out else keep).append(item)
        if order is not None:  # in the listed order (an incremental run lists the costliest first)
            keep.sort(key=lambda item: order[item.nodeid])
        if drop:
            config.hook.pytest_deselected(items=drop)
        items[:] = keep

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None):
        marker = item.get_closest_marker("fl_case")
        meta = dict(marker.kwargs) if marker else {}
        case = CaseInfo(
            item_case_id(item.nodeid), _suite_of(item.nodeid), meta.get("op"), meta.get("dtype"), meta.get("path")
        )
        limit = item.get_closest_marker("fl_timeout")
        self.reports = []
        self.recorder.begin_item(item.nodeid, case, float(limit.args[0]) if limit else None)
        try:
            return (yield)
        finally:
            self._finish_item(case)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.reports.append(report)

    def _finish_item(self, case: CaseInfo) -> None:
        status, message = _outcome(self.reports)
        if self.recorder.used_cases:
            if status == "failed":
                status = "error"  # the item broke outside its cases: a harness problem, said as such
            write = status != "passed"
        else:
            write = True
        if write and not self.recorder.is_done(case.id):
            case.status, case.message = status, message if status != "passed" else case.message
            duration = sum(r.duration for r in self.reports)
            case.duration_s = duration
            entry = case.entry(self.recorder.item or "")
            entry["item_level"] = True
            journal.append(self.recorder.journal_file, entry)
        self.recorder.end_item(done=True)
        self._journal_imports()

    def _journal_imports(self) -> None:
        """Journal which vendor sources this worker imported, by hash, whenever that changes: the
        controller checks them against the sources the record binds."""
        vendor = sys.modules.get("torch_fl.kernels.vendor")  # not imported: no vendor kernel ran here
        sources = vendor.imported_sources() if vendor is not None else {}
        if sources != self._imported:
            self._imported = sources
            journal.append(self.recorder.journal_file, {"kind": "imported", "sources": sources})


def _short(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    crash_info = getattr(longrepr, "reprcrash", None)
    if crash_info is not None:
        return f"{crash_info.message.strip()[:2000]} ({Path(crash_info.path).name}:{crash_info.lineno})"
    return str(longrepr).strip().splitlines()[-1][:2000] if longrepr else ""


def _outcome(reports: list[pytest.TestReport]) -> tuple[str, str]:
    """(status, message) of an item from its setup/call/teardown reports."""
    for report in reports:
        if report.when == "setup" and report.failed:
            return "error", _short(report)
        if report.skipped:
            return "skipped", _short(report)
        if report.when == "call" and report.failed:
            return "failed", _short(report)
        if report.when == "teardown" and report.failed:
            return "error", "teardown: " + _short(report)
    return "passed", ""
