"""Step segmentation rules and token alignment, on hand-written texts and offline tokenizers."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest

from mcadvantage.tasks import (
    GSM8KSegmenter,
    MathSegmenter,
    NewlineSegmenter,
    StepSegmenter,
    get_segmenter,
    segment_completion,
    step_token_boundaries,
    token_char_offsets,
)

# --------------------------------------------------------------------------------------------------
# GSM8K / newline
# --------------------------------------------------------------------------------------------------

NATALIA = (
    "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
    "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n"
    "#### 72"
)


def test_gsm8k_answer_line_joins_last_step():
    assert GSM8KSegmenter()(NATALIA) == [
        "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n",
        "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72",
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a\n\nb\n#### 5", ["a\n", "\nb\n#### 5"]),  # blank line merges forward
        ("a\nb\n\n#### 5\n", ["a\n", "b\n\n#### 5\n"]),  # blank before the answer: all in the last step
        ("\n\na\nb", ["\n\na\n", "b"]),  # leading blank lines join the first step
        ("a\nb\n\n", ["a\n", "b\n\n"]),  # trailing blank lines join the last step
        ("#### 5", ["#### 5"]),  # nothing before the answer: it is its own step
        ("  \n", ["  \n"]),
        ("", []),
        ("x = 1\r\ny = 2", ["x = 1\r\n", "y = 2"]),  # only "\n" separates; "\r" stays
        ("a\n  #### 5", ["a\n  #### 5"]),  # an indented answer line is still the answer
    ],
)
def test_gsm8k_rules(text, expected):
    steps = GSM8KSegmenter()(text)
    assert steps == expected
    assert "".join(steps) == text


def test_newline_segmenter_has_no_answer_rule():
    assert NewlineSegmenter()("a\n#### 5") == ["a\n", "#### 5"]
    assert NewlineSegmenter()("a\n\nb") == ["a\n", "\nb"]


def test_gsm8k_custom_answer_marker():
    assert GSM8KSegmenter(answer_marker="The answer is")("x\nThe answer is 3") == ["x\nThe answer is 3"]


@pytest.mark.parametrize("cls", [GSM8KSegmenter, NewlineSegmenter])
def test_line_segmenters_max_steps(cls):
    text = "a\nb\nc\nd"
    assert cls(max_steps=2)(text) == ["a\n", "b\nc\nd"]
    assert cls(max_steps=1)(text) == [text]
    assert cls(max_steps=4)(text) == ["a\n", "b\n", "c\n", "d"]
    assert cls(max_steps=10)(text) == ["a\n", "b\n", "c\n", "d"]


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "3"])
@pytest.mark.parametrize("cls", [GSM8KSegmenter, NewlineSegmenter, MathSegmenter])
def test_max_steps_validation(cls, bad):
    with pytest.raises(ValueError, match="max_steps"):
        cls(max_steps=bad)


def test_gsm8k_answer_marker_validation():
    with pytest.raises(ValueError, match="answer_marker"):
        GSM8KSegmenter(answer_marker="  ")


def test_gsm8k_newline_placement_start_matches_official():
    # The official VinePPO code splits on "\n" and starts each following step with the newline.
    steps = GSM8KSegmenter(newline_placement="start")(NATALIA)
    assert steps == [
        "Natalia sold 48/2 = <<48/2=24>>24 clips in May.",
        "\nNatalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72",
    ]
    assert GSM8KSegmenter(newline_placement="end")(NATALIA) == GSM8KSegmenter()(NATALIA)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a\nb\nc", ["a", "\nb", "\nc"]),
        ("a\n\nb\n#### 5", ["a", "\n\nb\n#### 5"]),  # the blank line still merges forward
        ("\n\na\nb", ["\n\na", "\nb"]),  # leading blank lines stay in the first step
        ("a\nb\n\n", ["a", "\nb\n\n"]),  # trailing newlines stay in the last step
        ("a\n", ["a\n"]),  # one line: nothing to move
        ("x = 1\r\ny = 2", ["x = 1\r", "\ny = 2"]),  # only the "\n" moves
        ("", []),
    ],
)
def test_gsm8k_newline_placement_start_rules(text, expected):
    steps = GSM8KSegmenter(newline_placement="start")(text)
    assert steps == expected
    assert "".join(steps) == text


def test_newline_placement_start_with_cap_and_names():
    assert NewlineSegmenter(max_steps=2, newline_placement="start")("a\nb\nc") == ["a", "\nb\nc"]
    seg = get_segmenter("gsm8k", newline_placement="start")
    assert seg.newline_placement == "start"
    assert repr(seg) == "GSM8KSegmenter(max_steps=None, answer_marker='####', newline_placement='start')"
    assert repr(GSM8KSegmenter()) == "GSM8KSegmenter(max_steps=None, answer_marker='####')"


@pytest.mark.parametrize("cls", [GSM8KSegmenter, NewlineSegmenter])
@pytest.mark.parametrize("bad", ["before", "START", None])
def test_newline_placement_validation(cls, bad):
    with pytest.raises(ValueError, match=r"newline_placement must be 'end' .* or 'start'"):
        cls(newline_placement=bad)


# --------------------------------------------------------------------------------------------------
# MATH
# --------------------------------------------------------------------------------------------------


def raw_math(**kwargs):
    """A MathSegmenter without short-part merging, to see the raw cut rules."""
    return MathSegmenter(min_part_length=0, **kwargs)


def test_math_defaults():
    seg = MathSegmenter()
    assert (seg.max_part_length, seg.min_part_length, seg.max_steps) == (100, 12, None)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # a period inside inline math is not a sentence end
        ("Let $x = 3.5$. Then $y = 2$ works.", ["Let $x = 3.5$.", " Then $y = 2$ works."]),
        ("We get $a. b$ here. Next step.", ["We get $a. b$ here.", " Next step."]),
        # a period ending the math content ends the sentence
        ("So $r = 3.$  Also, done.", ["So $r = 3.$", "  Also, done."]),
        ("Sum: $$a = 1. b = 2.$$ Then stop.", ["Sum: $$a = 1. b = 2.$$", " Then stop."]),
        ("Take \\(a. b\\) now. Ok.", ["Take \\(a. b\\) now.", " Ok."]),
        # newlines cut, but not inside display math; a blank-line run stays with the line before it
        ("Thus\n\\[x = 1.\ny = 2\\]\nDone.", ["Thus\n", "\\[x = 1.\ny = 2\\]\n", "Done."]),
        ("One.\n\n\nTwo.", ["One.\n\n\n", "Two."]),
        (
            "Hence\n\\begin{align}\na &= b. \\\\\nc &= d.\n\\end{align}\nEnd.",
            ["Hence\n", "\\begin{align}\na &= b. \\\\\nc &= d.\n\\end{align}\n", "End."],
        ),
        # nested environment of the same name
        (
            "A \\begin{array}{c} \\begin{array}{c} x. y \\end{array}\n. z \\end{array} B. C",
            ["A \\begin{array}{c} \\begin{array}{c} x. y \\end{array}\n. z \\end{array} B.", " C"],
        ),
        # escaped dollars are not delimiters
        ("It costs \\$5. Then \\$6 more. Done.", ["It costs \\$5.", " Then \\$6 more.", " Done."]),
        # ...while unescaped ones are: "$5. Then it costs $" is read as inline math
        ("It costs $5. Then it costs $6. Done.", ["It costs $5. Then it costs $6.", " Done."]),
        # an unclosed "$" is ordinary text
        ("We have $x = 1. Then y. Done", ["We have $x = 1.", " Then y.", " Done"]),
        # inline math does not cross a blank line, so "$x = 1.\n\nThen $" is not a span
        ("Let $x = 1.\n\nThen $y$ is 2. End.", ["Let $x = 1.\n\n", "Then $y$ is 2.", " End."]),
        ("Unclosed \\[ a. b and \\( c. d", ["Unclosed \\[ a.", " b and \\( c.", " d"]),
        ("An \\begin{align} never. ends", ["An \\begin{align} never.", " ends"]),
        # abbreviations and sentence-final punctuation variants
        ("Use e.g. the sum. Then stop.", ["Use e.g. the sum.", " Then stop."]),
        ("Why? Because! (It is.) Yes", ["Why?", " Because!", " (It is.)", " Yes"]),
        ("Decimals 3.14 and 2.5 stay.", ["Decimals 3.14 and 2.5 stay."]),
        ("", []),
        ("   ", ["   "]),
    ],
)
def test_math_natural_boundaries(text, expected):
    steps = raw_math()(text)
    assert steps == expected
    assert "".join(steps) == text


def test_math_short_parts_merge_forward_and_last_backward():
    seg = MathSegmenter(min_part_length=5)
    text = "So.\nThe answer is 5.\nThe end is near.\nOk."
    # "So.\n" (3 chars) joins the next part; "Ok." (2 chars) is last and joins the previous one
    assert seg(text) == ["So.\nThe answer is 5.\n", "The end is near.\nOk."]
    # everything short: one step
    assert MathSegmenter(min_part_length=50)(text) == [text]


def test_math_lead_in_joins_its_formula():
    text = "First, note this fact.\nTherefore,\n\\[x = 1.\\]"
    assert MathSegmenter(min_part_length=12)(text) == ["First, note this fact.\n", "Therefore,\n\\[x = 1.\\]"]


def test_math_long_prose_resplit_at_commas():
    # 117 characters, one sentence; comma cuts (right after each comma) at 50 and 94
    text = (
        "First we note that the sum of digits is even here, "
        "then we check the parity of the last digit, "
        "so the number is even."
    )
    assert len(text) == 117
    steps = raw_math()(text)
    # two pieces are enough (117 <= 2 * 100); the candidate nearest the even split (58.5) is 50
    assert steps == [
        "First we note that the sum of digits is even here,",
        " then we check the parity of the last digit, so the number is even.",
    ]


def test_math_long_prose_resplit_at_and_when_no_comma():
    text = "The first number is large " * 3 + "and the second number is small " * 2 + "and so on"
    steps = MathSegmenter(max_part_length=60, min_part_length=4)(text)
    assert "".join(steps) == text
    # no comma, colon or semicolon: the only level-2 candidates are before " and"
    # 149 chars, cut candidates before " and" at 77, 108, 139; three pieces of <= 60 would be ideal
    # (target 49.7) but no candidate fits, so the first is the nearest (77); the remaining 72 chars
    # need two pieces (target 113): 108; the last 41 chars fit.
    assert len(text) == 149
    assert steps == [
        "The first number is large The first number is large The first number is large",
        " and the second number is small",
        " and the second number is small and so on",
    ]


def test_math_long_display_split_at_top_level_equals():
    text = "\\[aaaa + bbbb = cccc + dddd = eeee\\]"
    steps = MathSegmenter(max_part_length=20, min_part_length=4)(text)
    assert steps == ["\\[aaaa + bbbb", " = cccc + dddd", " = eeee\\]"]


def test_math_long_display_falls_back_to_plus():
    text = "$$aaaa + bbbb + cccc + dddd$$"
    steps = MathSegmenter(max_part_length=12, min_part_length=4)(text)
    assert steps == ["$$aaaa", " + bbbb", " + cccc", " + dddd$$"]


def test_math_never_cuts_inside_braces_left_right_or_inline():
    seg = MathSegmenter(max_part_length=10, min_part_length=2)
    # "=" inside \frac{..}{..} or \left(..\right) is not top level; the only cut is before " = d"
    assert seg("\\[\\frac{a=b}{c+e} = d\\]") == ["\\[\\frac{a=b}{c+e}", " = d\\]"]
    assert seg("\\[\\left( a = b + c \\right) = d\\]") == ["\\[\\left( a = b + c \\right)", " = d\\]"]
    # inline math is never cut, even when far too long
    inline = "$aaaa + bbbb = cccc + dddd = eeee$"
    assert seg(inline) == [inline]


def test_math_align_rows():
    text = "\\begin{align*}\naa &= bb \\\\\ncc &= dd \\\\\nee &= ff\n\\end{align*}"
    steps = MathSegmenter(max_part_length=30, min_part_length=4)(text)
    assert "".join(steps) == text
    # rows end after "\\" and its newline; nothing is cut inside a row at this limit
    assert steps == ["\\begin{align*}\naa &= bb \\\\\n", "cc &= dd \\\\\n", "ee &= ff\n\\end{align*}"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # display math ending a sentence runs straight into the next word (MATH writes "\\]This")
        (
            "We get\n\\[x + y = 25.\\]This simplifies to $x = 5$, so we are done.",
            ["We get\n", "\\[x + y = 25.\\]", "This simplifies to $x = 5$, so we are done."],
        ),
        (
            "Thus $$\\frac{a}{b} = 5.$$Multiplying both sides by $b$ gives $a = 5b$.",
            ["Thus $$\\frac{a}{b} = 5.$$", "Multiplying both sides by $b$ gives $a = 5b$."],
        ),
        # the period may sit on the line before the closer, and an environment is display math too
        (
            "So \\[\\binom{8}{3} = 56.\n\\]Eight of these are bad.",
            ["So \\[\\binom{8}{3} = 56.\n\\]", "Eight of these are bad."],
        ),
        (
            "\\begin{align*}\na &= 1.\n\\end{align*}In total there are $2$.",
            ["\\begin{align*}\na &= 1.\n\\end{align*}", "In total there are $2$."],
        ),
    ],
)
def test_math_display_sentence_end_without_space(text, expected):
    steps = MathSegmenter(min_part_length=0)(text)
    assert steps == expected
    assert "".join(steps) == text


def test_math_display_sentence_end_with_default_merging():
    # "We get\n" is short, so it joins the formula; the cut after "25.\\]" stays
    text = "We get\n\\[x + y = 25.\\]This simplifies to $x = 5$, so we are done."
    assert MathSegmenter()(text) == [
        "We get\n\\[x + y = 25.\\]",
        "This simplifies to $x = 5$, so we are done.",
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # inline math needs a space after it, as a prose period does
        ("So $x = 3.$Then it is done.", ["So $x = 3.$Then it is done."]),
        # closing brackets after the math stay with the sentence they close
        ("(Note that $r \\neq s.$)  This leads to it.", ["(Note that $r \\neq s.$)", "  This leads to it."]),
        # a closer right before a newline is never pushed into the next step
        ("(see \\[x = 1.\\])\nNext line.", ["(see \\[x = 1.\\])\n", "Next line."]),
    ],
)
def test_math_sentence_end_inside_math_edge_cases(text, expected):
    assert MathSegmenter(min_part_length=0)(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # "," and "+" inside f(..) and g(..) are not top level; only " + g" is
        ("\\[f(aaaa + bbbb, cccc) + g(dddd, eeee)\\]", ["\\[f(aaaa + bbbb, cccc)", " + g(dddd, eeee)\\]"]),
        # half-open intervals: "(" and "[" close each other's kind
        (
            "\\[x \\in [0, 1) \\cup (2, 3] = [0, 3] - [1, 2]\\]",
            ["\\[x \\in [0, 1) \\cup (2, 3]", " = [0, 3] - [1, 2]\\]"],
        ),
        # the "(" of "\\left(" and the ")" of "\\right)" are not counted again
        ("\\[(\\left( aaaa \\right) + bbbb) + cccc\\]", ["\\[(\\left( aaaa \\right) + bbbb)", " + cccc\\]"]),
        (
            "\\[\\left\\{ aaaa, bbbb \\right. + cccc, dddd\\]",
            ["\\[\\left\\{ aaaa, bbbb \\right.", " + cccc, dddd\\]"],
        ),
    ],
)
def test_math_long_display_never_cut_inside_brackets(text, expected):
    steps = MathSegmenter(max_part_length=20, min_part_length=4)(text)
    assert steps == expected


def test_math_rows_of_aligned_inside_display_are_cut_but_matrices_are_not():
    text = "\\[\\begin{aligned} aaaa &= bbbb \\\\ cccc &= dddd \\\\ eeee &= ffff \\end{aligned}\\]"
    steps = MathSegmenter(max_part_length=40, min_part_length=4)(text)
    assert steps == [
        "\\[\\begin{aligned} aaaa &= bbbb \\\\",
        " cccc &= dddd \\\\",
        " eeee &= ffff \\end{aligned}\\]",
    ]
    matrix = "\\[\\begin{pmatrix} aaaa \\\\ bbbb \\end{pmatrix} = \\begin{pmatrix} cccc \\\\ dddd \\end{pmatrix}\\]"
    assert MathSegmenter(max_part_length=20, min_part_length=4)(matrix) == [
        "\\[\\begin{pmatrix} aaaa \\\\ bbbb \\end{pmatrix}",
        " = \\begin{pmatrix} cccc \\\\ dddd \\end{pmatrix}\\]",
    ]


def test_math_max_steps():
    text = "One. Two. Three. Four."
    assert raw_math(max_steps=2)(text) == ["One.", " Two. Three. Four."]
    assert len(raw_math()(text)) == 4


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"max_part_length": 0}, "max_part_length"),
        ({"max_part_length": 2.5}, "max_part_length"),
        ({"min_part_length": -1}, "min_part_length"),
        ({"max_part_length": 10, "min_part_length": 11}, "min_part_length"),
    ],
)
def test_math_validation(kwargs, name):
    with pytest.raises(ValueError, match=name):
        MathSegmenter(**kwargs)


def test_segmenters_reject_non_strings():
    with pytest.raises(TypeError, match="str"):
        MathSegmenter()(None)
    with pytest.raises(TypeError, match="str"):
        GSM8KSegmenter()(b"a\nb")


def _random_latex(rng: random.Random) -> str:
    atoms = [
        "$", "$$", "\\$", "\\(", "\\)", "\\[", "\\]", "\\begin{align}", "\\end{align}", "\\begin{x}",
        "{", "}", "\\\\", "\\left(", "\\right)", "=", "+", ",", ":", ";", ".", ". ", "! ", "? ", " and ",
        "\n", "\n\n", " ", "  ", "x", "word", "3.5", "e.g.", "\\frac{1}{2}", "&", "é", "😀", "\\",
    ]  # fmt: skip
    return "".join(rng.choice(atoms) for _ in range(rng.randint(0, 80)))


@pytest.mark.parametrize("seed", range(4))
def test_math_fuzz_never_loses_text(seed):
    rng = random.Random(seed)
    segs = [MathSegmenter(), MathSegmenter(max_part_length=15, min_part_length=3), raw_math(max_steps=3)]
    for _ in range(400):
        text = _random_latex(rng)
        for seg in segs:
            steps = seg(text)
            assert "".join(steps) == text
            assert all(steps)  # no empty steps
            if seg.max_steps is not None:
                assert len(steps) <= seg.max_steps
        for seg in (GSM8KSegmenter(), NewlineSegmenter(max_steps=2)):
            steps = seg(text)
            assert "".join(steps) == text and all(steps)


# --------------------------------------------------------------------------------------------------
# get_segmenter
# --------------------------------------------------------------------------------------------------


def test_get_segmenter_names_and_instances():
    assert isinstance(get_segmenter("gsm8k"), GSM8KSegmenter)
    assert isinstance(get_segmenter(" MATH "), MathSegmenter)
    assert isinstance(get_segmenter("Newline"), NewlineSegmenter)
    assert get_segmenter("gsm8k", max_steps=3).max_steps == 3
    seg = MathSegmenter(max_part_length=50)
    assert get_segmenter(seg) is seg
    assert isinstance(GSM8KSegmenter(), StepSegmenter)
    assert isinstance(MathSegmenter(), StepSegmenter)


def test_get_segmenter_errors():
    with pytest.raises(ValueError, match=r"unknown segmenter 'latex'.*\['gsm8k', 'math', 'newline'\]"):
        get_segmenter("latex")
    with pytest.raises(TypeError, match="callable"):
        get_segmenter(42)
    with pytest.raises(ValueError, match="only apply to a segmenter name"):
        get_segmenter(MathSegmenter(), max_steps=2)


def test_get_segmenter_wraps_callables():
    def sentences(text: str) -> list[str]:
        return [p for p in text.split("|")]  # drops the separators: loses text when there is one

    seg = get_segmenter(sentences)
    assert seg("abc") == ["abc"]
    with pytest.raises(ValueError, match=r"segmenter .*sentences lost or changed text"):
        seg("a|b")
    lam = get_segmenter(lambda t: [t[:1], t[1:]])
    assert lam("xy") == ["x", "y"]
    with pytest.raises(ValueError, match="must return a list of strings"):
        get_segmenter(lambda t: t)("xy")
    with pytest.raises(ValueError, match="non-string step"):
        get_segmenter(lambda t: [t, 1])("xy")


def test_import_is_light():
    code = (
        "import sys, mcadvantage.tasks.segmentation, mcadvantage;"
        "mcadvantage.MathSegmenter; mcadvantage.step_token_boundaries;"
        "bad = [m for m in ('trl', 'vllm', 'torch', 'transformers') if m in sys.modules];"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# --------------------------------------------------------------------------------------------------
# Token alignment: tokenizers built offline
# --------------------------------------------------------------------------------------------------


def _byte_map() -> dict[str, int]:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return {ch: b for b, ch in bytes_to_unicode().items()}


def _wrap(backend, **specials):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=backend, **specials)


@pytest.fixture(scope="module")
def handmade_byte_bpe():
    """A GPT-2 style byte-level BPE with a hand-written vocabulary: merges "a b", ". Ġ", "Ġ c",
    "Ġc d", "c d" and the first two bytes of U+1F600 ("ð Ł")."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    merges = [("a", "b"), (".", "Ġ"), ("Ġ", "c"), ("Ġc", "d"), ("c", "d"), ("ð", "Ł")]
    vocab = {"<|endoftext|>": 0}
    for tok in alphabet + ["".join(m) for m in merges]:
        vocab.setdefault(tok, len(vocab))
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    # use_regex=False: no GPT-2 word splitting, so merges may cross word boundaries (". " -> ".Ġ")
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    return _wrap(backend, eos_token="<|endoftext|>")


