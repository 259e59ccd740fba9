"""Verifier conformance and throughput on the reference data in ../shared.

Measures, with the library's default verifiers:

* GSM8K (train + test, 8,792 reference solutions): each solution graded as a response against its
  own gold (the number after ``####``, and the full reference as gold) must score 1.0, and against
  gold + 1 must score 0.0. Answers/second of batch grading.
* MATH-500: each reference solution graded against the ``answer`` field (rate of 1.0, with the
  exceptions listed), and against the answer of the next problem whose answer differs as a string
  (rate of 1.0 = false positives, listed). Answers/second of batch grading.
* Public grader conformance cases (../shared/benchmarks/verifier_cases.jsonl):
  ``MathVerifier.is_equivalent(pred, gold)`` against the source's label, on unflagged ``answer_pair``
  rows (the headline rate), flagged ``answer_pair`` rows and ``needs_extraction`` rows.

Usage::

    python benchmarks/verifier_conformance.py [--shared ../shared] [--out benchmarks/results/verifier_conformance.json]

Prints a table and writes JSON. Needs the ../shared data folder beside the checkout.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from fractions import Fraction
from pathlib import Path

from mcadvantage.tasks.gsm8k import GSM8KVerifier, extract_gsm8k_answer
from mcadvantage.tasks.math import MathVerifier
from mcadvantage.tasks.math_equivalence import _normalized

ROOT = Path(__file__).resolve().parents[1]


def load_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def gsm8k(shared: Path) -> dict:
    rows = []
    for split in ("train", "test"):
        rows += load_jsonl(shared / "data" / "gsm8k" / f"{split}.jsonl")
    verifier = GSM8KVerifier()
    solutions = [r["answer"] for r in rows]
    numbers = [extract_gsm8k_answer(s) for s in solutions]
    golds = [str(n.numerator) if n.denominator == 1 else str(float(n)) for n in numbers]
    plus_one = [str(n + 1) if n.denominator == 1 else str(float(n + 1)) for n in numbers]

    start = time.perf_counter()
    own = verifier(prompts=None, completions=solutions, answer=golds)
    elapsed = time.perf_counter() - start
    full = verifier(completions=solutions, answer=solutions)
    wrong = verifier(completions=solutions, answer=plus_one)
    failures = [i for i, (a, b, c) in enumerate(zip(own, full, wrong, strict=True)) if (a, b, c) != (1, 1, 0)]
    return {
        "rows": len(rows),
        "own_gold_rate": sum(own) / len(rows),
        "full_reference_gold_rate": sum(full) / len(rows),
        "gold_plus_one_rate": sum(wrong) / len(rows),
        "failures": failures[:50],
        "answers_per_second": len(rows) / elapsed,
        "non_integer_golds": sum(n.denominator != 1 for n in numbers if isinstance(n, Fraction)),
    }


def math500(shared: Path, verifier: MathVerifier) -> dict:
    rows = load_jsonl(shared / "data" / "math" / "test.jsonl")
    solutions = [r["solution"] for r in rows]
    answers = [r["answer"] for r in rows]
    start = time.perf_counter()
    scores = verifier(prompts=[r["problem"] for r in rows], completions=solutions, answer=answers)
    elapsed = time.perf_counter() - start
    exceptions = [
        {"unique_id": r["unique_id"], "answer": r["answer"], "boxed": _last_box(r["solution"])}
        for r, s in zip(rows, scores, strict=True)
        if s != 1.0
    ]
    # Wrong golds: the next problem's answer, skipping ones equal as strings up to spacing.
    wrong_golds = []
    for i in range(len(rows)):
        j = (i + 1) % len(rows)
        while _normalized(answers[j]) == _normalized(answers[i]):
            j = (j + 1) % len(rows)
        wrong_golds.append(answers[j])
    start = time.perf_counter()
    wrong = verifier(completions=solutions, answer=wrong_golds)
    wrong_elapsed = time.perf_counter() - start
    false_positives = [
        {"unique_id": r["unique_id"], "answer": r["answer"], "wrong_gold": g}
        for r, g, s in zip(rows, wrong_golds, wrong, strict=True)
        if s != 0.0
    ]
    # The same check with every pair sent through math-verify (no in-process string/number shortcut):
    # MATH-500's answer field is the solution's last box, so the shortcut decides all of the above.
    pairs = [(_last_box(s) or "", a) for s, a in zip(solutions, answers, strict=True)]
    start = time.perf_counter()
    forced = verifier._service.grade(pairs)
    forced_elapsed = time.perf_counter() - start
    forced_exceptions = [
        {"unique_id": r["unique_id"], "answer": r["answer"], "boxed": p}
        for r, (p, _), ok in zip(rows, pairs, forced, strict=True)
        if not ok
    ]
    return {
        "rows": len(rows),
        "own_answer_rate": sum(scores) / len(rows),
        "own_answer_rate_math_verify_only": sum(forced) / len(rows),
        "math_verify_only_exceptions": forced_exceptions,
        "math_verify_only_answers_per_second": len(rows) / forced_elapsed,
        "exceptions": exceptions,
        "answers_per_second": len(rows) / elapsed,
        "wrong_gold_rate": sum(wrong) / len(rows),
        "false_positives": false_positives,
        "wrong_gold_answers_per_second": len(rows) / wrong_elapsed,
    }


def _last_box(solution: str) -> str | None:
    from mcadvantage.tasks.math import extract_boxed

    return extract_boxed(solution)


def conformance(shared: Path, verifier: MathVerifier) -> dict:
    rows = load_jsonl(shared / "benchmarks" / "verifier_cases.jsonl")
    groups = {
        "answer_pair_unflagged": [r for r in rows if r["kind"] == "answer_pair" and not r.get("flags")],
        "answer_pair_flagged": [r for r in rows if r["kind"] == "answer_pair" and r.get("flags")],
        "needs_extraction": [r for r in rows if r["kind"] == "needs_extraction"],
    }
    result = {}
    for name, group in groups.items():
        verdicts = verifier.equivalent_batch([(r["pred"], r["gold"]) for r in group])
        disagreements = [
            {
                "gold": r["gold"][:160],
                "pred": r["pred"][:160],
                "label": r["equal"],
                "source": r["source"],
                "flags": r.get("flags"),
                "note": r.get("note"),
            }
            for r, v in zip(group, verdicts, strict=True)
            if v != r["equal"]
        ]
        result[name] = {
            "rows": len(group),
            "agree": len(group) - len(disagreements),
            "rate": (len(group) - len(disagreements)) / len(group),
            "disagreements": disagreements,
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", type=Path, default=ROOT.parent / "shared")
    parser.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks" / "results" / "verifier_conformance.json"
    )
    args = parser.parse_args()
    if not (args.shared / "data").exists():
        sys.exit(f"reference data not found under {args.shared}; pass --shared")

    verifier = MathVerifier()
    start = time.perf_counter()
    verifier.warmup()
    startup = time.perf_counter() - start

    if str(Path(__file__).resolve().parent) not in sys.path:  # imported as a module, not run: its sibling
        sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _machine import machine_info  # where the record was made (commit, versions, CPU, threads)

    results = {
        "command": "python benchmarks/verifier_conformance.py",
        "machine": machine_info(note="shared 2-core CPU machine (other jobs running)"),
        "math_verifier": repr(verifier),
        "grading_process_startup_s": startup,
        "gsm8k": gsm8k(args.shared),
        "math500": math500(args.shared, verifier),
        "conformance": conformance(args.shared, verifier),
        "grading_process": verifier.grading_process_info(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")

    g, m, c = results["gsm8k"], results["math500"], results["conformance"]
    table = [
        ("GSM8K reference vs own gold (number)", f"{g['own_gold_rate']:.4f}", f"n={g['rows']}"),
        ("GSM8K reference vs own gold (full ref)", f"{g['full_reference_gold_rate']:.4f}", f"n={g['rows']}"),
        ("GSM8K reference vs gold + 1", f"{g['gold_plus_one_rate']:.4f}", f"n={g['rows']}"),
        ("GSM8K batch grading", f"{g['answers_per_second']:,.0f} answers/s", ""),
        ("MATH-500 reference vs answer", f"{m['own_answer_rate']:.4f}", f"exceptions={len(m['exceptions'])}"),
        (
            "MATH-500 reference vs answer, math-verify only",
            f"{m['own_answer_rate_math_verify_only']:.4f}",
            f"exceptions={len(m['math_verify_only_exceptions'])}",
        ),
        (
            "MATH-500 reference vs other answer",
            f"{m['wrong_gold_rate']:.4f}",
            f"false+={len(m['false_positives'])}",
        ),
        ("MATH-500 batch grading (own answer)", f"{m['answers_per_second']:,.0f} answers/s", ""),
        (
            "MATH-500 batch grading (math-verify only)",
            f"{m['math_verify_only_answers_per_second']:,.0f} answers/s",
            "",
        ),
        ("MATH-500 batch grading (other answer)", f"{m['wrong_gold_answers_per_second']:,.0f} answers/s", ""),
    ]
    for name, group in c.items():
        table.append((f"conformance: {name}", f"{group['rate']:.4f}", f"{group['agree']}/{group['rows']}"))
    width = max(len(r[0]) for r in table)
    print(f"{'measure':<{width}}  {'value':>22}  detail")
    for name, value, detail in table:
        print(f"{name:<{width}}  {value:>22}  {detail}")
    print(f"\nMATH-500 exceptions: {[e['unique_id'] for e in m['exceptions']]}")
    for e in m["math_verify_only_exceptions"]:
        print(f"math-verify-only exception {e['unique_id']}: answer={e['answer']!r} boxed={e['boxed']!r}")
    for e in m["false_positives"]:
        print(f"false positive {e['unique_id']}: answer={e['answer']!r} graded equal to {e['wrong_gold']!r}")
    for d in c["answer_pair_unflagged"]["disagreements"]:
        print(f"disagree (label={d['label']}): gold={d['gold']!r} pred={d['pred']!r}")
    print(f"grading process: {results['grading_process']}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
