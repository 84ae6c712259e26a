#!/usr/bin/env python3
"""Keeps the gateway crate in the shape issue 30 asked for.

Fails (exit 1, naming each offender) when, in crates/selfheal-gateway/src:

- a non-test function is longer than MAX_FN_LINES lines (signature to closing brace);
- app.rs is longer than MAX_APP_LINES lines;
- the references between the crate's top-level modules (`use crate::x`, `crate::x::y` in code,
  comments and doc links left out) form a cycle.

`#[cfg(test)]` items (the `mod tests` blocks) are skipped. Braces inside string, raw-string and
char literals and comments are ignored, roughly: good enough for rustfmt-formatted code.

Usage: scripts/check-gateway-shape.py [SRC_DIR]
"""

import os
import re
import sys

MAX_FN_LINES = 150
MAX_APP_LINES = 400

FN_RE = re.compile(
    r"^\s*(?:pub(?:\([^)]*\))?\s+)?(?:(?:const|async|unsafe|extern\s+\"[^\"]*\")\s+)*fn\s+(\w+)"
)
CRATE_REF = re.compile(r"\bcrate::(\w+)")
RAW_OPEN = re.compile(r'b?r(#*)"')
CHAR_LIT = re.compile(r"'(?:\\u\{[0-9a-fA-F]+\}|\\.|[^\\'])'")
USE_GROUP = re.compile(r"\buse\s+crate::\{([^;]*)\};", re.S)


def blank_literals(text):
    """Returns `text` with comments and the insides of string/char literals replaced by spaces
    (newlines kept), so braces and `crate::` in them do not count."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif (m := RAW_OPEN.match(text, i)) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            end = '"' + m.group(1)
            j = text.find(end, m.end())
            j = n if j < 0 else j + len(end)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append('"' + re.sub(r"[^\n]", " ", text[i + 1 : j - 1]) + '"')
            i = j
        elif c == "'":
            # A char literal ('x', '\n', '\u{..}', '{'), not a lifetime ('a).
            m = CHAR_LIT.match(text, i)
            if m:
                out.append("' '" + " " * (m.end() - i - 3))
                i = m.end()
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def matching_brace(text, open_at):
    depth = 0
    for j in range(open_at, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    return len(text) - 1


def strip_cfg_test(text):
    """Blanks every item under `#[cfg(test)]` (keeps newlines so line numbers hold)."""
    while True:
        m = re.search(r"#\[cfg\(test\)\]", text)
        if not m:
            return text
        brace = text.find("{", m.end())
        semi = text.find(";", m.end())
        if brace < 0 or (0 <= semi < brace):
            end = semi
        else:
            end = matching_brace(text, brace)
        text = text[: m.start()] + re.sub(r"[^\n]", " ", text[m.start() : end + 1]) + text[end + 1 :]


def functions(code):
    """Yields (line number, name, length in lines) of every function with a body in `code`."""
    offset = 0
    for no, line in enumerate(code.split("\n")):
        m = FN_RE.match(line)
        if m:
            # The body's brace: the first `{` after the signature, unless a `;` ends it first
            # (a trait's declaration).
            brace, semi = code.find("{", offset), code.find(";", offset)
            if brace >= 0 and not (0 <= semi < brace):
                end = matching_brace(code, brace)
                yield no + 1, m.group(1), code.count("\n", offset, end + 1) + 1
        offset += len(line) + 1


def module_of(src, path):
    rel = os.path.relpath(path, src)
    top = rel.split(os.sep)[0]
    return top[:-3] if top.endswith(".rs") else top


def references(code):
    refs = set(CRATE_REF.findall(code))
    for group in USE_GROUP.findall(code):
        for part in group.split(","):
            name = part.strip().split("::")[0].split(" ")[0].strip("{} \n")
            if name and name not in ("self",):
                refs.add(name)
    return refs


def cycles(graph):
    """One cycle per strongly connected component of more than one module (Tarjan)."""
    index, low, on, stack, found = {}, {}, set(), [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on.discard(w)
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1:
                found.append(path_within(graph, set(scc)))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def path_within(graph, scc):
    """A cycle through the first module of `scc`, for the message."""
    start = min(scc)
    prev, queue = {start: None}, [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph.get(v, ())):
            if w == start:
                path = [v]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                return list(reversed(path)) + [start]
            if w in scc and w not in prev:
                prev[w] = v
                queue.append(w)
    return sorted(scc)


def main():
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    src = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "crates", "selfheal-gateway", "src")
    offenders = []
    graph = {}
    longest = (0, "")
    modules = set()
    for dirpath, _, files in os.walk(src):
        for f in sorted(files):
            if f.endswith(".rs"):
                modules.add(module_of(src, os.path.join(dirpath, f)))
    modules.discard("lib")
    modules.discard("main")
    for dirpath, _, files in sorted(os.walk(src)):
        for f in sorted(files):
            if not f.endswith(".rs"):
                continue
            path = os.path.join(dirpath, f)
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
            rel = os.path.relpath(path, src)
            if rel == "app.rs" and text.count("\n") > MAX_APP_LINES:
                offenders.append(f"{rel}: {text.count(chr(10))} lines (max {MAX_APP_LINES})")
            code = strip_cfg_test(blank_literals(text))
            for no, name, length in functions(code):
                if length > MAX_FN_LINES:
                    offenders.append(f"{rel}:{no}: fn {name} is {length} lines (max {MAX_FN_LINES})")
                if length > longest[0]:
                    longest = (length, f"{rel}:{no} fn {name}")
            me = module_of(src, path)
            if me in ("lib", "main"):
                continue
            deps = {r for r in references(code) if r in modules and r != me}
            graph.setdefault(me, set()).update(deps)
    for cycle in cycles(graph):
        offenders.append("import cycle between modules: " + " -> ".join(cycle))
    if os.environ.get("SHAPE_GRAPH"):
        for m in sorted(graph):
            print(f"  {m} -> {', '.join(sorted(graph[m]))}")
    print(f"gateway shape: {len(modules)} modules, longest fn {longest[0]} lines ({longest[1]})", flush=True)
    if offenders:
        for o in offenders:
            print("  " + o, file=sys.stderr)
        print(f"gateway shape: {len(offenders)} problem(s)", file=sys.stderr)
        return 1
    print("gateway shape: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