@pytest.fixture(scope="module")
def handmade_metaspace():
    """A SentencePiece-style Unigram (Metaspace, prepend_scheme="first") with a tiny vocabulary."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = [("<unk>", 0.0), ("</s>", 0.0), ("▁", -2.0)]
    vocab += [(c, -3.0) for c in "abcd."] + [("▁ab", -1.0), ("▁cd", -1.0), ("cd", -1.5), (".▁", -1.2)]
    backend = Tokenizer(models.Unigram(vocab, unk_id=0))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    backend.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    return _wrap(backend, unk_token="<unk>", eos_token="</s>")


def _ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def test_char_tokenizer_boundaries(char_tokenizer):
    ids = _ids(char_tokenizer, "ab\ncd")
    assert len(ids) == 5
    assert step_token_boundaries(char_tokenizer, ids, ["ab\n", "cd"]) == [0, 3, 5]
    eos = char_tokenizer.eos_token_id
    # EOS (no text) belongs to the last step
    assert step_token_boundaries(char_tokenizer, [*ids, eos], ["ab\n", "cd"]) == [0, 3, 6]
    # an empty step owns no token and disappears
    assert step_token_boundaries(char_tokenizer, ids, ["ab\n", "", "cd"]) == [0, 3, 5]
    assert step_token_boundaries(char_tokenizer, ids, ["ab\ncd"]) == [0, 5]
    assert step_token_boundaries(char_tokenizer, [], ["ab"]) == [0]
    assert step_token_boundaries(char_tokenizer, [], []) == [0]
    assert step_token_boundaries(char_tokenizer, ids, []) == [0, 5]
    assert step_token_boundaries(char_tokenizer, ids, ["a", "b", "\n", "c", "d"]) == [0, 1, 2, 3, 4, 5]


def test_byte_bpe_straddling_and_split_characters(handmade_byte_bpe):
    tok = handmade_byte_bpe
    ids = _ids(tok, "ab. cd")
    assert tok.convert_ids_to_tokens(ids) == ["ab", ".Ġ", "cd"]
    # ".Ġ" straddles the cut after "."; it starts in step 0, "cd" starts step 1
    assert step_token_boundaries(tok, ids, ["ab.", " cd"]) == [0, 2, 3]
    # a step whose only characters sit inside a token started earlier owns nothing: merged
    assert step_token_boundaries(tok, ids, ["ab", ".", " cd"]) == [0, 1, 2, 3]
    assert step_token_boundaries(tok, ids, ["ab.", " ", "cd"]) == [0, 2, 3]

    # U+1F600 is 4 bytes: tokens "ðŁ" (2 bytes) + 2 single bytes; the emoji is one character
    ids = _ids(tok, "x\U0001f600y")
    assert tok.convert_ids_to_tokens(ids) == ["x", "ðŁ", "ĺ", "Ģ", "y"]
    offsets, text = token_char_offsets(tok, ids)
    assert text == "x\U0001f600y"
    assert offsets == [0, 1, 1, 1, 2]
    assert step_token_boundaries(tok, ids, ["x", "\U0001f600y"]) == [0, 1, 5]
    assert step_token_boundaries(tok, ids, ["x\U0001f600", "y"]) == [0, 4, 5]
    eos = tok.eos_token_id
    assert step_token_boundaries(tok, [*ids, eos], ["x\U0001f600", "y"]) == [0, 4, 6]


def test_byte_bpe_truncated_character_never_raises(handmade_byte_bpe):
    tok = handmade_byte_bpe
    ids = _ids(tok, "ab\U0001f600")[:-1]  # generation stopped mid-character
    text = tok.decode(ids, skip_special_tokens=True)
    assert text == "ab\ufffd"
    # the decoded text ends with a replacement character the pieces do not have: aligned, clamped
    assert step_token_boundaries(tok, ids, ["ab", "\ufffd"]) == [0, 1, 3]
    # the partial character has no text: it stays with "ab" (step "b" owns no token, so merged)
    assert tok.convert_ids_to_tokens(ids) == ["ab", "ðŁ", "ĺ"]
    assert segment_completion(lambda t: [t[:1], t[1:]], tok, ids) == [0, 3]
    assert segment_completion(lambda t: [t], tok, ids) == [0, 3]


def test_metaspace_boundaries(handmade_metaspace):
    tok = handmade_metaspace
    ids = _ids(tok, "ab. cd")
    assert tok.convert_ids_to_tokens(ids) == ["▁ab", ".▁", "cd"]
    assert tok.decode(ids) == "ab. cd"  # the prepended "▁" of the first token decodes to nothing
    assert token_char_offsets(tok, ids) == ([0, 2, 4], "ab. cd")
    assert step_token_boundaries(tok, ids, ["ab.", " cd"]) == [0, 2, 3]
    assert step_token_boundaries(tok, ids, ["a", "b. cd"]) == [0, 1, 3]  # "▁ab" starts with "a"
    ids = _ids(tok, "ab cd")
    assert tok.convert_ids_to_tokens(ids) == ["▁ab", "▁cd"]
    assert step_token_boundaries(tok, ids, ["ab", " cd"]) == [0, 1, 2]
    assert step_token_boundaries(tok, ids, ["ab ", "cd"]) == [0, 2]  # "▁cd" starts in step 0


def test_decode_that_changes_spaces():
    """A word-level tokenizer whose decode re-spaces the text: the given steps (of the original
    text) are aligned to the decoded pieces instead of raising."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {"[UNK]": 0, "hello": 1, "world": 2, ".": 3, "again": 4}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.decoder = decoders.WordPiece(cleanup=True)
    tok = _wrap(backend, unk_token="[UNK]")
    original = "hello   world .\nagain"
    ids = _ids(tok, original)
    assert tok.decode(ids) == "hello world. again"  # spaces added, removed and changed
    assert step_token_boundaries(tok, ids, ["hello   ", "world .\n", "again"]) == [0, 1, 3, 4]
    assert step_token_boundaries(tok, ids, ["hello   world ", ".\nagain"]) == [0, 2, 4]


