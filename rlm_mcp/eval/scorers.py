"""Scorers: (answer, gold, metadata) -> a score in [0, 1]. Pure functions, no I/O.

Every formula and its source is in docs/evaluation.md; keep the two in step.
A missing answer (None) scores 0 under every scorer. The `judge` scorer needs a model and
lives in `rlm_mcp.eval.judge`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from datetime import date, datetime
from typing import Any

Gold = str | int | float | list[Any]
Scorer = Callable[[str | None, Gold, Mapping[str, Any]], float]

COMPARISON_PHRASES = ("more common", "less common", "same frequency")


def _as_list(gold: Gold) -> list[Any]:
    return gold if isinstance(gold, list) else [gold]


_WHITESPACE = re.compile(r"\s+")


def _squeeze(text: str) -> str:
    """Each whitespace run as one character (a newline when it holds one, else a space), in
    linear time. The patterns below place `\\s*` next to other whitespace-matching parts, which
    backtracks quadratically (or worse) over a long run: small models emit such runs, and a 1 MB
    answer took hours. Squeezed, every run is one character long."""
    return _WHITESPACE.sub(lambda m: "\n" if "\n" in m.group() else " ", text)


def _trim(text: str) -> str:
    text = text.strip()
    return text[:-1].rstrip() if text.endswith(".") else text


def score_exact(answer: str | None, gold: Gold, metadata: Mapping[str, Any]) -> float:
    """1 when the answer equals the gold (or one of a list of golds) after trimming whitespace and
    one trailing period; case-sensitive."""
    if answer is None:
        return 0.0
    mine = _trim(answer)
    return float(any(mine == _trim(str(g)) for g in _as_list(gold)))


def score_contains(answer: str | None, gold: Gold, metadata: Mapping[str, Any]) -> float:
    """1 when the gold (or one of a list of golds) appears in the answer, case-insensitively."""
    if answer is None:
        return 0.0
    mine = answer.casefold()
    return float(any(str(g).strip().casefold() in mine for g in _as_list(gold) if str(g).strip()))


# --- OOLONG (abertsch72/oolong: src/eval/eval_helpers.py, synth_process_response) ----------


def oolong_parse(answer: str) -> str:
    """The candidate answer as OOLONG reads it: the text after the last ':', with `*`, `[` and `]`
    removed; without a ':', the whole (short) reply or its last word; long candidates that
    contain a comparison phrase become that phrase."""
    if ":" not in answer:
        return answer.strip() if len(answer) < 20 else (answer.split() or [""])[-1]
    candidate = answer.split(":")[-1].strip()
    for char in "*[]":
        candidate = candidate.replace(char, "")
    if len(candidate) >= 20:
        for phrase in COMPARISON_PHRASES:
            if phrase in candidate:
                return phrase
    return candidate


_DATE_FORMATS = ("%Y-%m-%d", "%b %d, %Y", "%B %d, %Y", "%m/%d/%Y", "%d %B %Y", "%d %b %Y", "%Y/%m/%d")


def parse_date(text: str) -> date | None:
    """A calendar date in the common written forms (the subset of dateutil's parsing OOLONG's
    answers use), else None."""
    cleaned = text.strip().rstrip(".")
    for fmt in _DATE_FORMATS:
        try:
            return datetime.strptime(cleaned, fmt).date()
        except ValueError:
            continue
    return None


def _oolong_kind(gold: Any, metadata: Mapping[str, Any]) -> str:
    kind = str(metadata.get("answer_type", "")).upper().removeprefix("ANSWER_TYPE.")
    if kind:
        return kind
    if isinstance(gold, int | float) and not isinstance(gold, bool):
        return "NUMERIC"
    if isinstance(gold, str) and re.fullmatch(r"\d{4}-\d{2}-\d{2}", gold.strip()):
        return "DATE"
    return "LABEL"


def score_oolong(answer: str | None, gold: Gold, metadata: Mapping[str, Any]) -> float:
    """OOLONG's rule: exact match of the parsed answer scores 1; a comparison phrase scores 1 when
    the gold contains it; numeric answers score 0.75 ** |gold - pred| (integers, as OOLONG's
    int() parse); dates score 1 when both parse to the same day."""
    if answer is None:
        return 0.0
    gold_value = _as_list(gold)[0] if isinstance(gold, list) and gold else gold
    parsed = oolong_parse(answer)
    if parsed == str(gold_value):
        return 1.0
    if parsed in COMPARISON_PHRASES:
        return float(parsed in str(gold_value))
    kind = _oolong_kind(gold_value, metadata)
    if kind == "NUMERIC":
        try:
            return 0.75 ** abs(int(str(gold_value).strip()) - int(parsed))
        except ValueError:
            return 0.0
    if kind == "DATE":
        mine, theirs = parse_date(parsed), parse_date(str(gold_value))
        return float(mine is not None and mine == theirs)
    return 0.0


def score_oolong_lenient(answer: str | None, gold: Gold, metadata: Mapping[str, Any]) -> float:
    """The reference's training reward for OOLONG (alexzhang13/rlm: training/environments/oolong,
    `_synth_score`), as we read it: OOLONG's score, raised to 1 when the parsed answer equals the
    gold case-insensitively or the gold text appears anywhere in the reply (case-insensitive)."""
    if answer is None:
        return 0.0
    strict = score_oolong(answer, gold, metadata)
    gold_text = str(_as_list(gold)[0] if isinstance(gold, list) and gold else gold).strip().casefold()
    if not gold_text:
        return strict
    if oolong_parse(answer).strip().casefold() == gold_text or gold_text in answer.casefold():
        return 1.0
    return strict


# --- OOLONG-Pairs -----------------------------------------------------------------------------

_PAIR = re.compile(r"\(\s*([^(),\n]+?)\s*,\s*([^(),\n]+?)\s*\)")


def _norm_item(item: Any) -> str:
    return _squeeze(str(item)).strip().strip("'\"").strip()  # gold items as answers are read


def parse_pairs(text: str) -> set[frozenset[str]]:
    """Unordered pairs written as `(a, b)` anywhere in the text (quotes around items ignored)."""
    return {frozenset((_norm_item(a), _norm_item(b))) for a, b in _PAIR.findall(_squeeze(text))}


def gold_pairs(gold: Gold) -> set[frozenset[str]]:
    if isinstance(gold, str):
        return parse_pairs(gold)
    found: set[frozenset[str]] = set()
    for pair in _as_list(gold):
        if isinstance(pair, list | tuple) and len(pair) == 2:
            found.add(frozenset((_norm_item(pair[0]), _norm_item(pair[1]))))
        elif isinstance(pair, str):
            found |= parse_pairs(pair)
    return found


def score_pairs_f1(answer: str | None, gold: Gold, metadata: Mapping[str, Any]) -> float:
    """F1 = 2PR / (P + R) over unordered pairs (precision P, recall R); an empty gold and an
    empty prediction score 1, one empty side scores 0."""
    if answer is None:
        return 0.0
    predicted, expected = parse_pairs(answer), gold_pairs(gold)
    if not predicted and not expected:
        return 1.0
    hits = len(predicted & expected)
    if hits == 0:
        return 0.0
    precision, recall = hits / len(predicted), hits / len(expected)
    return 2 * precision * recall / (precision + recall)


# --- multiple choice (LongBench-v2) -------------------------------------------------------------

_CHOICE_PATTERNS = (
    re.compile(r"^\s*\(?([A-D])\)?\s*[.:)]?\s*$", re.IGNORECASE),  # the whole answer is a letter
    re.compile(r"answer is[:\s]*\(?\s*([A-D])\s*\)?", re.IGNORECASE),  # LongBench-v2's own phrasing
    re.compile(r"(?:answer|choice|option)\s*[:=]\s*\(?\s*([A-D])\b\)?", re.IGNORECASE),
)


def choice_letter(answer: str) -> str | None:
    """The letter A-D the answer commits to: the whole answer, else the last 'answer is (X)' /
    'answer: X', else the one letter written as '(X)'; None when it names none or several."""
    answer = _squeeze(answer)
    for pattern in _CHOICE_PATTERNS:
        found = pattern.findall(answer)
        if found:
            return str(found[-1]).upper()
    bracketed = set(re.findall(r"\(([A-D])\)", answer))
    return bracketed.pop() if len(bracketed) == 1 else None


def score_choice(answer: str | None, gold: Gold, metadata: Mapping[str, Any]) -> float:
    if answer is None:
        return 0.0
    letter = choice_letter(answer)
    return float(letter is not None and letter == str(gold).strip().strip("()").upper())


SCORERS: dict[str, Scorer] = {
    "exact": score_exact,
    "contains": score_contains,
    "oolong": score_oolong,
    "pairs_f1": score_pairs_f1,
    "choice": score_choice,
}
# Scorers whose lenient twin is reported beside them: the benchmark's own score and the reference's
# training reward (score_oolong_lenient) answer different questions, so neither replaces the other.
LENIENT: dict[str, Scorer] = {"oolong": score_oolong_lenient}
SCORER_NAMES = (*SCORERS, "judge")


def score(name: str, answer: str | None, gold: Gold, metadata: Mapping[str, Any] | None = None) -> float:
    """The score of `answer` under the named (model-free) scorer."""
    return SCORERS[name](answer, gold, metadata or {})
