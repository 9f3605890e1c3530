"""Conformance suite: a pytest plugin and its suites; writes the record the loader reads.

`torch-fl conformance run NAME` (torch_fl/cli/conformance.py) -> `runner.run()` starts pytest with
pytest-xdist workers and `plugin`:

- runner.py      builds the pytest command and environment, runs it, reads the record back
- plugin.py      pytest hooks: the controller (journal, crash handling, merging, progress, summary)
                 and the worker (item -> case(s), the `fl` fixture)
- session.py     what a suite sees: the platform under test, candidates per op, forcing, cases
- recorder.py    worker side: journals cases, in-flight markers, the faulthandler watchdog
- crash.py       controller side: a dead worker's marker and trace -> a `crashed`/`timeout` case
- journal.py     the JSONL journal (append, incremental read, resume)
- recordfile.py  journal entries -> the record JSON (validated against the loader's model)
- summary.py     the Markdown summary next to the record
- cost.py        where a run's time went (the record summary's `cost`)
- progress.py    progress on stderr
- fingerprint.py failure fingerprints (dedup)
- compare.py     tolerances, values, metadata, aliasing
- opcheck.py     one OpInfo sample on one variant (reference, CPU baseline, flagos), and its verdict
- watch.py       the dispatch mode that finds reached overloads and checks their schema contract
- opdb.py        PyTorch's OpInfo database (with a stand-in for its test-only import)
- sizes.py       the sweep suite's sizes by op category, layouts, guard width: one table
- sweepgen.py    an aten overload's sweep category and its generated arguments (by schema)
- sweepcall.py   one generated call placed on flagos, run, and judged against the native run
- capture.py     the aten calls the zoo models make, recorded under a dispatch mode; their replay
- zoo_calls.py    the shipped list of those calls (zoo_calls.json.gz) and each model's coverage
- launch.py, dist_worker.py: extra processes (distributed ranks, the reference model run)
- suites/        ops, sweep, amp, rng, ddp, fsdp2, compile, profiler, sharing, sparse, model, workload, captured
"""
