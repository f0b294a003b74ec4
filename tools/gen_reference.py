#!/usr/bin/env python3
"""The API reference as one Markdown page, from the public headers: a
section per header of include/ndm/ (its opening paragraph, then every
documented entry point in the header's order: macros, inline functions,
exported functions and types, each with its signature and doc comment), so the
reference reads without building anything.

    python3 tools/gen_reference.py > docs/reference.md     write it
    python3 tools/gen_reference.py --check                 exit 1 when docs/reference.md is stale

The HTML reference with cross-links is Doxygen's (`ninja -C build docs`).
"""
import difflib
import os
import re
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
OUTPUT = os.path.join("docs", "reference.md")
REFRESH = "python3 tools/gen_reference.py > docs/reference.md"

TOKEN = re.compile(r"/\*\*(?P<doc>.*?)\*/|/\*.*?\*/|//[^\n]*|"
                   r"^[ \t]*#[ \t]*(?P<pp>(?:[^\n]*\\\n)*[^\n]*)|"
                   r"(?P<api>^[ \t]*NDM_API\b[^;{]*)|"
                   r"(?P<inline>^[ \t]*static[ \t]+inline\b[^;{]*)|"
                   r"(?P<type>^(?:typedef\b[^;{]*(?:\{[^}]*\}[^;]*)?|enum\b[^;{]*\{[^}]*\}[^;]*);)",
                   re.S | re.M)


def doc_lines(body):
    """A doc comment's lines without the comment's stars."""
    lines = body.split("\n")
    out = []
    for i, ln in enumerate(lines):
        if i > 0:
            ln = re.sub(r"^\s*\*(?!/)", "", ln)
        out.append(ln.rstrip())
    while out and not out[0].strip():
        out.pop(0)
    while out and not out[-1].strip():
        out.pop()
    return out


def escape(text):
    """Markdown-safe prose: angle brackets outside code spans."""
    parts = re.split(r"(`[^`]*`)", text)
    return "".join(p if p.startswith("`") else
                   p.replace("<", "&lt;").replace(">", "&gt;").replace("*", "\\*")
                   for p in parts)


LIST_ITEM = re.compile(r"([-*]|\d+\.) ")


def render(lines):
    """Comment lines as Markdown: prose reflowed into paragraphs and list
    items; lines indented deeper than the prose (examples, diagrams,
    aligned tables) kept as they are, in code blocks."""
    if not lines:
        return ""
    indents = [len(ln) - len(ln.lstrip()) for ln in lines[1:] if ln.strip()]
    base = min(indents) if indents else 0
    kinds = []  # per line: "blank", "item", "cont", "code" or "prose"
    for i, ln in enumerate(lines):
        text = ln.strip()
        indent = len(ln) - len(ln.lstrip()) if i > 0 else base
        prev = next((k for k in reversed(kinds) if k != "blank"), None)
        if not text:
            kinds.append("blank")
        elif LIST_ITEM.match(text) and indent <= base + 3:
            kinds.append("item")
        elif prev in ("item", "cont") and kinds[-1] != "blank" and indent > base:
            kinds.append("cont")
        elif indent >= base + 2:
            kinds.append("code")
        else:
            kinds.append("prose")
    # a line whose words are aligned in columns, above an indented block, is
    # the block's first row
    for i in range(len(lines) - 1):
        if kinds[i] == "prose" and kinds[i + 1] == "code" and re.search(r"\S {2,}\S", lines[i]):
            kinds[i] = "code"
    out, para, code = [], [], []

    def flush():
        if para:
            out.append(escape(" ".join(para)))
            out.append("" if not LIST_ITEM.match(para[0]) else None)
            para.clear()
        if code:
            least = min(len(c) - len(c.lstrip()) for c in code if c.strip())
            out.extend(["```c"] + [c[least:] for c in code] + ["```", ""])
            code.clear()

    for ln, kind in zip(lines, kinds):
        text = ln.strip()
        if kind == "blank":
            flush()
            if out and out[-1] is None:
                out[-1] = ""
        elif kind == "code":
            if para:
                flush()
            code.append(ln)
        else:
            if code or (kind == "item") or (kind == "prose" and para and LIST_ITEM.match(para[0])):
                flush()
            if kind in ("prose", "code") and out and out[-1] is None:
                out[-1] = ""
            para.append(text)
    flush()
    # (None: after a list item, where the next item follows without a blank)
    text = "\n".join(x for x in out if x is not None)
    return re.sub(r"\n{3,}", "\n\n", text).strip() + "\n"


