"""The manual (README.md, docs/*.md, switch/p4/README.md) against the tree it describes.

The oracle is the repository itself: `git ls-files` (what a fresh clone holds) for every
relative link, every `path/to/file` and every `python -m module` a page names, the target
page's headings for every link anchor and every quoted section (`docs/lab.md, "Boot
panics"`, also where the code points into the manual); byte counts for the size budgets;
`benchmarks.doc_table.render` for every table of lab figures.
"""
from __future__ import annotations

import fnmatch
import re
import subprocess
from functools import cache
from pathlib import Path, PurePosixPath

import pytest

from benchmarks.doc_table import BLOCK, TABLES, render

ROOT = Path(__file__).resolve().parent.parent
README_BUDGET = 12_000     # bytes: the front page
PAGE_BUDGET = 15_600       # bytes: "~15 KB" per page of docs/ and switch/p4/README.md
DOCS_BUDGET = 165_000      # bytes: all of docs/*.md, half of the 330 KB issue 37 measured
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
PATH = re.compile(r"(?<![\w./$-])((?:\.\./)*[\w.{}*-]+(?:/[\w.{},*-]+)+/?)")
MODULE = re.compile(r"python3? -m ([\w.]+)")
SECTION = re.compile(r"(?:\]\(([^)\s#]+\.md)\)|(?<![\w/.-])((?:[\w-]+/)*[\w-]+\.md))"
                     r"(?:,|:| \(|\)\s*\(|,? section)\s*\"([^\"]+)\"")
HEADING = re.compile(r"^#{1,6}\s+(.*)$", re.M)
BOLD = re.compile(r"\*\*([^*]+)\*\*")


@cache
def tracked() -> frozenset[str]:
    """Every file a clone of HEAD holds, as POSIX paths from the root (and the working
    tree's files added since: `--others --exclude-standard`)."""
    out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "--cached", "--others",
                          "--exclude-standard"], capture_output=True, text=True, check=True)
    return frozenset(p for p in out.stdout.splitlines()
                     if (ROOT / p).exists())


@cache
def tracked_dirs() -> frozenset[str]:
    return frozenset(str(parent) for p in tracked() for parent in PurePosixPath(p).parents
                     if str(parent) != ".")


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
            ROOT / "switch" / "p4" / "README.md"]


def page_ids() -> list[str]:
    return [str(p.relative_to(ROOT)) for p in pages()]


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def normal(base: PurePosixPath, target: str) -> str | None:
    """`target` seen from directory `base` (both from the root), or None if it leaves it."""
    parts: list[str] = []
    for part in (base / target).parts:
        if part == "..":
            if not parts:
                return None
            parts.pop()
        elif part not in (".", ""):
            parts.append(part)
    return "/".join(parts)


def exists(path: str) -> bool:
    """A tracked file or directory, or a glob that matches some tracked file."""
    path = path.rstrip("/")
    if any(c in path for c in "*?["):
        return any(fnmatch.fnmatchcase(p, path) for p in tracked())
    return path in tracked() or path in tracked_dirs()


def braces(token: str) -> list[str]:
    """`a-{b,c}.json` -> ['a-b.json', 'a-c.json'] (one level, as the pages write it)."""
    m = re.search(r"\{([^{}]*)\}", token)
    if not m:
        return [token]
    return [x for alt in m[1].split(",")
            for x in braces(token[:m.start()] + alt + token[m.end():])]


def slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    text = re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def sections(page: Path) -> list[str]:
    """What a quote may name in `page`: its headings and its bold leads, as plain text."""
    text = page.read_text()
    plain = [re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", r"\1", h).strip()
             for h in HEADING.findall(text)]
    return plain + [b.strip().rstrip(".:") for b in BOLD.findall(text)]


def names_section(page: Path, quote: str) -> bool:
    quote = " ".join(quote.split())
    return any(s.startswith(quote) or quote.startswith(s) and len(s) > 3
               for s in sections(page))


def references(page: Path) -> list[str]:
    """The tree paths `page` names in its prose, code and commands, from the root: a token
    that is a file name (an extension), a directory (a trailing slash) or a whole code span,
    and whose first part is a top-level entry of the tree or of the page's own directory
    (`figures/...` in docs/), or that climbs out of it (`../`); `switch/ring`, a ratio, is
    none. A token cut by a shell variable or a placeholder (`$n`, `<dev>`) names nothing."""
    base = PurePosixPath(rel(page)).parent
    top = {PurePosixPath(p).parts[0] for p in tracked()}
    text = page.read_text()
    out = []
    for m in PATH.finditer(text):
        if text[m.end():m.end() + 1] in ("$", "<") or "..." in m[1].replace("../", ""):
            continue
        span = text[m.start() - 1:m.start()] == "`" == text[m.end():m.end() + 1]
        if not (span or m[1].endswith("/") or "." in PurePosixPath(m[1].rstrip(".,:;")).name):
            continue
        for token in braces(m[1].rstrip(".,:;")):
            first = PurePosixPath(token).parts[0]
            if first == ".." or base.parts and exists(f"{base}/{first}"):
                out.append(normal(base, token) or token)
            elif first in top:
                out.append(token)
    return out


