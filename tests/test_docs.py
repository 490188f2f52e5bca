"""The README and docs/ as a reader pastes them: every `headsweep` line of a code block is a command
the CLI's parser takes, with no `a|b` alternatives or `[optional]` parts to edit out, naming example
files that exist; every link to a page or a heading lands; the methods page names every method and
key; the README opens with the two set-up commands."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from experiments.methods import METHODS
from headsweep.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
COMMAND = re.compile(r"^(?:[A-Z_]+=\S+\s+)*headsweep\s+(.*)$")
"""A command line of a code block: `headsweep ...`, after environment assignments."""


def code_lines(text: str) -> list[str]:
    """The lines of the page's fenced code blocks but YAML and Python ones, continuations joined."""
    lines, fence, joined = [], None, ""
    for line in text.splitlines():
        if line.startswith("```"):
            fence = None if fence is not None else line[3:].strip()
            continue
        if fence in ("", "bash", "sh", "shell"):
            joined += line.rstrip()
            if joined.endswith("\\"):
                joined = joined[:-1] + " "
                continue
            lines.append(joined.strip())
            joined = ""
    return lines


def commands() -> list[tuple[str, str]]:
    """(page, the argument part of each `headsweep` command line) of every page."""
    found = []
    for page in PAGES:
        for line in code_lines(page.read_text()):
            match = COMMAND.match(line)
            if match:
                found.append((page.name, match.group(1)))
    return found


def words(args: str) -> list[str]:
    """The shell words of a command line, comments cut, ``$(...)`` as one word; an unquoted ``|``,
    ``<`` or ``>`` is a word of its own (punctuation_chars), so it is seen."""
    args = re.sub(r"\$\([^)]*\)", "SUBSTITUTED", args)
    lexer = shlex.shlex(args, posix=True, punctuation_chars="|<>&;")
    lexer.whitespace_split, lexer.commenters = True, "#"
    return list(lexer)


def test_the_pages_show_enough_commands():
    """The walk found the pages and their commands (a broken walk would pass the next test on none)."""
    assert {p.name for p in PAGES} >= {"README.md", "reference.md", "configs.md", "clusters.md", "methods.md"}
    assert len(commands()) >= 60, len(commands())


@pytest.mark.parametrize(("page", "args"), commands())
def test_every_command_parses_as_shown(page, args):
    argv = words(args)
    assert not any(w in ("|", "<", ">", "&", ";") or w.startswith(("[", "<")) for w in argv), \
        f"{page}: `headsweep {args}` has alternatives or placeholders to edit out"
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
        try:
            build_parser().parse_args(argv)
        except SystemExit as exit_:  # --help exits 0, a bad flag 2
            assert exit_.code == 0, f"{page}: `headsweep {args}`: {err.getvalue().strip().splitlines()[-1]}"
    for word in argv:
        if word.startswith("examples/"):
            assert (ROOT / word).exists(), f"{page}: `headsweep {args}` names {word}, which does not exist"


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_links_land_on_a_page_and_a_heading():
    checked = 0
    for page in PAGES:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if target.startswith(("http://", "https://")):
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            assert linked.exists(), f"{page.name}: link to {target}, no such file"
            if anchor:
                headings = [_slug(h) for h in re.findall(r"^#+ (.*)$", linked.read_text(), re.MULTILINE)]
                assert anchor in headings, f"{page.name}: link to {target}, no such heading in {linked.name}"
            checked += 1
    assert checked >= 40, checked


def test_the_methods_page_names_every_method_and_key():
    text = (ROOT / "docs" / "methods.md").read_text()
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `(\w+)`.*$", text, re.MULTILINE)}
    for name, module in METHODS.items():
        assert name in rows, f"docs/methods.md has no row for method {name}"
        cells = [c.strip() for c in rows[name].strip("|").split("|")]
        assert cells[1] == ", ".join(module.PIPELINES), (name, cells[1])
        keys = [field.alias or key for key, field in module.Config.model_fields.items()]
        assert cells[3] == (", ".join(keys) or "-"), (name, cells[3])


def test_the_readme_opens_with_the_two_set_up_commands_and_activation():
    text = (ROOT / "README.md").read_text()
    first = code_lines(text)
    assert [line.split("#")[0].strip() for line in first[:2]] == ["make demo", "make test"]
    assert "source .venv/bin/activate" in first