def test_offsets_alternative(char_tokenizer):
    text = "ab\ncd"
    enc = char_tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, mapping = enc["input_ids"], enc["offset_mapping"]
    assert step_token_boundaries(None, ids, ["ab\n", "cd"], offsets=mapping) == [0, 3, 5]
    starts = [s for s, _ in mapping]
    assert step_token_boundaries(None, ids, ["ab\n", "cd"], offsets=starts) == [0, 3, 5]
    # a trailing special token reported at (0, 0) stays with the token before it
    eos = char_tokenizer.eos_token_id
    assert step_token_boundaries(None, [*ids, eos], ["ab\n", "cd"], offsets=[*mapping, (0, 0)]) == [0, 3, 6]
    with pytest.raises(ValueError, match="offsets has 2 entries but token_ids has 5"):
        step_token_boundaries(None, ids, ["ab\n", "cd"], offsets=[0, 1])
    with pytest.raises(ValueError, match="needs a tokenizer"):
        step_token_boundaries(None, ids, ["ab\n", "cd"])


def test_segment_completion(char_tokenizer):
    text = "x = 1\ny = 2\n#### 2"
    ids = [*_ids(char_tokenizer, text), char_tokenizer.eos_token_id]
    assert segment_completion("gsm8k", char_tokenizer, ids) == [0, 6, len(ids)]
    assert segment_completion(GSM8KSegmenter(max_steps=1), char_tokenizer, ids) == [0, len(ids)]
    assert segment_completion("newline", char_tokenizer, []) == [0]


