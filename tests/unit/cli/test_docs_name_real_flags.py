"""Every ``streamledger …`` command line the docs show names a command that exists and only flags that
command accepts (issue 33: docs named flags and names that had changed)."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

from streamledger.cli import build_parser

ROOT = Path(__file__).resolve().parents[3]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# In inline code (`streamledger …`), or on a line of a fenced code block ("streamledger …",
# "$ streamledger …", "X=$(streamledger …")
INLINE = re.compile(r"`streamledger((?: [^`\n|;&)#]+)+)")
CODE = re.compile(r"(?:^\s*(?:\$\s*)?|\$\()streamledger((?: [^`\n|;&)#]+)+)")


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _uses() -> list[tuple[str, int, str]]:
    found = []
    for doc in DOCS:
        fenced, console = False, False
        for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), start=1):
            if line.lstrip().startswith("```"):
                fenced, console = not fenced, line.strip() == "```console"
                continue
            if console and not line.startswith("$ "):  # a console block's output, not a command
                continue
            for match in (CODE if fenced else INLINE).finditer(line):
                found.append((doc.name, number, match.group(1).strip()))
    return found


def _words(text: str) -> list[str]:
    try:
        return shlex.split(text.replace("…", ""))
    except ValueError:
        return text.split()


@pytest.mark.parametrize(("doc", "line", "text"), _uses(), ids=lambda v: str(v)[:40])
def test_the_command_and_its_flags_exist(doc: str, line: int, text: str) -> None:
    top = build_parser()
    parser, path = top, []
    flags = dict(top._option_string_actions)
    words = iter(_words(text))
    for word in words:
        if word.startswith("-"):
            flag = word.split("=", 1)[0].strip("[]")
            if flag.startswith("--") and re.fullmatch(r"--[a-z0-9-]+", flag):
                assert flag in flags, f"{doc}:{line}: `streamledger {' '.join(path)}` has no {flag}"
                if flags[flag].nargs != 0 and "=" not in word:
                    next(words, None)  # its value
            continue
        subs = _subcommands(parser)
        if not subs:
            continue
        name = word.strip("[]")
        if name.isupper():  # a placeholder: COMMAND
            return
        if "|" in name:  # `ledger upgrade|ranges|audit`: each alternative must exist
            for alt in name.split("|"):
                assert alt in subs, f"{doc}:{line}: no command `streamledger {' '.join([*path, alt])}`"
            return
        if name not in subs:
            if path:  # a positional argument, e.g. a stream name
                continue
            pytest.fail(f"{doc}:{line}: no command `streamledger {name}`")
        parser, path = subs[name], [*path, name]
        flags |= dict(parser._option_string_actions)
