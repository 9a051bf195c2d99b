"""Build the vendored passage files under data/prompts/passages/ from translated documentation.

    python -m headway.data.passage_build po REPO_DIR COMMIT es OUT.jsonl tutorial/ faq/ howto/sorting.po
    python -m headway.data.passage_build md REPO_DIR COMMIT de OUT.jsonl docs/guide/ docs/blog/

`po`: gettext catalogues of the Python documentation translations (English msgid beside the translated
msgstr; fuzzy and untranslated entries keep only their English). `md`: Markdown documentation written
in one language. Either way one row per paragraph, in document order, with the heading it sits under:
    {"doc": "faq/general", "section": "What is Python?", "en": "...", "es": "..."}
REPO_DIR is a git directory; files are read at COMMIT with `git show`, so the output is reproducible.
ReStructuredText/Markdown markup is reduced to plain text; code blocks, tables and lists are left out.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

MIN_WORDS = 8  # shorter entries are headings, captions, labels: no passage material
HEADING_MAX_WORDS = 14


def git_files(repo: str, commit: str, prefixes: list[str], suffix: str) -> list[str]:
    names = subprocess.run(
        ["git", "-C", repo, "ls-tree", "-r", "--name-only", commit], capture_output=True, text=True, check=True
    ).stdout.split()
    return sorted(n for n in names if n.endswith(suffix) and any(n == p or n.startswith(p) for p in prefixes))


def git_text(repo: str, commit: str, path: str) -> str:
    return subprocess.run(["git", "-C", repo, "show", f"{commit}:{path}"], capture_output=True, check=True).stdout.decode()


# ---------------------------------------------------------------- gettext catalogues


def parse_po(text: str) -> list[tuple[str, str, bool]]:
    """(msgid, msgstr, fuzzy) of every live entry, in file order; the header entry is left out."""
    entries = []
    for block in re.split(r"\n\s*\n", text):
        fields, field, fuzzy = {}, None, False
        for line in block.splitlines():
            if line.startswith("#,") and "fuzzy" in line:
                fuzzy = True
            elif line.startswith(("msgid ", "msgstr ")):
                field, _, value = line.partition(" ")
                fields[field] = ast.literal_eval(value)
            elif line.startswith('"') and field:
                fields[field] += ast.literal_eval(line)
            elif line.startswith("#~"):  # obsolete entry
                break
        if fields.get("msgid"):
            entries.append((fields["msgid"], fields.get("msgstr", ""), fuzzy))
    return entries


_RST = [
    (re.compile(r":[\w:+-]+:`~?([^`<]*?)\s*<[^`>]*>`"), r"\1"),  # :role:`text <target>`
    (re.compile(r":[\w:+-]+:`~(?:[\w.]*\.)?([^`]*)`"), r"\1"),  # :role:`~a.b.c` -> c
    (re.compile(r":[\w:+-]+:`!?([^`]*)`"), r"\1"),  # :role:`a.b` -> a.b
    (re.compile(r"`([^`<]*?)\s*<[^`>]*>`__?"), r"\1"),  # `text <url>`_
    (re.compile(r"`([^`]+)`__?"), r"\1"),
    (re.compile(r"``([^`]+)``"), r"\1"),
    (re.compile(r"\*\*([^*]+)\*\*"), r"\1"),
    (re.compile(r"(?<![\w*])\*([^*\s][^*]*)\*(?![\w*])"), r"\1"),
    (re.compile(r"\|([\w-]+)\|"), r"\1"),
    (re.compile(r"\\ "), ""),
    (re.compile(r"(?<=\w)\\s\b"), "s"),  # :term:`iterator`\s
    (re.compile(r"""\\(['"*`_|<>])"""), r"\1"),  # escaped markup characters
    (re.compile(r"\s*::$"), ":"),
]
_SPACE = re.compile(r"\s+")


def substitute(text: str, rules) -> str:
    """`text` through each (pattern, replacement) of `rules` in turn, white space folded."""
    for pattern, repl in rules:
        text = pattern.sub(repl, text)
    return _SPACE.sub(" ", text).strip()


def clean_rst(text: str) -> str:
    return substitute(text, _RST)


def is_heading(text: str) -> bool:
    words = text.split()
    return 0 < len(words) <= HEADING_MAX_WORDS and not text.endswith((".", ":", ";", ",")) and "`" not in text


def po_rows(repo: str, commit: str, lang: str, prefixes: list[str]) -> list[dict]:
    rows = []
    for path in git_files(repo, commit, prefixes, ".po"):
        doc, section = path.removesuffix(".po"), ""
        for msgid, msgstr, fuzzy in parse_po(git_text(repo, commit, path)):
            en = clean_rst(msgid)
            if msgid.lstrip().startswith((">>>", "$ ", "..")) or "\n" in msgid:
                continue  # code samples and literal blocks
            if is_heading(en):
                section = en
                continue
            if len(en.split()) < MIN_WORDS:
                continue
            row = {"doc": doc, "section": section, "en": en}
            if msgstr and not fuzzy:
                row[lang] = clean_rst(msgstr)
            rows.append(row)
    return rows


# ---------------------------------------------------------------- Markdown


_MD = [
    (re.compile(r"!?\[([^\]]*)\]\([^)]*\)"), r"\1"),  # links and images: their text
    (re.compile(r"\*\*([^*]+)\*\*"), r"\1"),
    (re.compile(r"(?<!\w)[*_]([^*_\s][^*_]*)[*_](?!\w)"), r"\1"),
    (re.compile(r"`([^`]+)`"), r"\1"),
    (re.compile(r"<[^>]+>"), ""),
]


def clean_markdown(text: str) -> str:
    return substitute(text, _MD)


def md_rows(repo: str, commit: str, lang: str, prefixes: list[str]) -> list[dict]:
    rows = []
    for path in git_files(repo, commit, prefixes, ".md"):
        text = git_text(repo, commit, path)
        text = re.sub(r"\A---\n.*?\n---\n", "", text, flags=re.S)  # front matter
        text = re.sub(r"```.*?```", "", text, flags=re.S)  # code blocks
        doc, section = path.removesuffix(".md"), ""
        for block in re.split(r"\n\s*\n", text):
            block = block.strip()
            if block.startswith("#"):
                section = clean_markdown(block.lstrip("#"))
                continue
            if not block or block[0] in "<|:>-*![0123456789" or "\n" in block and block.split("\n")[1].lstrip()[:1] in "-*|":
                continue  # html, tables, containers, quotes, lists
            para = clean_markdown(block)
            if len(para.split()) >= MIN_WORDS:
                rows.append({"doc": doc, "section": section, lang: para})
    return rows


def main(argv: list[str]) -> None:
    kind, repo, commit, lang, out, *prefixes = argv
    rows = (po_rows if kind == "po" else md_rows)(repo, commit, lang, prefixes)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(f"{out}: {len(rows)} rows, {sum(lang in r for r in rows)} with {lang}")


if __name__ == "__main__":
    main(sys.argv[1:])
