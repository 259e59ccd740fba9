"""Verifiers: hand-written cases for extraction, exact comparison, the TRL reward-function interface,
time bounds on adversarial answers (any thread), and the guard against evaluating model output."""

from __future__ import annotations

import copy
import subprocess
import sys
import threading
import time
import uuid
from fractions import Fraction
from pathlib import Path

import pytest

from mcadvantage.tasks import (
    GSM8KVerifier,
    MathVerifier,
    Verifier,
    completion_text,
    extract_boxed,
    extract_gsm8k_answer,
    get_verifier,
)


@pytest.fixture(scope="module")
def math_verifier():
    verifier = MathVerifier()
    verifier.warmup()
    return verifier


# ---------------------------------------------------------------- import hygiene and construction


def test_importing_verifiers_imports_neither_trl_vllm_nor_math_verify():
    code = (
        "import sys, mcadvantage.tasks.verifier\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('trl', 'vllm', 'math_verify', 'sympy')]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_defaults_names_and_protocol():
    gsm8k, math = GSM8KVerifier(), MathVerifier()
    assert gsm8k.answer_field == "answer" and math.answer_field == "answer"
    assert math.solution_field == "solution"
    assert gsm8k.__name__ == "gsm8k_verifier" and math.__name__ == "math_verifier"
    assert isinstance(gsm8k, Verifier) and isinstance(math, Verifier)
    assert isinstance(get_verifier("gsm8k"), GSM8KVerifier)
    assert isinstance(get_verifier(" MATH "), MathVerifier)
    assert get_verifier("math", timeout_seconds=0.5).timeout_seconds == 0.5
    with pytest.raises(ValueError, match="unknown verifier 'mmlu'.*'gsm8k', 'math'"):
        get_verifier("mmlu")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"answer_field": ""}, "answer_field"),
        ({"timeout_seconds": 0}, "timeout_seconds must be a positive"),
        ({"max_answer_chars": 0}, "max_answer_chars"),
        ({"num_workers": 0}, "num_workers must be an integer >= 1"),
        ({"cache_size": -1}, "cache_size must be an integer >= 0"),
    ],
)
def test_math_verifier_rejects_bad_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MathVerifier(**kwargs)


def test_verifiers_deepcopy_and_pickle_without_process_handles():
    import pickle

    verifier = MathVerifier(timeout_seconds=1.25)
    clone = pickle.loads(pickle.dumps(copy.deepcopy(verifier)))
    assert clone.timeout_seconds == 1.25 and clone.__name__ == "math_verifier"


# ---------------------------------------------------------------- completions (TRL formats)