# --------------------------------------------------------------------------------------------------
# Token alignment: property checks with trained tokenizers
# --------------------------------------------------------------------------------------------------

_WORDS = (
    "the sum of digits is even so we check parity then add multiply divide total apples "
    "Natalia sold clips in May half of $x$ \\frac{1}{2} \\sqrt{3} = + - answer boxed"
).split()
_EXOTIC = ["é", "ü", "ñ", "中文", "数学", "😀", "🎉", "π", "≤", "—", "’"]


def _corpus_line(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randint(3, 14)):
        r = rng.random()
        if r < 0.6:
            parts.append(rng.choice(_WORDS))
        elif r < 0.8:
            parts.append(str(rng.randint(0, 9999)))
        else:
            parts.append(rng.choice(_EXOTIC) * rng.randint(1, 2))
    sep = rng.choice([" ", " ", " ", ", ", ". ", "\n", "  "])
    return sep.join(parts) + rng.choice([".", "\n", "", ".\n#### 5"])


@pytest.fixture(scope="module")
def corpus():
    rng = random.Random(0)
    return [_corpus_line(rng) for _ in range(400)]


@pytest.fixture(scope="module")
def trained_byte_bpe(corpus):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=500, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    backend.train_from_iterator(corpus, trainer=trainer)
    return _wrap(backend, eos_token="<|endoftext|>")