@pytest.mark.parametrize("name", page_ids())
def test_every_relative_link_resolves_with_its_anchor(name: str) -> None:
    page = ROOT / name
    base = PurePosixPath(name).parent
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        dest = normal(base, path) if path else name
        if dest is None or not exists(dest):
            broken.append(target)
        elif anchor and dest.endswith(".md") and anchor not in {
                slug(h) for h in HEADING.findall((ROOT / dest).read_text())}:
            broken.append(target)
    assert not broken, f"{name}: links that do not resolve in the tree: {broken}"


@pytest.mark.parametrize("name", page_ids())
def test_every_path_and_module_a_page_names_is_in_the_tree(name: str) -> None:
    page = ROOT / name
    top = {PurePosixPath(p).parts[0] for p in tracked()}
    missing = [p for p in references(page) if not exists(p)]
    for module in MODULE.findall(page.read_text()):
        parts = module.split(".")
        if parts[0] in top and not any(exists(f"{'/'.join(parts)}{tail}")
                                       for tail in (".py", "/__init__.py", "/__main__.py")):
            missing.append(f"python -m {module}")
    assert not missing, f"{name} names what the tree does not hold: {missing}"


@pytest.mark.parametrize("name", page_ids())
def test_every_quoted_section_is_a_heading_of_its_page(name: str) -> None:
    page = ROOT / name
    base = PurePosixPath(name).parent
    wrong = []
    for linked, plain, quote in SECTION.findall(page.read_text()):
        # a link is relative to the page; a plain name to the page's directory, or the root
        candidates = [normal(base, linked)] if linked else [normal(base, plain), plain]
        target = next((c for c in candidates if c is not None and exists(c)), None)
        if target is None or not names_section(ROOT / target, quote):
            wrong.append(f"{linked or plain}, \"{quote}\"")
    assert not wrong, f"{name}: quoted sections that are no heading of their page: {wrong}"


def test_the_codes_pointers_into_the_manual_resolve() -> None:
    """Comments, docstrings and messages of the tree name docs pages, figures and sections:
    each must still be there (a page moved or a section renamed leaves no dangling one)."""
    wrong = []
    for path in sorted(tracked()):
        if not path.endswith((".py", ".sh", ".p4", ".proto", ".toml", ".c")):
            continue
        text = (ROOT / path).read_text(errors="replace")
        for token in re.findall(r"(?<![\w/.-])docs/[\w/.-]*\w", text):
            if not any(exists(t) for t in braces(token)):
                wrong.append(f"{path}: {token}")
        for target, quote in re.findall(
                r"((?:docs/[\w-]+|switch/p4/README)\.md)(?:,|:| \()\s*\"([^\"\n]+)\"", text):
            if exists(target) and not names_section(ROOT / target, quote):
                wrong.append(f"{path}: {target}, \"{quote}\"")
    assert not wrong, "pointers into the manual that do not resolve:\n" + "\n".join(wrong)


@pytest.mark.parametrize("name", page_ids())
def test_each_page_stays_within_its_size_budget(name: str) -> None:
    size = len((ROOT / name).read_bytes())
    budget = README_BUDGET if name == "README.md" else PAGE_BUDGET
    assert size <= budget, f"{name} is {size} bytes, over its {budget}: split it or cut history"


def test_the_manual_stays_within_half_the_size_issue_37_measured() -> None:
    sizes = {p.name: len(p.read_bytes()) for p in sorted((ROOT / "docs").glob("*.md"))}
    total = sum(sizes.values())
    largest = ", ".join(f"{n} {b}" for n, b in sorted(sizes.items(), key=lambda i: -i[1])[:5])
    assert total <= DOCS_BUDGET, (f"docs/*.md total {total} bytes, over {DOCS_BUDGET}; "
                                  f"the largest: {largest}")


def test_the_docs_index_lists_every_page_once() -> None:
    index = ROOT / "docs" / "README.md"
    listed = [normal(PurePosixPath("docs"), t) for t in LINK.findall(index.read_text())
              if t.endswith(".md") and not t.startswith("../README")]
    wanted = sorted(rel(p) for p in pages() if p.name != "README.md" or "p4" in rel(p))
    assert sorted(listed) == wanted


@pytest.mark.parametrize("name", page_ids())
def test_the_tables_of_lab_figures_are_the_scripts_rendering_of_the_json(name: str) -> None:
    text = (ROOT / name).read_text()
    assert text.count("<!-- table:") == len(BLOCK.findall(text)), f"{name}: an unclosed table"
    for table, body in BLOCK.findall(text):
        assert body == render(table), (f"{name}: table {table!r} differs from "
                                       f"`python -m benchmarks.doc_table {table}`; "
                                       f"run it with --write")


def test_every_table_the_script_renders_is_on_some_page() -> None:
    used = {t for p in pages() for t, _ in BLOCK.findall(p.read_text())}
    assert used == set(TABLES)
