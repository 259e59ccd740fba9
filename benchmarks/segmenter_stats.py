"""Step statistics of the segmenters on real solutions, and the cost of token alignment.

Usage::

    python benchmarks/segmenter_stats.py [--data-dir ../shared/data] [--repeats 20]

Prints two tables and writes ``benchmarks/results/segmenter_stats.json``.

* Steps: for GSM8K (train+test reference answers) and MATH-500 (reference solutions), the number of
  steps per solution and the length of a step in characters (mean, median, p90, max), the share of
  solutions with more steps than a ``max_steps`` cap would allow, the share of steps over 100
  characters, and the segmentation time per solution.
* Alignment: milliseconds to map the steps of a 1024-token completion onto its tokens
  (``segment_completion``: batched windowed decoding + alignment) for a character tokenizer, a
  byte-level BPE and a SentencePiece-style (Metaspace) BPE trained offline on the data, next to the
  naive method (decode every prefix ``token_ids[:t]``, quadratic in characters) as a reference.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from mcadvantage.tasks import (
    GSM8KSegmenter,
    MathSegmenter,
    get_segmenter,
    segment_completion,
    step_token_boundaries,
)

ROOT = Path(__file__).resolve().parents[1]
CAPS = (8, 16, 25)


def load(path: Path, field: str) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line)[field] for line in f if line.strip()]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def step_stats(name: str, texts: list[str], segmenter) -> dict:
    start = time.perf_counter()
    all_steps = [segmenter(t) for t in texts]
    elapsed = time.perf_counter() - start
    counts = [len(s) for s in all_steps]
    lengths = [len(x) for s in all_steps for x in s]
    return {
        "dataset": name,
        "segmenter": repr(segmenter),
        "solutions": len(texts),
        "steps_mean": statistics.mean(counts),
        "steps_median": statistics.median(counts),
        "steps_p90": pct(counts, 0.9),
        "steps_max": max(counts),
        "step_chars_mean": statistics.mean(lengths),
        "step_chars_median": statistics.median(lengths),
        "step_chars_p90": pct(lengths, 0.9),
        "step_chars_max": max(lengths),
        "share_steps_over_100_chars": sum(n > 100 for n in lengths) / len(lengths),
        **{f"share_solutions_over_{c}_steps": sum(n > c for n in counts) / len(counts) for c in CAPS},
        "ms_per_solution": 1000 * elapsed / len(texts),
    }


def train_tokenizers(corpus: list[str]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from mcadvantage.testing import build_char_tokenizer

    byte = Tokenizer(models.BPE())
    byte.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    byte.decoder = decoders.ByteLevel()
    byte.train_from_iterator(
        corpus,
        trainers.BpeTrainer(
            vocab_size=4000, special_tokens=["<eos>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    meta = Tokenizer(models.BPE(unk_token="<unk>"))
    meta.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    meta.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    meta.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=4000, special_tokens=["<unk>", "<eos>"]))
    return {
        "char": build_char_tokenizer(),
        "byte-level BPE (4k)": PreTrainedTokenizerFast(tokenizer_object=byte, eos_token="<eos>"),
        "Metaspace BPE (4k)": PreTrainedTokenizerFast(
            tokenizer_object=meta, unk_token="<unk>", eos_token="<eos>"
        ),
    }


def naive_boundaries(tokenizer, ids: list[int], steps: list[str]) -> list[int]:
    """Reference method: the start of token t is len(decode(ids[:t])) -- one decode per prefix."""
    ends, acc = [], 0
    for s in steps:
        acc += len(s)
        ends.append(acc)
    bounds, prev = [0], 0
    for t in range(1, len(ids)):
        c = len(tokenizer.decode(ids[:t], skip_special_tokens=True))
        step = min(sum(1 for e in ends if e <= c), len(steps) - 1)
        if step > prev:
            bounds.append(t)
            prev = step
    return [*bounds, len(ids)]


def time_ms(fn, repeats: int) -> float:
    fn()  # warm-up
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(1000 * (time.perf_counter() - start))
    return statistics.median(samples)


def alignment_stats(math_texts: list[str], tokenizers: dict, repeats: int) -> list[dict]:
    text = "\n\n".join(math_texts)
    rows = []
    segmenter = get_segmenter("math")
    for name, tok in tokenizers.items():
        ids = tok(text, add_special_tokens=False)["input_ids"][:1023] + [tok.eos_token_id]
        steps = segmenter(tok.decode(ids, skip_special_tokens=True))
        fast = time_ms(lambda tok=tok, ids=ids: segment_completion(segmenter, tok, ids), repeats)
        align_only = time_ms(
            lambda tok=tok, ids=ids, steps=steps: step_token_boundaries(tok, ids, steps), repeats
        )
        naive = time_ms(
            lambda tok=tok, ids=ids, steps=steps: naive_boundaries(tok, ids, steps), max(3, repeats // 5)
        )
        agree = naive_boundaries(tok, ids, steps) == step_token_boundaries(tok, ids, steps)
        rows.append(
            {
                "tokenizer": name,
                "tokens": len(ids),
                "chars": len(tok.decode(ids, skip_special_tokens=True)),
                "steps": len(steps),
                "segment_completion_ms": fast,
                "step_token_boundaries_ms": align_only,
                "naive_prefix_decode_ms": naive,
                "naive_agrees": agree,
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "segmenter_stats.json")
    args = parser.parse_args()

    gsm8k = load(args.data_dir / "gsm8k/train.jsonl", "answer") + load(
        args.data_dir / "gsm8k/test.jsonl", "answer"
    )
    math500 = load(args.data_dir / "math/test.jsonl", "solution")

    steps = [
        step_stats("GSM8K train+test", gsm8k, GSM8KSegmenter()),
        step_stats("MATH-500", math500, MathSegmenter()),
        step_stats("MATH-500", math500, GSM8KSegmenter()),
    ]
    cols = ["dataset", "segmenter", "solutions", "steps_mean", "steps_median", "steps_p90", "steps_max"]
    cols2 = ["step_chars_mean", "step_chars_median", "step_chars_p90", "step_chars_max"]
    cols2 += [
        "share_steps_over_100_chars",
        *[f"share_solutions_over_{c}_steps" for c in CAPS],
        "ms_per_solution",
    ]

    def fmt(v):
        return f"{v:.3g}" if isinstance(v, float) else str(v)

    print("| " + " | ".join(cols) + " |")
    for r in steps:
        print("| " + " | ".join(fmt(r[c]) for c in cols) + " |")
    print()
    print("| dataset | " + " | ".join(cols2) + " |")
    for r in steps:
        label = f"{r['dataset']} / {r['segmenter'].split('(')[0]}"
        print(f"| {label} | " + " | ".join(fmt(r[c]) for c in cols2) + " |")
    print()

    tokenizers = train_tokenizers(gsm8k[:3000] + math500)
    align = alignment_stats(math500, tokenizers, args.repeats)
    acols = list(align[0])
    print("| " + " | ".join(acols) + " |")
    for r in align:
        print("| " + " | ".join(fmt(r[c]) for c in acols) + " |")

    if str(Path(__file__).resolve().parent) not in sys.path:  # imported as a module, not run: its sibling
        sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _machine import machine_info  # where the record was made (commit, versions, CPU, threads)

    result = {
        "command": "python benchmarks/segmenter_stats.py",
        "machine": machine_info(),
        "steps": steps,
        "alignment_1024_tokens": align,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
