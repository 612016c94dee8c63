"""What the README and ``docs/`` name exists (issue 33: links pointed at moved files, names had
changed): every relative link and its anchor (``docs/history`` too), every section named in words
(``docs/cli.md "Offsets"``), every repository file named in inline code, every ``make`` target, every
``streamledger.…`` import path, every name an import line of a code block imports (issue 41: a user
copies those lines first); and the examples marked runnable run (those that need no server). Command
lines and their flags: ``tests/unit/cli/test_docs_name_real_flags.py``."""

from __future__ import annotations

import functools
import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: Where links are followed: every page, the dated records of docs/history too.
LINKED = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
# a repository path in inline code: `scripts/rabbitmq.sh`, `tests/integration/batch/park.py::test_x`
REPO_PATH = re.compile(r"^(?:src|scripts|tests|bench|dags|docs)/[\w./-]*\w$")
MAKE = re.compile(r"(?:^|[`\s(])make ([a-z][a-z0-9-]*)")
MODULE = re.compile(r"\bstreamledger(?:\.[A-Za-z_]\w*)+")
RUN_MARK = "<!-- doc-test: run -->"
# Dotted words that are not import paths, and why the docs name them.
NOT_IMPORT_PATHS = {
    "streamledger.demo_backfill": "the demo's Iceberg table",
    "streamledger.pipeline": "an Iceberg snapshot summary key",
    "streamledger.run": "an Iceberg snapshot summary key",
    "streamledger.ranges": "an Iceberg snapshot summary key",
    "streamledger.announcements": "a trigger's shared-stream key",
    "streamledger.ledger.airflow_db_manager": "the old path, named as gone",
    "streamledger.batch.runners": "the old module, named as gone",
}


def _lines(doc: Path) -> list[tuple[int, str, bool]]:
    """(number, line, inside a fenced block) for every line of a doc."""
    out, fenced = [], False
    for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), start=1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        out.append((number, line, fenced))
    return out


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but ``-`` and ``_`` dropped, spaces to ``-``."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


@functools.cache
def _anchors(doc: Path) -> set[str]:
    seen: dict[str, int] = {}
    anchors = set()
    for _, line, fenced in _lines(doc):
        if fenced or not line.startswith("#"):
            continue
        slug = _slug(line.lstrip("#"))
        n = seen.get(slug, 0)
        anchors.add(slug if n == 0 else f"{slug}-{n}")
        seen[slug] = n + 1
    return anchors


def _name(doc: Path) -> str:
    return str(doc.relative_to(ROOT))


def _links() -> list[tuple[str, int, str]]:
    return [(_name(doc), number, target) for doc in LINKED for number, line, fenced in _lines(doc)
            if not fenced for target in LINK.findall(line) if "://" not in target
            and not target.startswith("mailto:")]


@functools.cache
def _spans(pattern: re.Pattern[str]) -> list[tuple[str, int, str]]:
    found = []
    for doc in DOCS:
        for number, line, fenced in _lines(doc):
            spans = [line] if fenced else CODE_SPAN.findall(line)
            for span in spans:
                found += [(_name(doc), number, m) for m in pattern.findall(span)]
    return found


@pytest.mark.parametrize(("doc", "line", "target"), _links(), ids=lambda v: str(v)[:50])
def test_every_relative_link_reaches_a_file_and_its_heading(doc: str, line: int, target: str) -> None:
    path, _, anchor = target.partition("#")
    where = (ROOT / doc).parent / path if path else ROOT / doc
    assert where.exists(), f"{doc}:{line}: link to {path}, which does not exist"
    if anchor and where.suffix == ".md":
        assert anchor in _anchors(where), f"{doc}:{line}: {where.name} has no heading #{anchor}"


# A section named in words: README "Lakehouse tables", docs/cli.md "Offsets", spark.md, "Streaming".
NAMED_SECTION = re.compile(r"\b(README|[\w/-]+\.md),? \"([^\"]+)\"")


def _named_sections() -> list[tuple[str, int, str, str]]:
    found = []
    for doc in DOCS:
        for number, line, fenced in _lines(doc):
            if not fenced:
                found += [(_name(doc), number, page, title) for page, title in NAMED_SECTION.findall(line)]
    return found


def _page(doc: str, page: str) -> Path:
    """The page a section reference names: README, a path from the root, or a name beside the doc."""
    if page == "README":
        return ROOT / "README.md"
    for where in (ROOT / page, (ROOT / doc).parent / page, ROOT / "docs" / page):
        if where.exists():
            return where
    return ROOT / page


@pytest.mark.parametrize(("doc", "line", "page", "title"), _named_sections(), ids=lambda v: str(v)[:40])
def test_every_section_named_in_words_is_a_heading_of_its_page(doc: str, line: int, page: str,
                                                                title: str) -> None:
    where = _page(doc, page)
    assert where.exists(), f"{doc}:{line}: names {page}, which does not exist"
    headings = [h for h in (_slug(t) for t in _headings(where))]
    assert any(h == _slug(title) or h.startswith(_slug(title) + "-") for h in headings), (
        f"{doc}:{line}: {where.name} has no section \"{title}\"")


def _headings(doc: Path) -> list[str]:
    return [line.lstrip("#") for _, line, fenced in _lines(doc) if not fenced and line.startswith("#")]


def _repo_paths() -> list[tuple[str, int, str]]:
    found = []
    for doc in DOCS:
        for number, line, fenced in _lines(doc):
            if fenced:
                continue
            for span in CODE_SPAN.findall(line):
                word = span.split()[0].split("::")[0].rstrip(".,:") if span.split() else ""
                if REPO_PATH.match(word):
                    found.append((_name(doc), number, word))
    return found


