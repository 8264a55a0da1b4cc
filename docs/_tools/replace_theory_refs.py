"""Rewrite every citation of the old shared ``THEORY.md`` into a link to ``docs/theory.md``.

Usage (from the repository root; the lead runs it once, after merging every branch)::

    python docs/_tools/replace_theory_refs.py            # rewrite in place, print a summary
    python docs/_tools/replace_theory_refs.py --check    # list what would change, exit 1 if any

It scans ``*.py`` and ``*.md`` outside ``docs/``, ``.git`` and build folders and rewrites

- ``THEORY section 3`` -> ``docs/theory.md#sde``;
- ``THEORY sections 7 and 8`` -> ``docs/theory.md#depth-width and #head-size`` (lists and ranges
  such as ``sections 4-6`` expand; a reference split over two lines or two string literals is
  handled: the link stays before the break);
- the README's ``THEORY.md`` (shared docs) and any other bare ``THEORY`` mention -> the theory
  page (``docs/theory.md``).

Identifiers such as ``_THEORY_FIELDS`` are left alone. ``tests/test_docs_refs.py`` checks
that every ``docs/theory.md#anchor`` exists and that no ``THEORY section`` text remains. Lines
of ``.py`` files that grow past the line limit are reported (ruff E501) for a hand rewrap.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = "docs/theory.md"
LINE_LIMIT = 100

# Old section number of THEORY.md -> anchor of docs/theory.md.
ANCHORS = {
    "1": "notation",
    "2": "layers",
    "3": "sde",
    "3b": "causal-sde",
    "4": "rank-collapse",
    "5": "samplers",
    "6": "checks",
    "7": "depth-width",
    "8": "head-size",
}
ORDER = ["1", "2", "3", "3b", "4", "5", "6", "7", "8"]

SKIP_DIRS = {".git", "docs", "build", "site", "dist", ".venv", "venv", "node_modules", "runs"}
NUM = r"\d+[a-z]?"
# Between "THEORY" and "section": spaces, or one line break (docstring/comment continuation, or
# the end of one string literal and the start of the next).
SEP = r"""(?P<sep>[ \t]*(?:["'][ \t]*\n[ \t]*[rbfRBF]*["']|\n[ \t]*(?:\#[ \t]*)?)?[ \t]*)"""
SECTION_REF = re.compile(
    r"(?<![\w/])THEORY(?:\.md)?`?"
    + SEP
    + rf"sections?[ \t]+(?P<list>{NUM}(?:(?:,[ \t]*|[ \t]+and[ \t]+|[ \t]*[-–][ \t]*){NUM})*)"
    + r"(?P<tail>'s)?(?P<space>[ \t]?)"
)
README_SHARED = re.compile(r"`THEORY\.md` \(shared docs\)")
BARE = re.compile(r"(?<![\w/])THEORY(?:\.md)?(?![\w])")


def expand(numbers: str) -> list[str]:
    """``"4-6"`` -> ``["4", "5", "6"]``; ``"7 and 8"`` -> ``["7", "8"]``; ``"2, 4, 5"``."""
    parts = re.split(r"(,[ \t]*|[ \t]+and[ \t]+|[ \t]*[-–][ \t]*)", numbers)
    out: list[str] = []
    i = 0
    while i < len(parts):
        token = parts[i]
        if i + 2 < len(parts) and re.fullmatch(r"[ \t]*[-–][ \t]*", parts[i + 1]):
            start, stop = ORDER.index(token), ORDER.index(parts[i + 2])
            out.extend(n for n in ORDER[start : stop + 1] if n[-1].isdigit() or n == token)
            i += 3
        else:
            out.append(token)
            i += 2
    for n in out:
        if n not in ANCHORS:
            raise KeyError(f"THEORY section {n!r} has no anchor in the mapping table")
    return out


def link(numbers: list[str]) -> str:
    anchors = [f"#{ANCHORS[n]}" for n in numbers]
    head = f"{PAGE}{anchors[0]}"
    if len(anchors) == 1:
        return head
    rest = anchors[1:]
    if len(rest) == 1:
        return f"{head} and {rest[0]}"
    return f"{head}, {', '.join(rest[:-1])} and {rest[-1]}"


def rewrite(text: str) -> tuple[str, int]:
    """The rewritten text and the number of references replaced."""
    count = 0

    def section(match: re.Match[str]) -> str:
        nonlocal count
        count += 1
        sep = match.group("sep")
        ref = link(expand(match.group("list")))
        tail = match.group("tail") or ""
        if "\n" not in sep:
            return ref + tail + match.group("space")
        # Split reference: keep the link before the break, drop the now-empty "section N"
        # (and the space after it, which would start the next line).
        return ref + sep.lstrip(" \t") + tail

    text = SECTION_REF.sub(section, text)

    def readme(_: re.Match[str]) -> str:
        nonlocal count
        count += 1
        return f"[`{PAGE}`]({PAGE})"

    text = README_SHARED.sub(readme, text)

    def bare(_: re.Match[str]) -> str:
        nonlocal count
        count += 1
        return PAGE

    text = BARE.sub(bare, text)
    return text, count


def _text_lines(source: str) -> set[int]:
    """0-based numbers of the lines that are comments or lie inside a triple-quoted string."""
    import io
    import tokenize

    lines: set[int] = set()
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT:
                lines.add(tok.start[0] - 1)
            elif tok.type == tokenize.STRING and tok.string.lstrip("rbfuRBFU")[:3] in {
                '"""',
                "'''",
            }:
                lines.update(range(tok.start[0] - 1, tok.end[0]))
    except (tokenize.TokenError, SyntaxError):
        return set()
    return lines


def rewrap(source: str, limit: int = LINE_LIMIT) -> str:
    """Push the overflowing words of long docstring/comment lines onto the next line of the
    same paragraph (or a new line), cascading; code lines are left alone."""
    lines = source.split("\n")
    for _ in range(50):
        text_lines = _text_lines("\n".join(lines))
        for i, line in enumerate(lines):
            if len(line) <= limit or i not in text_lines:
                continue
            indent = line[: len(line) - len(line.lstrip())]
            comment = line.lstrip().startswith("#")
            prefix = indent + ("# " if comment else "")
            cut = line.rfind(" ", len(prefix) + 1, limit + 1)
            if cut <= len(prefix):
                continue
            head, tail = line[:cut].rstrip(), line[cut + 1 :]
            nxt = lines[i + 1] if i + 1 < len(lines) else ""
            body = nxt[len(prefix) :]
            joinable = (
                i + 1 in text_lines
                and nxt.startswith(prefix)
                and body.strip()
                and not body.startswith((" ", "-", "*", ">>>", '"""', "'''"))
                and not (tail.endswith(('"""', "'''")))
            )
            if joinable:
                lines[i : i + 2] = [head, prefix + tail + " " + body]
            else:
                lines[i : i + 1] = [head, prefix + tail]
            break
        else:
            return "\n".join(lines)
    return "\n".join(lines)


def files(root: Path) -> list[Path]:
    found = []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if any(part in SKIP_DIRS or part.endswith(".egg-info") for part in rel.parts[:-1]):
            continue
        if path.is_file() and path.suffix in {".py", ".md"}:
            found.append(path)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="repository root")
    parser.add_argument("--check", action="store_true", help="report only, change nothing")
    args = parser.parse_args(argv)
    total = 0
    long_lines = []
    for path in files(args.root):
        if path.resolve() == Path(__file__).resolve() or path.name == "test_docs_refs.py":
            continue
        old = path.read_text()
        new, count = rewrite(old)
        if not count:
            continue
        total += count
        rel = path.relative_to(args.root)
        print(f"{rel}: {count}")
        if path.suffix == ".py":
            new = rewrap(new)
            old_long = {line for line in old.splitlines() if len(line) > LINE_LIMIT}
            for number, line in enumerate(new.splitlines(), start=1):
                if len(line) > LINE_LIMIT and line not in old_long:
                    long_lines.append(f"{rel}:{number}: {len(line)} > {LINE_LIMIT} characters")
        if not args.check:
            path.write_text(new)
    verb = "would replace" if args.check else "replaced"
    print(f"{verb} {total} references")
    if long_lines:
        print("lines now longer than the limit (rewrap by hand):")
        print("\n".join(long_lines))
    return 1 if args.check and total else 0


if __name__ == "__main__":
    sys.exit(main())
