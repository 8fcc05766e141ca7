"""Glob patterns over relative POSIX paths, with `**`.

  *      any characters except '/'
  ?      one character except '/'
  [abc]  a character class ([!abc] negated)
  **     any characters including '/'; `**/` also matches no folder at all
  a pattern without '/' matches a file's name at any depth (as in .gitignore): `*.py`
  matches `a/b/c.py`; a pattern with '/' matches the whole relative path: `src/*.py`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache

GLOB_CHARS = frozenset("*?[")


def has_magic(text: str) -> bool:
    return any(c in GLOB_CHARS for c in text)


@lru_cache(maxsize=256)
def compile_glob(pattern: str) -> re.Pattern[str]:
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "*":
            if pattern.startswith("**", i):
                i += 2
                if i < n and pattern[i] == "/":
                    i += 1
                    out.append("(?:.*/)?")
                else:
                    out.append(".*")
                continue
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            j = pattern.find("]", i + 2)
            if j == -1:
                out.append(re.escape(c))
            else:
                body = pattern[i + 1 : j]
                if body.startswith("!"):
                    body = "^" + body[1:]
                out.append("[" + body.replace("\\", "\\\\") + "]")
                i = j
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out) + r"\Z", re.DOTALL)


def matches(pattern: str, rel: str) -> bool:
    pattern = pattern.strip().removeprefix("./")
    if "/" not in pattern.rstrip("/"):
        return compile_glob(pattern.rstrip("/")).match(rel.rsplit("/", 1)[-1]) is not None
    return compile_glob(pattern).match(rel) is not None


def any_match(patterns: Sequence[str] | None, rel: str) -> bool:
    return bool(patterns) and any(matches(p, rel) for p in patterns or ())


def prunes_folder(exclude: Sequence[str] | None, rel_dir: str) -> bool:
    """Whether an exclude pattern removes a whole folder: it matches the folder itself
    (`node_modules`, `build`) or everything under it (`build/**`)."""
    for p in exclude or ():
        p = p.strip().removeprefix("./")
        if matches(p.rstrip("/"), rel_dir):
            return True
        if p.endswith("/**") and matches(p[:-3], rel_dir):
            return True
    return False
