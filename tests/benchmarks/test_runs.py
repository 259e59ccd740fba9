"""benchmarks/_runs.py: every study's run records live in one archive per run directory, and the archives hold
exactly the records the loose files held before they were consolidated (issue 60)."""

from __future__ import annotations

import gzip
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from _runs import RUNS_FILE, append_run, has_run, load_runs, pack, read_run, run_keys  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
#: Tracked record files per run directory at main 68d450f (``git ls-files benchmarks/results/<dir> | wc -l``), the
#: tree the archives were consolidated from: each file is now one record of its directory's archive.
BEFORE = {
    "horizon_sweep_runs": 3360,
    "horizon_sweep_gradient": 288,
    "lm_agent_map_runs": 375,
    "learning_efficiency_runs": 648,
    "paper_claims_runs": 506,  # and its sign_plateau_start_check/'s 2 in that directory's own archive
    "paper_claims_runs/sign_plateau_start_check": 2,
    "paper_claims_retime": 170,
}
#: Run directories whose loose files held one record per line (``<cell>/<arm>.jsonl``, 114 files at 68d450f): the
#: archive holds one record per run, as many as those files' lines. Their other files stay (the study's choices).
BEFORE_LINES = {"credit_map_tuned_runs": (8802, ["hard_scout.json", "hard_variant.json"])}


def _tracked(path: str) -> list[str]:
    """The files git tracks under ``path``."""
    return subprocess.run(
        ["git", "ls-files", path], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()


def test_each_archive_holds_every_record_its_loose_files_held():
    for study, count in BEFORE.items():
        assert len(run_keys(RESULTS / study)) == count, study


def test_an_archive_of_line_records_holds_every_line():
    for study, (count, kept) in BEFORE_LINES.items():
        assert len(run_keys(RESULTS / study, "*/*/*.json")) == count, study
        tracked = _tracked(f"benchmarks/results/{study}")
        assert sorted(Path(p).name for p in tracked) == sorted([RUNS_FILE, *kept]), study


def test_no_record_file_is_tracked_beside_an_archive():
    for study in BEFORE:
        tracked = _tracked(f"benchmarks/results/{study}")
        assert f"benchmarks/results/{study}/{RUNS_FILE}" in tracked, study
        assert all(Path(p).name == RUNS_FILE for p in tracked), study  # a nested run directory has its own


def test_tracked_results_stay_few():
    """Issue 60's target: the results are data in a few files, not thousands (5,577 tracked files at 68d450f)."""
    tracked = _tracked("benchmarks/results")
    assert len(tracked) <= 300
    assert not [p for p in tracked if p.endswith(".html")]  # generated reports are views, not tracked


def test_appends_replace_by_name_and_readers_get_copies(tmp_path):
    assert load_runs(tmp_path) == {} and not has_run(tmp_path, "a/seed0/x.json")
    append_run(tmp_path, "a/seed0/x.json", {"v": 1})
    append_run(tmp_path, "a/seed1/x.json", {"v": 2})
    append_run(tmp_path, "a/seed0/x.json", {"v": 3})  # a re-run: the last line wins
    assert load_runs(tmp_path) == {"a/seed0/x.json": {"v": 3}, "a/seed1/x.json": {"v": 2}}
    assert run_keys(tmp_path, "*/seed1/*.json") == ["a/seed1/x.json"] and run_keys(tmp_path, "*.json") == []
    read_run(tmp_path, "a/seed1/x.json")["v"] = 9  # a caller's copy
    assert read_run(tmp_path, "a/seed1/x.json") == {"v": 2} and read_run(tmp_path, "b", None) is None
    with gzip.open(tmp_path / RUNS_FILE, "rt") as f:  # three gzip members, read as one stream
        assert len(f.read().splitlines()) == 3


def test_pack_moves_loose_files_in(tmp_path):
    (tmp_path / "t" / "seed0").mkdir(parents=True)
    (tmp_path / "t" / "seed0" / "grpo.jsonl").write_text('{"step": 0}\n{"step": 5}\n')
    (tmp_path / "t" / "seed0" / "grpo.done.json").write_text('{"arm": "grpo"}')
    assert pack(tmp_path, sorted((tmp_path / "t").rglob("*.json*"))) == 2
    assert load_runs(tmp_path) == {
        "t/seed0/grpo.done.json": {"arm": "grpo"},
        "t/seed0/grpo.jsonl": [{"step": 0}, {"step": 5}],
    }
    assert not list((tmp_path / "t").rglob("*.json*"))


def _append_many(root: str, tag: str) -> None:
    for i in range(40):
        append_run(Path(root), f"{tag}/{i}.json", {"tag": tag, "i": i, "pad": "x" * 5000})


def test_two_processes_append_to_one_archive_without_tearing_it(tmp_path):
    """Two halves of a study's seeds can run as two processes on one run directory: appends never interleave."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_append_many, args=(str(tmp_path), tag)) for tag in ("a", "b")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    records = load_runs(tmp_path)
    assert len(records) == 80 and records["b/39.json"]["i"] == 39
