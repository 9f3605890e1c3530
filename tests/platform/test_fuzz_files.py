"""Random and adversarial platform files never stop the runtime.

A seeded generator writes descriptors, route tables, records and journals of every shape a hostile
vendor or an unlucky disk could leave (deep nesting, huge, binary, FIFOs, links to devices, YAML
aliases, unicode, mutations of real files) into platform folders on FLAGOS_PLATFORM_PATH. For each
case host_ref must still load, be gated, get its routes checked and answer on device="flagos", within
5 s and 200 MB, with every problem said in a few short lines; `torch-fl platforms list` must not fail.

All cases run in one interpreter (importing torch and starting the core costs seconds): what a
process does at activation is repeated per case, short of the registration that happens once.
Set FUZZ_SEED to run another sequence; a failure names the case folder and what it holds.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from torch_fl.platform.discovery import shipped_root

HOST_REF = shipped_root() / "host_ref"
SEED = int(os.environ.get("FUZZ_SEED", "26"))
CASES = 64
SECONDS, MEGABYTES, LINES, CHARS = 5.0, 200, 8, 1200

Maker = Callable[[random.Random, Path], str]


# ---- contents: each maker writes `path` and returns a short description of what it wrote


def deep_flow(rng: random.Random, path: Path) -> str:
    depth = rng.choice([33, 200, 999, 1001, 50_000])
    opener, closer = rng.choice([("[", "]"), ("{a: ", "}")])
    path.write_text("schema_version: 1\nformat: 1\nx: " + opener * depth + "1" + closer * depth + "\n")
    return f"flow nesting {depth}"


def deep_block(rng: random.Random, path: Path) -> str:
    depth = rng.choice([40, 300, 2000])
    if rng.random() < 0.5:
        body = "".join(" " * i + f"k{i}:\n" for i in range(depth))
    else:
        body = "- " * depth + "1\n"
    path.write_text("format: 1\nx:\n" + body)
    return f"block nesting {depth}"


def deep_json(rng: random.Random, path: Path) -> str:
    depth = rng.choice([33, 900, 100_000])
    path.write_text('{"format": 2, "x": ' + "[" * depth + "]" * depth + "}")
    return f"JSON nesting {depth}"


def huge_sparse(rng: random.Random, path: Path) -> str:
    size = rng.choice([1 << 30, 1 << 40])
    with open(path, "wb") as f:
        f.truncate(size)
    return f"sparse file of {size} bytes"


def near_cap_yaml(rng: random.Random, path: Path) -> str:
    count = rng.choice([5_000, 20_000])
    if rng.random() < 0.5:
        body = "ops:\n" + "".join(f"  aten::nosuch{i}:\n    candidates: [native]\n" for i in range(count))
    else:
        body = "x: [" + ", ".join(str(i) for i in range(count * 4)) + "]\n"
    path.write_text("schema_version: 1\nformat: 1\n" + body)
    return f"large YAML ({count} entries, {path.stat().st_size} bytes)"


def binary(rng: random.Random, path: Path) -> str:
    size = rng.choice([1, 100, 10_000, 300_000])
    path.write_bytes(rng.randbytes(size))
    return f"{size} random bytes"


def fifo(rng: random.Random, path: Path) -> str:
    os.mkfifo(path)
    return "a FIFO"


def device_link(rng: random.Random, path: Path) -> str:
    target = rng.choice(["/dev/zero", "/dev/urandom", "/dev/null", "/dev/stdin", "/proc/self/mem"])
    path.symlink_to(target)
    return f"a link to {target}"


def folder(rng: random.Random, path: Path) -> str:
    path.mkdir()
    return "a folder"


def dangling_or_looping_link(rng: random.Random, path: Path) -> str:
    if rng.random() < 0.5:
        path.symlink_to(path.parent / "nowhere")
        return "a dangling link"
    path.symlink_to(path)
    return "a link to itself"


def aliases(rng: random.Random, path: Path) -> str:
    letters = "abcdefghij"
    bomb = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
        f"{cur}: &{cur} [" + ", ".join([f"*{prev}"] * 9) + "]\n" for prev, cur in zip(letters, letters[1:])
    )
    path.write_text(rng.choice(["schema_version: 1\n", "format: 1\n"]) + bomb)
    return "a billion laughs"


def unicode_text(rng: random.Random, path: Path) -> str:
    alphabet = "aé中\u202e\u200b\ufeff\U0001f600:-[]{}#&*!|>'\"\t \n\x00\x85\u2028"
    text = "".join(rng.choice(alphabet) for _ in range(rng.choice([10, 1000, 20_000])))
    raw = text.encode("utf-8", "surrogatepass")
    if rng.random() < 0.3:
        raw = b"\xef\xbb\xbf" + raw + b"\xed\xa0\x80"  # a BOM, and an encoded surrogate (not UTF-8)
    path.write_bytes(raw)
    return f"{len(text)} unicode characters"


def wrong_type(rng: random.Random, path: Path) -> str:
    path.write_text(rng.choice(["[1, 2]\n", "42\n", "null\n", "'text'\n", "[]", "{}", '"x"', "--- a\n--- b\n", ""]))
    return "a document of the wrong type"


def mutated(source: Path) -> Maker:
    def make(rng: random.Random, path: Path) -> str:
        data = bytearray(source.read_bytes())
        edits = []
        for _ in range(rng.randint(1, 8)):
            at = rng.randrange(len(data))
            action = rng.choice(["flip", "delete", "insert", "duplicate"])
            if action == "flip":
                data[at] = rng.randrange(256)
            elif action == "delete":
                del data[at : at + rng.randint(1, 40)]
            elif action == "insert":
                data[at:at] = rng.choice(
                    [b"&x ", b"*x", b"[", b"{", b"\n  - ", b": ", b"\xff", b"\x00", b"!!python/object "]
                )
            else:
                end = min(len(data), at + rng.randint(1, 200))
                data[at:at] = data[at:end] * rng.randint(2, 50)
            edits.append(action)
        path.write_bytes(bytes(data))
        return f"{source.name} mutated ({', '.join(edits)})"

    return make


ANY_FILE: list[Maker] = [
    huge_sparse,
    binary,
    fifo,
    device_link,
    folder,
    dangling_or_looping_link,
    aliases,
    unicode_text,
    wrong_type,
]
MAKERS: dict[str, list[Maker]] = {
    "descriptor": ANY_FILE + [deep_flow, deep_block, near_cap_yaml, mutated(HOST_REF / "platform.yaml")] * 2,
    "routes": ANY_FILE + [deep_flow, deep_block, near_cap_yaml, mutated(HOST_REF / "routes.yaml")] * 2,
    "record": ANY_FILE + [deep_json, mutated(HOST_REF / "records" / "torch-2.13.json")] * 3,
    "journal": ANY_FILE + [deep_json, mutated(HOST_REF / "records" / "torch-2.13.json")],
}


def write_case(rng: random.Random, root: Path) -> str:
    """One case folder for FLAGOS_PLATFORM_PATH: a host_ref copy with one or two of its files
    replaced, and beside it, often, another platform whose descriptor is fuzzed."""
    host = root / "host_ref"
    shutil.copytree(HOST_REF, host)
    said = []
    for kind in rng.sample(sorted(MAKERS), rng.randint(1, 2)):
        maker = rng.choice(MAKERS[kind])
        if kind == "descriptor":
            name = rng.choice(["fuzz_chip", "nvidia_h200", "fuzz_chip_\u00e9"])
            (root / name).mkdir()
            path = root / name / "platform.yaml"
        else:
            path = host / {"routes": "routes.yaml", "record": "records/torch-2.13.json"}.get(
                kind, "records/torch-2.13.journal.jsonl"
            )
            if path.exists():
                path.unlink()
        said.append(f"{kind}: {maker(rng, path)}")
    return "; ".join(said)


CHILD = """
    import json, os, resource, time, warnings
    from pathlib import Path
    import torch, torch_fl
    from typer.testing import CliRunner
    import torch_fl.cli.platforms
    from torch_fl.cli import app
    from torch_fl.conformance import journal
    from torch_fl.fileio import RefusedFile
    from torch_fl.platform import Gate
    from torch_fl.platform.discovery import discover, load_all
    from torch_fl.routing.checks import check_routing

    torch_fl.activate("host_ref")
    def peak_mb():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    for case in sorted(Path(os.environ["FUZZ_CASES"]).iterdir(), key=lambda p: int(p.name)):
        os.environ["FLAGOS_PLATFORM_PATH"] = str(case)
        before, start = peak_mb(), time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loaded, broken = load_all(discover())
            descriptor = loaded["host_ref"]
            gate = Gate.for_platform(descriptor, torch.__version__)
            routing = check_routing(descriptor)
            try:
                entries = len(list(journal.read_all(case / "host_ref" / "records" / "torch-2.13.journal.jsonl")))
                refused = None
            except RefusedFile as exc:
                refused = str(exc)
            answer = (torch.ones(2, device="flagos") + 1).sum().item()
            listing = CliRunner().invoke(app, ["platforms", "list"])
        messages = [e.brief for e in broken.values()] + routing.problems + gate.status.reasons
        messages += [str(w.message) for w in caught] + ([refused] if refused else [])
        print(json.dumps({
            "case": case.name,
            "seconds": time.perf_counter() - start,
            "megabytes": peak_mb() - before,
            "answer": answer,
            "gate": gate.state,
            "messages": messages,
            "listing_exit": listing.exit_code,
            "listing": listing.output[-3000:] if listing.exit_code or "Traceback" in listing.output else "",
            "listing_chars": len(listing.output),
        }), flush=True)
