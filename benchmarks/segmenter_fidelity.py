"""How closely our segmenters reproduce the official VinePPO step splitting, on the reference data.

Usage::

    python benchmarks/segmenter_fidelity.py --vineppo PATH [--baseline-rev REV] [--data-dir ../shared/data]

``PATH`` (or the environment variable ``VINEPPO_REPO``) is a clone or bare mirror of
https://github.com/McGill-NLP/VinePPO: the official splitters are read from it at ``--commit``
(default ``efe7228``, the commit the brief's numbers refer to) with ``git show`` into a temporary
directory and run from there. ``PATH`` may also be a directory that holds the two files themselves
(``math_extract_steps_inplace.py`` and ``gsm8k.py``, e.g. written there by ``git show``). Nothing
of the official code is stored in this repository. Without ``--vineppo`` the script reports our
own statistics only.

``--baseline-rev`` also measures ``MathSegmenter`` as it was at a git revision of this repository (its
package read with ``git archive``), so a change can be reported before/after in one run.

Prints tables and writes ``benchmarks/results/segmenter_fidelity.json``:

* MATH-500 reference solutions (500): steps per solution (mean, median, p90, max), step length in
  characters with surrounding whitespace stripped (mean, median, p90, max), steps over 100
  characters, step boundaries strictly inside a math span (inline / display);
* agreement with the official ``split_solution_inplace`` cut points: the share of official cuts that
  are also ours, of ours that are also official, and of solutions with the same cuts. A cut is
  compared by the first non-whitespace character after it, so where the whitespace between two
  steps goes (official: always at the start of the next step) does not count as a disagreement;
* the places where a display block ending a sentence runs straight into the next word
  (``= 25.\\]This``) and how many of them each splitter cuts;
* GSM8K train+test answers (8,792): identical step lists against the official splitter, with our
  newline at the end of a step (default) and at the start of the next (``newline_placement="start"``).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mcadvantage.tasks import GSM8KSegmenter, MathSegmenter, find_math_spans

ROOT = Path(__file__).resolve().parents[1]
OFFICIAL_MATH_FILE = "src/treetune/tasks/math_extract_steps_inplace.py"
OFFICIAL_GSM8K_FILE = "src/treetune/tasks/gsm8k.py"
# What the brief measured before this comparison script existed (SPEC section 8), for the record.
REFERENCE_BEFORE = {"official_cuts_in_ours": 0.68, "our_cuts_in_official": 0.77}

Splitter = Callable[[str], list[str]]


# --------------------------------------------------------------------------------------------------
# Loading the official splitters (run from a temporary copy, never stored here)
# --------------------------------------------------------------------------------------------------


def _read_official(source: Path, rel_path: str, commit: str) -> str:
    """Text of one official file: from ``source`` directly if it holds the file, else ``git show``."""
    for candidate in (source / rel_path, source / Path(rel_path).name):
        if candidate.is_file():
            return candidate.read_text(encoding="utf-8")
    proc = subprocess.run(
        ["git", "-C", str(source), "show", f"{commit}:{rel_path}"], capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise SystemExit(
            f"--vineppo {source}: neither {rel_path} nor {Path(rel_path).name} is a file there, and "
            f"`git show {commit}:{rel_path}` failed ({proc.stderr.strip()}). Pass a clone of "
            "https://github.com/McGill-NLP/VinePPO or a directory holding that file."
        )
    return proc.stdout


def load_official_math(source: Path, commit: str, workdir: Path) -> Splitter:
    """``split_solution_inplace`` as a ``text -> steps`` function.

    The module imports one helper, ``md5_hash`` (the MD5 hex digest of the UTF-8 text, used to name
    placeholders), from a module that pulls in the rest of the official package; a stand-in module
    provides just that function so the splitter runs without installing treetune.
    """
    path = workdir / "official_math_extract_steps_inplace.py"
    path.write_text(_read_official(source, OFFICIAL_MATH_FILE, commit), encoding="utf-8")
    stand_in = types.ModuleType("treetune.tasks.math_extract_steps")
    stand_in.md5_hash = lambda text: hashlib.md5(text.encode("utf-8")).hexdigest()  # type: ignore[attr-defined]
    saved = {name: sys.modules.get(name) for name in ("treetune", "treetune.tasks", stand_in.__name__)}
    sys.modules.update(
        {
            "treetune": types.ModuleType("treetune"),
            "treetune.tasks": types.ModuleType("treetune.tasks"),
            stand_in.__name__: stand_in,
        }
    )
    try:
        spec = importlib.util.spec_from_file_location("_official_vineppo_math_split", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:  # leave no fake treetune behind for anything imported later
        for name, value in saved.items():
            if value is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = value

    def split(text: str) -> list[str]:
        indices = module.split_solution_inplace(text)
        return [text[a:b] for a, b in zip(indices, indices[1:], strict=False) if b > a]

    return split


def load_official_gsm8k(source: Path, commit: str) -> Splitter:
    """The official GSM8K task's ``split_solution_into_intermediate_steps`` as ``text -> steps``.

    The method lives in a class whose module imports the ``datasets`` library and the official
    package, so only the method's source and its constructor defaults (``intermediate_step_delimiter``,
    ``answer_prefix``) are taken from the file, with ``ast``, and run on a plain namespace as ``self``.
    """
    tree_source = _read_official(source, OFFICIAL_GSM8K_FILE, commit)
    tree = ast.parse(tree_source)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "GSM8K")
    methods = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}
    init = methods["__init__"].args
    named = init.args[len(init.args) - len(init.defaults) :]
    defaults = {a.arg: ast.literal_eval(d) for a, d in zip(named, init.defaults, strict=True)}
    method_source = ast.get_source_segment(tree_source, methods["split_solution_into_intermediate_steps"])
    assert method_source is not None
    namespace: dict[str, Any] = {"List": list}
    exec(textwrap.dedent(method_source), namespace)  # the official method, run from memory
    method = namespace["split_solution_into_intermediate_steps"]
    self_ = types.SimpleNamespace(
        use_original_format=True,
        intermediate_step_delimiter=defaults["intermediate_step_delimiter"],
        answer_prefix=defaults["answer_prefix"],
    )

    def split(text: str) -> list[str]:
        indices = method(self_, text)
        return [text[a:b] for a, b in zip(indices, indices[1:], strict=False) if b > a]

    return split


def load_baseline_math(rev: str, workdir: Path) -> Splitter:
    """``MathSegmenter()`` of this repo at git revision ``rev``, run in a subprocess on that revision's package.

    The revision's ``src/mcadvantage`` is extracted with ``git archive`` and imported from there in a worker
    process (``from mcadvantage import MathSegmenter`` works in every layout), so the whole segmenter of that
    revision is measured, its LaTeX scanning included, whichever modules it was spread over.
    """
    proc = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", rev, "src/mcadvantage"], capture_output=True
    )
    if proc.returncode != 0:
        raise SystemExit(f"--baseline-rev {rev}: git archive failed ({proc.stderr.decode().strip()})")
    root = workdir / "baseline"
    root.mkdir()
    subprocess.run(["tar", "-x", "-C", str(root)], input=proc.stdout, check=True)
    code = (
        "import json, sys\n"
        "from mcadvantage import MathSegmenter\n"
        "segmenter = MathSegmenter()\n"
        "for line in sys.stdin:\n"
        "    print(json.dumps(segmenter(json.loads(line))), flush=True)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(root / "src")}
    worker = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )

    def split(text: str) -> list[str]:
        assert worker.stdin is not None and worker.stdout is not None
        worker.stdin.write(json.dumps(text) + "\n")
        worker.stdin.flush()
        return json.loads(worker.stdout.readline())

    return split


# --------------------------------------------------------------------------------------------------
# Measures
# --------------------------------------------------------------------------------------------------


def load(path: Path, field: str) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line)[field] for line in f if line.strip()]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def cut_points(steps: list[str]) -> list[int]:
    out, acc = [], 0
    for s in steps[:-1]:
        acc += len(s)
        out.append(acc)
    return out


def normalized_cuts(text: str, steps: list[str]) -> set[int]:
    """Cut positions moved to the next non-whitespace character (whitespace placement ignored)."""
    out = set()
    for p in cut_points(steps):
        while p < len(text) and text[p].isspace():
            p += 1
        if p < len(text):  # a cut before trailing whitespace only is no step boundary to compare
            out.add(p)
    return out


def display_sentence_ends(text: str) -> list[int]:
    """Places where display math whose content ends with a period runs straight into more text on
    the same line (``= 25.\\]This``), as the position of the first character after the closer."""
    return [
        s.end
        for s in find_math_spans(text)
        if s.display
        and text[s.content_start : s.content_end].rstrip().endswith(".")
        and s.end < len(text)
        and not text[s.end].isspace()
    ]


def math_stats(name: str, texts: list[str], split: Splitter) -> tuple[dict, list[list[str]]]:
    all_steps = [split(t) for t in texts]
    for t, steps in zip(texts, all_steps, strict=True):
        assert "".join(steps) == t, f"{name} does not reconstruct the text"
    counts = [len(s) for s in all_steps]
    lengths = [len(x.strip()) for s in all_steps for x in s]
    inline = display = 0
    for t, steps in zip(texts, all_steps, strict=True):
        spans = find_math_spans(t)
        for p in cut_points(steps):
            for s in spans:
                if s.start < p < s.end:
                    display += s.display
                    inline += not s.display
    row = {
        "splitter": name,
        "solutions": len(texts),
        "steps_mean": statistics.mean(counts),
        "steps_median": statistics.median(counts),
        "steps_p90": pct(counts, 0.9),
        "steps_max": max(counts),
        "step_chars_mean": statistics.mean(lengths),
        "step_chars_median": statistics.median(lengths),
        "step_chars_p90": pct(lengths, 0.9),
        "step_chars_max": max(lengths),
        "steps_over_100_chars": sum(n > 100 for n in lengths),
        "share_steps_over_100_chars": sum(n > 100 for n in lengths) / len(lengths),
        "cuts_inside_inline_math": inline,
        "cuts_inside_display_math": display,
    }
    return row, all_steps


def agreement(texts: list[str], ours: list[list[str]], official: list[list[str]]) -> dict:
    both = n_official = n_ours = same = exact = 0
    for t, a, b in zip(texts, ours, official, strict=True):
        mine, theirs = normalized_cuts(t, a), normalized_cuts(t, b)
        both += len(mine & theirs)
        n_ours += len(mine)
        n_official += len(theirs)
        same += mine == theirs
        exact += a == b
    return {
        "official_cuts_in_ours": both / n_official,
        "our_cuts_in_official": both / n_ours,
        "share_solutions_same_cuts": same / len(texts),
        "share_solutions_identical_steps": exact / len(texts),
        "official_cuts": n_official,
        "our_cuts": n_ours,
    }


def sentence_end_coverage(texts: list[str], splits: dict[str, list[list[str]]]) -> dict:
    places = {k: display_sentence_ends(t) for k, t in enumerate(texts)}
    out: dict[str, Any] = {
        "places": sum(len(v) for v in places.values()),
        "solutions": sum(bool(v) for v in places.values()),
    }
    for name, all_steps in splits.items():
        cut = 0
        for k, t in enumerate(texts):
            cuts = normalized_cuts(t, all_steps[k])
            for p in places[k]:
                q = p
                while q < len(t) and t[q].isspace():
                    q += 1
                cut += q in cuts
        out[f"cut_by_{name}"] = cut
    return out


def gsm8k_agreement(texts: list[str], official: Splitter) -> list[dict]:
    theirs = [official(t) for t in texts]
    rows = []
    for placement in ("end", "start"):
        seg = GSM8KSegmenter(newline_placement=placement)
        ours = [seg(t) for t in texts]
        rows.append(
            {
                "segmenter": repr(seg),
                "answers": len(texts),
                "share_identical_steps": sum(a == b for a, b in zip(ours, theirs, strict=True)) / len(texts),
                "share_same_cuts_ignoring_whitespace": sum(
                    normalized_cuts(t, a) == normalized_cuts(t, b)
                    for t, a, b in zip(texts, ours, theirs, strict=True)
                )
                / len(texts),
            }
        )
    return rows


# --------------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------------


def fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def print_table(rows: list[dict], cols: list[str]) -> None:
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(fmt(r[c]) for c in cols) + " |")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--vineppo",
        type=Path,
        default=os.environ.get("VINEPPO_REPO"),
        help="clone/mirror of McGill-NLP/VinePPO, or a directory holding its splitter files "
        "(default: $VINEPPO_REPO)",
    )
    parser.add_argument("--commit", default="efe7228", help="official commit to read (default efe7228)")
    parser.add_argument("--baseline-rev", help="also measure MathSegmenter at this git revision of this repo")
    parser.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks" / "results" / "segmenter_fidelity.json"
    )
    args = parser.parse_args()

    math500 = load(args.data_dir / "math/test.jsonl", "solution")
    gsm8k = load(args.data_dir / "gsm8k/train.jsonl", "answer") + load(
        args.data_dir / "gsm8k/test.jsonl", "answer"
    )

    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        splitters: dict[str, Splitter] = {"ours": MathSegmenter()}
        if args.baseline_rev:
            splitters[f"ours@{args.baseline_rev}"] = load_baseline_math(args.baseline_rev, workdir)
        official_gsm8k = None
        if args.vineppo is not None:
            splitters["official"] = load_official_math(Path(args.vineppo), args.commit, workdir)
            official_gsm8k = load_official_gsm8k(Path(args.vineppo), args.commit)

        rows, steps = [], {}
        for name, split in splitters.items():
            row, steps[name] = math_stats(name, math500, split)
            rows.append(row)

    print("MATH-500 reference solutions, step lengths with whitespace stripped\n")
    print_table(rows, ["splitter", "steps_mean", "steps_median", "steps_p90", "steps_max"])
    print_table(
        rows,
        [
            "splitter",
            "step_chars_mean",
            "step_chars_median",
            "step_chars_p90",
            "step_chars_max",
            "steps_over_100_chars",
            "cuts_inside_inline_math",
            "cuts_inside_display_math",
        ],
    )

    if str(Path(__file__).resolve().parent) not in sys.path:  # imported as a module, not run: its sibling
        sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _machine import machine_info  # where the record was made (commit, versions, CPU, threads)

    result: dict[str, Any] = {
        "command": "python " + " ".join(["benchmarks/segmenter_fidelity.py", *sys.argv[1:]]),
        "official_commit": args.commit if args.vineppo is not None else None,
        "machine": machine_info(),
        "math500_steps": rows,
        "reference_before": REFERENCE_BEFORE,
    }
    coverage = sentence_end_coverage(math500, steps)
    result["math500_display_sentence_ends"] = coverage
    print("Display math ending a sentence, followed directly by text:", json.dumps(coverage), "\n")

    if "official" in steps:
        agree = []
        for name in splitters:
            if name != "official":
                agree.append({"splitter": name, **agreement(math500, steps[name], steps["official"])})
        result["math500_agreement_with_official"] = agree
        print("Agreement with the official cut points (MATH-500)\n")
        print_table(agree, list(agree[0]))
        assert official_gsm8k is not None
        gsm = gsm8k_agreement(gsm8k, official_gsm8k)
        result["gsm8k_agreement_with_official"] = gsm
        print("GSM8K train+test against the official splitter\n")
        print_table(gsm, list(gsm[0]))
    else:
        print(
            "No --vineppo given: agreement with the official splitter not measured. Reference before "
            f"this change: {REFERENCE_BEFORE}."
        )

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