@pytest.fixture(scope="module")
def trained_metaspace(corpus):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    backend = Tokenizer(models.BPE(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    backend.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    trainer = trainers.BpeTrainer(vocab_size=500, special_tokens=["<unk>", "</s>"])
    backend.train_from_iterator(corpus, trainer=trainer)
    return _wrap(backend, unk_token="<unk>", eos_token="</s>")


def _byte_level_reference(tok, ids, text):
    """Exact start character of each token from its bytes (independent of decoding)."""
    byte_map = _byte_map()
    char_of_byte = []
    for k, ch in enumerate(text):
        char_of_byte.extend([k] * len(ch.encode("utf-8")))
    out, pos = [], 0
    for piece in tok.convert_ids_to_tokens(ids):
        out.append(char_of_byte[pos] if pos < len(char_of_byte) else len(text))
        pos += len(bytes(byte_map[c] for c in piece))
    assert pos == len(char_of_byte)
    return out


def _expected_bounds(starts, steps, total):
    """Definition: a token belongs to the step containing its first character (len(text) -> last)."""
    ends, acc = [], 0
    for s in steps:
        acc += len(s)
        ends.append(acc)
    owner = [min(sum(1 for e in ends if e <= c), len(steps) - 1) for c in starts]
    bounds = [0] + [t for t in range(1, total) if owner[t] != owner[t - 1]]
    return bounds + [total]


def _random_steps(rng, text):
    cuts = (
        sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 8))))
        if len(text) > 1
        else []
    )
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