"""


@pytest.mark.timeout(120)
def test_fuzzed_platform_files_leave_host_ref_working(tmp_path, run_python):
    rng = random.Random(SEED)
    cases = tmp_path / "cases"
    described = {}
    for i in range(CASES):
        root = cases / str(i)
        root.mkdir(parents=True)
        described[str(i)] = write_case(rng, root)
    cleared: dict[str, str | None] = {k: None for k in os.environ if k.startswith("FLAGOS_")}
    result = run_python(CHILD, {**cleared, "FUZZ_CASES": str(cases)}, check=False, timeout=110)
    reports = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    done = {r["case"] for r in reports}
    stuck = next((c for c in described if c not in done), None)
    assert result.returncode == 0 and stuck is None, (
        f"stopped at case {stuck} ({described.get(stuck or '')}), exit {result.returncode}:\n{result.stderr[-3000:]}"
    )
    problems = []
    for report in reports:
        what = f"case {report['case']} ({described[report['case']]})"
        if report["answer"] != 4.0:
            problems.append(f"{what}: host_ref answered {report['answer']}")
        if report["seconds"] > SECONDS:
            problems.append(f"{what}: took {report['seconds']:.1f} s")
        if report["megabytes"] > MEGABYTES:
            problems.append(f"{what}: took {report['megabytes']:.0f} MB more")
        lines = [line for message in report["messages"] for line in message.splitlines()]
        if len(lines) > LINES or any(len(line) > CHARS for line in lines):
            problems.append(f"{what}: said {len(lines)} lines:\n" + "\n".join(line[:300] for line in lines[:20]))
        if report["listing_exit"] != 0 or report["listing"] or report["listing_chars"] > 20_000:
            problems.append(f"{what}: platforms list failed:\n{report['listing']}")
    assert not problems, "\n".join(problems)