@pytest.mark.parametrize(("doc", "line", "path"), _repo_paths(), ids=lambda v: str(v)[:50])
def test_every_repository_file_named_exists(doc: str, line: int, path: str) -> None:
    assert (ROOT / path).exists(), f"{doc}:{line}: `{path}` does not exist in the repository"


def _targets() -> set[str]:
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    return {m.group(1) for m in re.finditer(r"^([a-z][a-z0-9_-]*):", text, re.MULTILINE)}


@pytest.mark.parametrize(("doc", "line", "target"), sorted(set(_spans(MAKE))), ids=lambda v: str(v)[:40])
def test_every_make_target_named_exists(doc: str, line: int, target: str) -> None:
    assert target in _targets(), f"{doc}:{line}: the Makefile has no target `{target}`"


def _resolves(dotted: str) -> bool:
    """``streamledger.a.b.C`` is a module, or an attribute of the longest importable module prefix."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError as exc:
            if exc.name and not ".".join(parts[:cut]).startswith(exc.name):
                raise  # a dependency is missing, not the doc's name
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


@pytest.mark.parametrize("dotted", sorted({m for _, _, m in _spans(MODULE)} - set(NOT_IMPORT_PATHS)))
def test_every_import_path_named_resolves(dotted: str) -> None:
    where = [f"{d}:{n}" for d, n, m in _spans(MODULE) if m == dotted]
    assert _resolves(dotted), f"{', '.join(where[:3])}: `{dotted}` is not a module or a name in one"


def _runnable() -> list[tuple[str, int, str, str]]:
    """Fenced blocks right after a ``<!-- doc-test: run -->`` line: (doc, line, language, code)."""
    found = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(text):
            if line.strip() != RUN_MARK:
                continue
            fence = text[i + 1].strip()
            end = next(j for j in range(i + 2, len(text)) if text[j].strip() == "```")
            found.append((_name(doc), i + 2, fence.strip("`"), "\n".join(text[i + 2:end])))
    return found


@pytest.mark.parametrize(("doc", "line", "lang", "code"), _runnable(), ids=lambda v: str(v)[:40])
def test_examples_that_need_no_server_run(doc: str, line: int, lang: str, code: str, tmp_path: Path) -> None:
    env = {**os.environ, "STREAMLEDGER_HOME": str(tmp_path / "home"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    if lang == "python":
        argv = [sys.executable, "-c", code]
    else:
        assert lang in ("bash", "console", "sh"), f"{doc}:{line}: cannot run a {lang} block"
        lines = [ln.removeprefix("$ ") for ln in code.splitlines()
                 if ln.startswith("$ ") or lang != "console"]
        argv = ["bash", "-euo", "pipefail", "-c", "\n".join(lines)]
    proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, f"{doc}:{line}: the example failed:\n{proc.stdout}{proc.stderr}"


# ``from streamledger.x import a, b``, ``from streamledger.x import (`` over lines ``)``,
# ``import streamledger.x``
FROM_IMPORT = re.compile(r"^\s*from (streamledger(?:\.\w+)*) import (\([^)]*\)|[^\n#]+)", re.MULTILINE)
PLAIN_IMPORT = re.compile(
    r"^\s*import (streamledger(?:\.\w+)*(?:\s+as\s+\w+)?(?:\s*,\s*[\w.]+(?:\s+as\s+\w+)?)*)", re.MULTILINE)


def _blocks(doc: Path) -> list[tuple[int, str]]:
    """(first line, code) of every fenced block of a doc."""
    out: list[tuple[int, str]] = []
    start, code = 0, None
    for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), start=1):
        if line.lstrip().startswith("```"):
            if code is None:
                start, code = number + 1, []
            else:
                out.append((start, "\n".join(code)))
                code = None
        elif code is not None:
            code.append(line)
    return out


def _imported() -> list[tuple[str, int, str, str]]:
    """(doc, line, module, name) for every name a fenced block's import line imports from streamledger;
    name "" for ``import streamledger.x``."""
    found = []
    for doc in DOCS:
        for first, code in _blocks(doc):
            for m in FROM_IMPORT.finditer(code):
                line = first + code.count("\n", 0, m.start())
                names = re.sub(r"#[^\n]*", "", m.group(2)).strip().strip("()").split(",")
                for name in names:
                    name = name.strip().split(" as ")[0].strip()
                    if name:
                        found.append((_name(doc), line, m.group(1), name))
            for m in PLAIN_IMPORT.finditer(code):
                line = first + code.count("\n", 0, m.start())
                for module in m.group(1).split(","):
                    found.append((_name(doc), line, module.split(" as ")[0].strip(), ""))
        for number, line, fenced in _lines(doc):  # and an import line in running text
            for span in ([] if fenced else CODE_SPAN.findall(line)):
                for m in FROM_IMPORT.finditer(span):
                    found += [(_name(doc), number, m.group(1), n.strip().split(" as ")[0])
                              for n in m.group(2).strip("()").split(",") if n.strip()]
    return found


@pytest.mark.parametrize(("doc", "line", "module", "name"), _imported(), ids=lambda v: str(v)[:40])
def test_every_import_line_shown_imports(doc: str, line: int, module: str, name: str) -> None:
    """What a user copies first: each ``from streamledger… import a, b`` of a code block, for real."""
    if not name:
        importlib.import_module(module)
        return
    code = f"from {module} import {name}"
    found = importlib.import_module(module)
    if not hasattr(found, name):  # a submodule is importable by name too
        try:
            importlib.import_module(f"{module}.{name}")
        except ModuleNotFoundError:
            pytest.fail(f"{doc}:{line}: `{code}` fails: {module} has no {name}")