@pytest.mark.parametrize("kind", ["char", "byte_bpe", "metaspace"])
def test_alignment_properties(kind, char_tokenizer, trained_byte_bpe, trained_metaspace, corpus):
    rng = random.Random(1)
    tok = {"char": char_tokenizer, "byte_bpe": trained_byte_bpe, "metaspace": trained_metaspace}[kind]
    texts = [_corpus_line(rng) + _corpus_line(rng) for _ in range(150)]
    if kind == "char":  # the char tokenizer only knows printable ASCII
        texts = ["".join(c for c in t if c.isascii()) for t in texts]
    else:
        texts = [t.lstrip(" ") for t in texts]  # Metaspace "first" cannot round-trip a leading space
    straddling = 0
    for text in texts:
        if not text:
            continue
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        ids = enc["input_ids"]
        if kind == "byte_bpe":
            reference = _byte_level_reference(tok, ids, text)
        elif kind == "metaspace":
            reference = [s for s, _ in enc["offset_mapping"]]
        else:
            reference = list(range(len(ids)))
        offsets, decoded = token_char_offsets(tok, ids)
        assert decoded == text == tok.decode(ids, skip_special_tokens=True)
        assert offsets == reference
        for _ in range(5):
            steps = _random_steps(rng, text)
            bounds = step_token_boundaries(tok, ids, steps)
            assert bounds == _expected_bounds(reference, steps, len(ids))
            assert all(a < b for a, b in zip(bounds, bounds[1:], strict=False))
            assert bounds[0] == 0 and bounds[-1] == len(ids)
            with_eos = step_token_boundaries(tok, [*ids, tok.eos_token_id], steps)
            assert with_eos == [*bounds[:-1], len(ids) + 1]
            ends = {sum(map(len, steps[: k + 1])) for k in range(len(steps))}
            straddling += sum(
                1 for t in range(len(ids) - 1) if any(reference[t] < e < reference[t + 1] for e in ends)
            )
    if kind != "char":
        assert straddling > 50  # the random cuts really do fall inside multi-character tokens


@pytest.mark.parametrize("seed", range(3))
def test_alignment_never_raises_on_mismatched_steps(
    seed, trained_byte_bpe, trained_metaspace, char_tokenizer
):
    rng = random.Random(seed)
    for tok in (trained_byte_bpe, trained_metaspace, char_tokenizer):
        for _ in range(60):
            ids = [rng.randrange(len(tok)) for _ in range(rng.randint(0, 40))]
            other = _corpus_line(rng)  # steps of an unrelated text
            steps = _random_steps(rng, other) if other else []
            bounds = step_token_boundaries(tok, ids, steps)
            assert bounds[0] == 0 and bounds[-1] == len(ids)
            assert all(a < b for a, b in zip(bounds, bounds[1:], strict=False))
            assert len(bounds) <= max(len(steps), 1) + 1