def test_completion_text_formats():
    assert completion_text("#### 3") == "#### 3"
    assert completion_text(None) is None
    conversation = [
        {"role": "system", "content": "be brief"},
        {"role": "assistant", "content": "first"},
        {"role": "user", "content": "again"},
        {"role": "assistant", "content": "second"},
    ]
    assert completion_text(conversation) == "second"
    assert completion_text([{"role": "user", "content": "only a question"}]) is None
    assert completion_text({"role": "assistant", "content": "x"}) == "x"
    parts = [{"role": "assistant", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert completion_text(parts) == "ab"
    with pytest.raises(TypeError, match="completions must hold strings"):
        completion_text(42)


# ---------------------------------------------------------------- GSM8K


@pytest.mark.parametrize(
    "text, expected",
    [
        ("so 9 * 2 = 18\n#### 18", Fraction(18)),
        ("#### $1,000.", Fraction(1000)),
        ("####-5", Fraction(-5)),
        ("#### \u22125", Fraction(-5)),
        ("#### 3.50 dollars", Fraction(7, 2)),
        ("#### .5", Fraction(1, 2)),
        ("#### 12 apples\nthen #### 7", Fraction(7)),  # the last marker counts
        ("#### The answer is 42.", Fraction(42)),  # first number after the marker
        ("####\n  8", Fraction(8)),
        ("#### no number here\n5", None),  # only the marker's line is searched
        ("The answer is 42", None),  # no marker: no answer
        ("####", None),
    ],
)
def test_extract_gsm8k_answer(text, expected):
    assert extract_gsm8k_answer(text) == expected


@pytest.mark.parametrize(
    "response, gold, reward",
    [
        ("#### 18", "18", 1.0),
        ("#### 18", "She makes 9 * 2 = $<<9*2=18>>18\n#### 18", 1.0),  # full reference as gold
        ("#### 18", 18, 1.0),
        ("#### 1,000", "1000", 1.0),
        ("#### 1000", "1,000", 1.0),
        ("#### $5.00", " $5 ", 1.0),
        ("#### 5.0", "5", 1.0),
        ("#### 4.9999999999", "5", 0.0),  # exact, no tolerance
        ("#### 19", "18", 0.0),
        ("18", "18", 0.0),  # no marker
        (None, "18", 0.0),
        ("#### 18", "eighteen", 0.0),  # gold without a number scores 0, never raises
    ],
)
def test_gsm8k_score(response, gold, reward):
    assert GSM8KVerifier().score(response, gold) == reward


def test_gsm8k_huge_numbers_and_long_strings_score_zero_quickly():
    verifier = GSM8KVerifier()
    start = time.perf_counter()
    assert verifier.score("#### " + "9" * 1_000_000, "9") == 0.0
    assert verifier.score("x" * 1_000_000 + "#### 7", "7") == 1.0
    assert verifier.score("####" * 250_000, "7") == 0.0
    assert time.perf_counter() - start < 2.0


def test_gsm8k_as_trl_reward_function():
    verifier = GSM8KVerifier()
    rewards = verifier(
        prompts=["q1", "q2", "q3"],
        completions=["#### 3", "#### 4", None],
        completion_ids=[[1], [2], [3]],
        answer=["3", "5", "1"],
        trainer_state=object(),
        log_extra=lambda *a: None,
        log_metric=lambda *a: None,
        question=["a", "b", "c"],
    )
    assert rewards == [1.0, 0.0, 0.0]
    conversational = [
        [{"role": "assistant", "content": "#### 3"}],
        [{"role": "assistant", "content": "#### 2"}],
    ]
    assert verifier(prompts=None, completions=conversational, answer=["3", "3"]) == [1.0, 0.0]
    custom = GSM8KVerifier(answer_field="target")
    assert custom(completions=["#### 3"], target=["3"]) == [1.0]


def test_missing_gold_column_is_a_clear_error():
    with pytest.raises(ValueError, match=r"'target'.*present: \['answer', 'question'\].*answer_field="):
        GSM8KVerifier(answer_field="target")(
            completions=["#### 3"], answer=["3"], question=["q"], trainer_state=None
        )
    with pytest.raises(ValueError, match="2 values for 1 completions"):
        GSM8KVerifier()(completions=["#### 3"], answer=["3", "4"])
    with pytest.raises(ValueError, match="needs completions"):
        GSM8KVerifier()(answer=["3"])


# ---------------------------------------------------------------- MATH: extraction


@pytest.mark.parametrize(
    "text, expected",
    [
        (r"so $\boxed{\frac{1}{2}}$.", r"\frac{1}{2}"),
        (r"\boxed{1} then \boxed{2}", "2"),
        (r"\fbox{3}", "3"),
        (r"\boxed{\{1,2\}}", r"\{1,2\}"),
        (r"\boxed{\left\{ x \right.}", r"\left\{ x \right."),
        (r"\boxed {7}", "7"),
        (r"so $\boxed 5$.", "5"),
        (r"\boxed{\frac{1}{2}", None),  # truncated: unclosed last box
        (r"\boxedx{3}", None),
        ("no box at all", None),
        (r"\boxed{}", ""),
    ],
)
def test_extract_boxed(text, expected):
    assert extract_boxed(text) == expected


# ---------------------------------------------------------------- MATH: equivalence


@pytest.mark.parametrize(
    "pred, gold, equal",
    [
        ("0.5", r"\frac{1}{2}", True),
        (r"\frac{1}{3}", "0.5", False),
        ("(x+1)^2", "x^2+2x+1", True),
        (r"\dfrac{10}{9}", r"\frac{10}{9}", True),
        (r"\left( 3, \frac{\pi}{2} \right)", r"(3, \frac{\pi}{2})", True),
        (r"(3, \frac{2\pi}{3})", r"\left( 3, \frac{\pi}{2} \right)", False),
        ("[0,1)", "[0,1]", False),
        (r"5 \leq x", r"x \geq 5", True),
        ("1 000", "1000", True),  # thousands separators: plain numbers compared exactly
        (r"\$18.90", "18.9", True),  # currency sign
        (r"\$32,\!348", r"\$32,\!348", True),
        ("-7", "7", False),
        # exact rationals: math-verify alone rounds both to 0 and calls them equal
        (r"\frac{1}{2^{99}}", r"\frac{1}{2^{98}}", False),
        (r"\frac{1}{2004!}", r"\frac{1}{2006!}", False),
        # ellipsis patterns: math-verify alone drops the ellipsis and calls these equal
        (r"1, 3, 5, \ldots, 2n-1", r"1, 2, \ldots, n", False),
        (r"1, 2, \ldots, n", r"1,2,\ldots,n", True),
        # ... but an ellipsis in the working of a boxed response does not decide anything
        (r"so \[(5) \dotsm (1) = \boxed{\frac{3}{56}}\]", r"\frac{3}{56}", True),
        # \mathrm{e} is Euler's number; math-verify alone truncates it and calls these equal
        (r"1 + \frac{1}{\mathrm{e}}", r"1 - \frac{1}{\mathrm{e}}", False),
        (r"1 - \frac{1}{e}", r"1 - \frac{1}{\mathrm{e}}", True),
        ("", "3", False),
        ("   ", "3", False),
        ("garbage }{ \\frac", "3", False),
    ],
)
def test_is_equivalent(math_verifier, pred, gold, equal):
    assert math_verifier.is_equivalent(pred, gold) is equal


def test_math_score_and_trl_interface(math_verifier):
    responses = [
        r"We get $x = \boxed{\frac{1}{2}}$.",
        r"We get $x = \boxed{\frac{1}{3}}$.",
        "I think it is 1/2.",  # no box
        r"so $\boxed{\frac{1}{2}",  # truncated
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": r"\boxed{0.5}"}],
    ]
    golds = [r"\frac12", "0.5", "1/2", r"\frac{1}{2}", r"\frac{1}{2}"]
    assert math_verifier(prompts=["p"] * 5, completions=responses, answer=golds, trainer_state=None) == [
        1.0,
        0.0,
        0.0,
        0.0,
        1.0,
    ]
    assert math_verifier.score(r"\boxed{4}", "4") == 1.0
    assert math_verifier.score(None, "4") == 0.0
    assert math_verifier.score(r"\boxed{4}", 4) == 1.0  # numeric gold column


def test_math_gold_from_solution_column_when_no_answer_column(math_verifier):
    solutions = [r"Thus the answer is $\boxed{12}$.", r"No box here, oddly."]
    rewards = math_verifier(completions=[r"\boxed{12}", r"\boxed{3}"], solution=solutions)
    assert rewards == [1.0, 0.0]
    with pytest.raises(ValueError, match=r"'answer' or 'solution'.*present: \['problem'\]"):
        math_verifier(completions=[r"\boxed{1}"], problem=["p"])


def test_math_overlong_answers_score_zero_without_parsing(math_verifier):
    verifier = MathVerifier(max_answer_chars=10)
    assert verifier.is_equivalent("12345678901", "12345678901") is False
    assert verifier.is_equivalent("1", "1") is True


# ---------------------------------------------------------------- time bounds

ADVERSARIAL = [
    r"9^{9^{9^{9^{9}}}}",
    r"10000000!",
    r"(10^{10^{10}})!",
    r"\frac{1}{" * 60 + "2" + "}" * 60,
    r"\sqrt{" * 100 + "2" + "}" * 100,
    "1" * 1_000_000,
    r"\boxed{" + "9" * 1_000_000 + "}",
]


def _timed(verifier, pred, gold="5"):
    start = time.perf_counter()
    result = verifier.is_equivalent(pred, gold)
    return result, time.perf_counter() - start


def test_adversarial_answers_return_false_within_two_seconds(math_verifier):
    for pred in ADVERSARIAL:
        result, seconds = _timed(math_verifier, pred)
        assert result is False, pred[:40]
        assert seconds < 2.0, (pred[:40], seconds)
    # The grading process is still healthy afterwards.
    assert math_verifier.is_equivalent("(x+1)^2", "x^2+2x+1") is True


def test_adversarial_answers_are_bounded_off_the_main_thread(math_verifier):
    outcomes = []

    def grade():
        for pred in ADVERSARIAL[:3]:
            outcomes.append(_timed(math_verifier, pred))
        outcomes.append(_timed(math_verifier, r"\frac{2}{4}", "0.5"))

    worker = threading.Thread(target=grade)
    worker.start()
    worker.join(30)
    assert not worker.is_alive()
    assert [r for r, _ in outcomes] == [False, False, False, True]
    assert max(s for _, s in outcomes) < 2.0


def test_answers_stuck_in_c_code_are_stopped_by_killing_the_grading_child():
    # Without the in-child alarm only the supervisor's kill can stop a hang: each of these would run
    # for minutes (or exhaust memory) if it were not killed.
    verifier = MathVerifier(timeout_seconds=1.0, interrupt_in_child=False)
    verifier.warmup()
    kills_before = verifier.grading_process_info()["kills"]
    for pred in (r"9^{9^{9^{9^{9}}}}", r"10000000!"):
        result, seconds = _timed(verifier, pred)
        assert result is False and seconds < 2.0, (pred, seconds)
    assert verifier.grading_process_info()["kills"] == kills_before + 2
    # A fresh child grades the next batch, including correct answers after a hang.
    assert verifier.equivalent_batch([("2^{2^{2^{2^{2^{2^{2}}}}}}", "1"), ("0.25", r"\frac14")]) == [
        False,
        True,
    ]
    verifier.close()
    assert verifier.is_equivalent("3", "3.0") is True  # restarts after close()
    verifier.close()


def test_repeated_answers_are_graded_once_from_the_verdict_cache():
    # A hanging answer costs one kill the first time; the same (answer, gold) pair again is answered
    # from the cache, in a batch or in a later call, without reaching the grading process.
    verifier = MathVerifier(timeout_seconds=1.0, interrupt_in_child=False, cache_size=8)
    verifier.warmup()
    kills_before = verifier.grading_process_info()["kills"]
    assert verifier.equivalent_batch([(r"10000000!", "1")] * 3) == [False, False, False]
    assert verifier.grading_process_info()["kills"] == kills_before + 1
    result, seconds = _timed(verifier, r"10000000!", "1")
    assert result is False and seconds < 0.5
    assert verifier.grading_process_info()["kills"] == kills_before + 1
    # The cache is bounded (oldest verdicts dropped first) and cache_size=0 turns it off.
    for k in range(20):
        verifier.is_equivalent(f"{k}x", f"x*{k}")
    assert len(verifier._verdicts) == 8
    uncached = MathVerifier(timeout_seconds=1.0, interrupt_in_child=False, cache_size=0)
    assert uncached.is_equivalent("(x+1)^2", "x^2+2x+1") is True and len(uncached._verdicts) == 0
    verifier.close()
    uncached.close()


def test_several_grading_workers_give_the_same_verdicts():
    verifier = MathVerifier(num_workers=2, cache_size=0)
    pairs = [("(x+1)^2", "x^2+2x+1"), (r"\frac{1}{3}", "0.3"), (r"\sqrt{8}", r"2\sqrt{2}"), ("x+y", "y+x+1")]
    assert verifier.equivalent_batch(pairs) == [True, False, True, False]
    assert verifier.grading_process_info()["workers"] == 2
    verifier.close()


# ---------------------------------------------------------------- no eval of model output


def test_sympy_parser_would_run_python_and_the_guard_refuses(tmp_path: Path):
    from sympy.parsing.sympy_parser import parse_expr

    from mcadvantage.tasks.math_equivalence import _make_guarded_parse_expr

    # The threat is real: sympy's string parser evaluates Python.
    canary = tmp_path / "pwned_unguarded"
    parse_expr(f"__import__('os').system('touch {canary}')")
    assert canary.exists()

    guarded = _make_guarded_parse_expr(parse_expr)
    canary = tmp_path / "pwned_guarded"
    for attack in (
        f"__import__('os').system('touch {canary}')",
        f"open('{canary}', 'w')",
        "exit()",
    ):
        with pytest.raises(ValueError, match="refusing to evaluate"):
            guarded(attack)
    assert not canary.exists()
    assert guarded("1/2 + 3*(4 - 1)") == parse_expr("1/2 + 3*(4 - 1)")


def test_python_in_answers_has_no_effect_and_scores_zero(math_verifier, tmp_path: Path):
    marker = tmp_path / f"pwned_{uuid.uuid4().hex}"
    touch = f"__import__('os').system('touch {marker}')"
    attacks = [
        rf"\boxed{{{touch}}}",
        rf"$\boxed{{{touch}}}$",
        f"${touch}$",
        touch,
        rf"\boxed{{\text{{{touch}}}}}",
        rf"\boxed{{open('{marker}', 'w')}}",
        rf"\boxed{{exec(\"import os; os.system('touch {marker}')\")}}",
        r"\boxed{().__class__.__base__.__subclasses__()}",
        rf"\boxed{{1 + {touch}}}",
    ]
    responses = [a if a.startswith(("\\boxed", "$\\boxed")) else rf"\boxed{{{a}}}" for a in attacks]
    assert math_verifier(completions=responses, answer=["5"] * len(responses)) == [0.0] * len(responses)
    assert math_verifier.equivalent_batch([(a, "5") for a in attacks]) == [False] * len(attacks)
    # Also as gold (a poisoned dataset row) and for the GSM8K verifier.
    assert math_verifier.is_equivalent("5", touch) is False
    assert GSM8KVerifier().score(f"#### {touch}", "5") == 0.0
    assert not marker.exists()
    info = math_verifier.grading_process_info()
    assert info["guard"] is True
