"""Scorers on known cases: each rule of the README's formulas, including where they say 0."""

from __future__ import annotations

import pytest

from rlm_mcp.eval.scorers import choice_letter, oolong_parse, parse_pairs, score, score_oolong_lenient


@pytest.mark.parametrize(
    ("answer", "gold", "expected"),
    [
        ("Paris", "Paris", 1.0),
        ("  Paris.\n", "Paris", 1.0),
        ("paris", "Paris", 0.0),  # case-sensitive
        ("Paris, France", "Paris", 0.0),
        ("42", 42, 1.0),
        ("b", ["a", "b"], 1.0),  # a list of golds: any of them
        (None, "Paris", 0.0),
    ],
)
def test_exact(answer: str | None, gold: object, expected: float) -> None:
    assert score("exact", answer, gold) == expected  # type: ignore[arg-type]


def test_contains_is_case_insensitive_substring() -> None:
    assert score("contains", "The code is XK-42, I think", "xk-42") == 1.0
    assert score("contains", "The code is XK-4", "xk-42") == 0.0
    assert score("contains", None, "x") == 0.0


def test_oolong_parse_follows_its_rules() -> None:
    assert oolong_parse("Label: **[abbreviation]**") == "abbreviation"
    assert oolong_parse("a: b: location") == "location"
    assert oolong_parse("entity") == "entity"  # short, no colon: the whole reply
    assert oolong_parse("I counted them all and the total is 12") == "12"  # long, no colon: last word
    assert oolong_parse("Answer: the first label is more common than the second one") == "more common"


@pytest.mark.parametrize(
    ("answer", "gold", "meta", "expected"),
    [
        ("Answer: 12", 12, {}, 1.0),
        ("Answer: 10", 12, {}, 0.75**2),
        ("Answer: 15", 12, {"answer_type": "ANSWER_TYPE.NUMERIC"}, 0.75**3),
        ("Answer: twelve", 12, {}, 0.0),
        ("Answer: 12.0", 12, {}, 0.0),  # OOLONG parses integers only
        ("Label: location", "location", {}, 1.0),
        ("Label: Location", "location", {}, 0.0),  # labels are exact
        ("Answer: description and abstract concept is more common than entity", "more common than", {}, 1.0),
        ("Answer: less common", "more common than", {}, 0.0),
        ("Date: Jan 02, 2023", "2023-01-02", {}, 1.0),
        ("Date: 2023-01-03", "2023-01-02", {"answer_type": "ANSWER_TYPE.DATE"}, 0.0),
        ("Answer: 5", [5], {}, 1.0),  # OOLONG's golds are one-element lists
        (None, 5, {}, 0.0),
    ],
)
def test_oolong(answer: str | None, gold: object, meta: dict[str, str], expected: float) -> None:
    assert score("oolong", answer, gold, meta) == pytest.approx(expected)  # type: ignore[arg-type]


def test_oolong_lenient_credits_what_the_benchmark_does_not() -> None:
    assert score("oolong", "Label: Location", "location") == 0.0
    assert score_oolong_lenient("Label: Location", "location", {}) == 1.0  # case-insensitive
    assert score_oolong_lenient("I think it is location, mostly.", "location", {}) == 1.0  # gold anywhere
    assert score_oolong_lenient("Answer: 10", 12, {}) == pytest.approx(0.75**2)  # never below strict
    assert score_oolong_lenient(None, 12, {}) == 0.0


def test_pairs_f1() -> None:
    gold = [["1", "2"], ["3", "4"], ["5", "6"]]
    assert score("pairs_f1", "(2, 1)\n(3, 4)\n(5, 6)", gold) == 1.0  # unordered
    # 2 of 4 predicted are right, 2 of 3 gold found: P=1/2, R=2/3, F1=4/7
    assert score("pairs_f1", "(1, 2)\n(3, 4)\n(1, 3)\n(7, 8)", gold) == pytest.approx(4 / 7)
    assert score("pairs_f1", "no pairs here", gold) == 0.0
    assert score("pairs_f1", "none", []) == 1.0
    assert score("pairs_f1", "(1, 2)", "(2, 1)") == 1.0  # a gold string in the same format
    assert parse_pairs("('u1', \"u2\") and (u3,u4)") == {frozenset({"u1", "u2"}), frozenset({"u3", "u4"})}


@pytest.mark.parametrize(
    ("answer", "letter"),
    [
        ("B", "B"),
        ("(c)", "C"),
        ("The correct answer is (D)", "D"),
        ("I first thought A, but the answer is B.", "B"),
        ("Answer: A", "A"),
        ("Between (A) and (B) I cannot decide", None),
        ("no idea", None),
    ],
)
def test_choice_letter(answer: str, letter: str | None) -> None:
    assert choice_letter(answer) == letter


def test_choice_scores_the_committed_letter() -> None:
    assert score("choice", "The correct answer is (B)", "B") == 1.0
    assert score("choice", "The correct answer is (B)", "(b)") == 1.0
    assert score("choice", "The correct answer is (A)", "B") == 0.0
    assert score("choice", None, "B") == 0.0