def signature(kind, text):
    if kind == "type":
        return text.strip()
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    if kind == "pp":
        m = re.match(r"define\s+(\w+\([^)]*\)|\w+)", text)
        return "#define " + re.sub(r"\s+", " ", m.group(1)) if m else None
    if kind == "type":
        return text.strip()
    text = re.sub(r"\bNDM_API\s+", "", text.strip())
    return re.sub(r"\s+", " ", text).replace("( ", "(").replace(" )", ")") + ";"


def header_section(name, text):
    out = [f"## {name}", ""]
    m = re.match(r"\s*/\*(.*?)\*/", text, re.S)
    if m:
        lines = doc_lines(m.group(1))
        out.append(render(lines))
    pending = None  # the doc comment waiting for its entity
    pending_end = 0
    for tok in TOKEN.finditer(text, m.end() if m else 0):
        between = text[pending_end:tok.start()]
        if pending is not None and between.strip():
            pending = None
        if tok.group("doc") is not None:
            body = tok.group("doc")
            if re.fullmatch(r"\s*@[{}]\s*", body):
                pending = None
            elif re.match(r"\s*[@\\]name\b", body):
                first, _, rest = body.strip().partition("\n")
                title = re.sub(r"^[@\\]name\s*", "", first).strip()
                out += [f"### {escape(title)}", ""]
                lines = doc_lines("\n" + rest)
                if lines:
                    out.append(render(lines))
                pending = None
            elif "@cond" in body or "@endcond" in body:
                pending = None
            else:
                pending = doc_lines(body)
            pending_end = tok.end()
            continue
        kind = next((k for k in ("pp", "api", "inline", "type") if tok.group(k) is not None),
                    None)
        if kind is None:  # a plain comment
            pending_end = tok.end()
            continue
        sig = signature(kind, tok.group(kind))
        if pending is not None and sig and not re.search(r"\b(ndm|NDM)_\w*_\b", sig.split("(")[0]):
            if kind == "type":
                out += ["```c", sig, "```", "", render(pending)]
            else:
                out += ["`" + sig + "`", "", render(pending)]
        pending = None
        pending_end = tok.end()
    return "\n".join(out).rstrip() + "\n"


def generate(root):
    inc = os.path.join(root, "include", "ndm")
    names = sorted(n for n in os.listdir(inc) if n.endswith(".h"))
    parts = ["# ndm API reference", "",
             "Generated from the public headers by `" + REFRESH + "`; do not edit it by hand.",
             "Every entry point with its signature and its comment, header by header. The",
             "same text with cross-links: `ninja -C build docs` (Doxygen), whose main page is",
             "[the overview](overview.md).", ""]
    parts += [f"- [{n}](#{n.replace('.', '')})" for n in names if n != "ndm.h"]
    parts.append("")
    for n in names:
        if n == "ndm.h":
            continue
        with open(os.path.join(inc, n), encoding="utf-8") as f:
            parts.append(header_section(n, f.read()))
    return "\n".join(parts).rstrip() + "\n"


def main():
    args = sys.argv[1:]
    root = ROOT
    if "--root" in args:
        i = args.index("--root")
        root = args[i + 1]
        del args[i:i + 2]
    text = generate(root)
    if args and args[0] == "--check":
        path = os.path.join(root, OUTPUT)
        try:
            with open(path, encoding="utf-8") as f:
                old = f.read()
        except OSError:
            old = ""
        if old == text:
            print(f"{OUTPUT} matches the headers")
            return 0
        diff = list(difflib.unified_diff(old.splitlines(), text.splitlines(),
                                         OUTPUT + " (checked in)", OUTPUT + " (from the headers)",
                                         lineterm="", n=1))
        print("\n".join(diff[:60]))
        if len(diff) > 60:
            print(f"... {len(diff) - 60} more diff lines")
        print(f"{OUTPUT} is stale: the headers changed since it was made. Refresh it with\n"
              f"    {REFRESH}\nand commit it with the header change.")
        return 1
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
