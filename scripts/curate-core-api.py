#!/usr/bin/env python3
"""Rewrite `selfheal_core::<module>::<Item>` paths to the core's curated root paths.

selfheal-core's modules are private; its public API is what `crates/selfheal-core/src/lib.rs`
re-exports at the root (`pub use module::{Item, Other as Renamed}`), plus the modules that stay
public (`pub mod contract`, `pub mod conformance`). This script reads that lib.rs and rewrites
every path into a private module elsewhere in the workspace to its root name:

    use selfheal_core::monitor::{Mode, Monitor};          ->  use selfheal_core::{Monitor, MonitorMode};
    use selfheal_core::{FailureClass, call::{Mode, Stop}}  ->  use selfheal_core::{CallMode, CallStop, FailureClass};
    use selfheal_core::call;  ... call::CallEvent::Skip    ->  use selfheal_core::CallEvent;  ... CallEvent::Skip
    selfheal_core::trust::Shared::new()                    ->  selfheal_core::SharedTrust::new()

A renamed item imported under its old name (`call::Mode` used as `Mode`) is renamed in the file's
code too (comments and strings are left alone; in doc comments and Markdown only inside ```
blocks). A `pub use` keeps the name it gives its own crate (`pub use selfheal_core::EventKind as
Kind`). An item reached through a module import whose name the file defines itself is written
as a full path (`selfheal_core::CallEvent`). Use statements in doc comments (doc tests) and
Markdown code blocks are rewritten the same way; adjacent `use selfheal_core::...` statements
are merged into one. Run `cargo fmt --all` afterwards.

It is idempotent: run it again after merging a branch that added new `selfheal_core::module::Item`
sites. What it cannot map (an item lib.rs does not re-export, a glob, a mention of a private
module) is listed on stderr with file:line; add the re-export to lib.rs (or fix by hand) and run
it again. The compiler finds the rest — notably new code that git merged into a file whose
imports were already rewritten and that still names a renamed item by its old name
(`Event::Classified` under `use selfheal_core::TraceEvent`): `--renames` lists the table.

    scripts/curate-core-api.py               # rewrite in place, list what is left
    scripts/curate-core-api.py --check       # change nothing; exit 1 if anything would change
    scripts/curate-core-api.py --inventory   # the (module, item) pairs used outside the core
    scripts/curate-core-api.py --renames     # the items whose root name is not their own
    scripts/curate-core-api.py FILE...       # only these files
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections import Counter
from dataclasses import dataclass, field

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
LIB_RS = os.path.join("crates", "selfheal-core", "src", "lib.rs")
CORE_SRC = os.path.join("crates", "selfheal-core", "src") + os.sep
# History is not rewritten: it names the paths as they were.
SKIP_FILES = {"CHANGELOG.md"}
SKIP_DIRS = {"target", "node_modules"}
# Width of a use statement in a doc comment or Markdown (rustfmt formats the code's).
WIDTH = 96

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


# ---------------------------------------------------------------------------------------------
# Use trees
# ---------------------------------------------------------------------------------------------


@dataclass
class Leaf:
    """One imported name: its path below `selfheal_core::` and its alias (`as x`)."""

    segs: list[str]
    alias: str | None = None

    def local(self) -> str | None:
        """The name this leaf binds in the importing scope (None for a glob)."""
        if self.alias:
            return self.alias
        last = self.segs[-1]
        if last == "*":
            return None
        if last == "self":
            return self.segs[-2] if len(self.segs) >= 2 else None
        return last


def tokenize_use(text: str) -> list[str]:
    """Tokens of a use tree: identifiers, `::`, braces, commas, `*`. Comments are dropped."""
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.findall(r"::|[{},*]|" + IDENT, text)


def parse_tree(tokens: list[str], i: int, prefix: list[str], out: list[Leaf]) -> int:
    """Parse one use tree at tokens[i] under `prefix`; append its leaves; return the next index."""
    segs = list(prefix)
    while i < len(tokens):
        t = tokens[i]
        if t == "{":
            i += 1
            while i < len(tokens) and tokens[i] != "}":
                i = parse_tree(tokens, i, segs, out)
                if i < len(tokens) and tokens[i] == ",":
                    i += 1
            return i + 1  # past "}"
        if t == "*":
            out.append(Leaf(segs + ["*"]))
            return i + 1
        if re.fullmatch(IDENT, t):
            segs.append(t)
            i += 1
            if i < len(tokens) and tokens[i] == "::":
                i += 1
                continue
            alias = None
            if i + 1 < len(tokens) and tokens[i] == "as":
                alias = tokens[i + 1]
                i += 2
            out.append(Leaf(segs, alias))
            return i
        raise ValueError(f"unexpected token {t!r} in use tree")
    return i


def parse_use(body: str) -> list[Leaf]:
    """Leaves of `body`, the text after `use selfheal_core::` up to (not including) the `;`."""
    tokens = tokenize_use(body)
    out: list[Leaf] = []
    i = 0
    while i < len(tokens):
        i = parse_tree(tokens, i, [], out)
        if i < len(tokens) and tokens[i] == ",":
            i += 1
    return out


def render_leaf(leaf: Leaf) -> str:
    s = "::".join(leaf.segs)
    if leaf.alias:
        s += f" as {leaf.alias}"
    return s


def sort_names(names: list[str]) -> list[str]:
    """`self` first, then rustfmt's (2024) order: upper-case initial before lower-case."""

    def key(n: str):
        return (0 if n == "self" else 1, n)

    return sorted(names, key=key)


def render_use(vis: str, leaves: list[Leaf], indent: str = "") -> str:
    """One use statement over `leaves`, nested paths grouped (`conformance::{self, Row}`)."""
    groups: dict[str, list[Leaf]] = {}
    singles: list[Leaf] = []
    for leaf in leaves:
        if len(leaf.segs) > 1:
            groups.setdefault(leaf.segs[0], []).append(Leaf(leaf.segs[1:], leaf.alias))
        else:
            singles.append(leaf)
    parts: list[str] = []
    for leaf in singles:
        r = render_leaf(leaf)
        if r not in parts:
            parts.append(r)
    for head, subs in groups.items():
        inner: list[str] = []
        for sub in subs:
            r = render_leaf(sub)
            if r not in inner:
                inner.append(r)
        inner = sort_names(inner)
        parts.append(f"{head}::{inner[0]}" if len(inner) == 1 else f"{head}::{{{', '.join(inner)}}}")
    parts = sort_names(parts)
    if len(parts) == 1:
        return f"{vis}use selfheal_core::{parts[0]};"
    one = f"{vis}use selfheal_core::{{{', '.join(parts)}}};"
    if len(indent) + len(one) <= WIDTH:
        return one
    # Wrapped as rustfmt would: the names filled into lines under one level of indent.
    lines = [f"{vis}use selfheal_core::{{"]
    line = indent + "    "
    for p in parts:
        piece = p + ","
        if line.strip() and len(line) + 1 + len(piece) > WIDTH:
            lines.append(line)
            line = indent + "    "
        line += (" " if line.strip() else "") + piece
    lines.append(line)
    lines.append(indent + "};")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# The curated API, read from lib.rs
# ---------------------------------------------------------------------------------------------


@dataclass
class Api:
    public_modules: set[str] = field(default_factory=set)
    private_modules: set[str] = field(default_factory=set)
    # (module, item) -> root name
    exports: dict[tuple[str, str], str] = field(default_factory=dict)
    # item name -> root name, for an item reached through another module than its own
    fallback: dict[str, str] = field(default_factory=dict)

    @property
    def root_names(self) -> set[str]:
        return set(self.exports.values())

    def export(self, module: str, item: str) -> str | None:
        """The root name of `module::item`, if lib.rs re-exports it."""
        return self.exports.get((module, item)) or self.fallback.get(item)

    def map_leaf(self, leaf: Leaf) -> tuple[Leaf | None, str | None]:
        """The rewritten leaf (None: drop it, a module import) and a problem, if any."""
        segs = leaf.segs
        if not segs or segs[0] not in self.private_modules:
            return leaf, None
        if len(segs) == 1 and segs[0] in self.root_names:
            return leaf, None  # a root item named as its module (`replay`)
        if len(segs) == 1 or segs[1] == "self":
            return None, None  # a module import: its uses in the file are rewritten instead
        if segs[1] == "*":
            return leaf, f"glob import from private module `{segs[0]}`"
        name = self.export(segs[0], segs[1])
        if name is None:
            return leaf, f"`{segs[0]}::{segs[1]}` is not re-exported by lib.rs"
        return Leaf([name] + segs[2:], leaf.alias), None


def read_api(root: str) -> Api:
    text = open(os.path.join(root, LIB_RS), encoding="utf-8").read()
    api = Api()
    for m in re.finditer(r"^(\s*)(pub\s+)?mod\s+(" + IDENT + r")\s*;", text, re.M):
        (api.public_modules if m.group(2) else api.private_modules).add(m.group(3))
    for m in re.finditer(r"^\s*pub\s+use\s+([^;]+);", text, re.M):
        for leaf in parse_use(m.group(1)):
            if leaf.segs[0] in ("crate", "self"):
                leaf = Leaf(leaf.segs[1:], leaf.alias)
            if len(leaf.segs) >= 2 and leaf.segs[0] in api.private_modules | api.public_modules:
                api.exports[(leaf.segs[0], leaf.segs[1])] = leaf.alias or leaf.segs[-1]
    # A module's own re-export of another's item (`monitor::CircuitState`, from `breaker`) is
    # the root item of that name, when one is exported under its own name.
    api.fallback = {item: name for (_, item), name in api.exports.items() if item == name}
    return api


# ---------------------------------------------------------------------------------------------
# Rewriting one text
# ---------------------------------------------------------------------------------------------

# A use statement begins its line (prose that quotes one in backticks is not one).
USE_RE = re.compile(r"(?m)^(?P<ind>[ \t]*)(?P<vis>pub(?:\([^)]*\))?\s+)?use\s+(?:::)?selfheal_core::")
INLINE_RE = re.compile(r"(?<![\w:])selfheal_core::(" + IDENT + r")(?:::(" + IDENT + r"))?")
DEFINES_RE = r"\b(?:struct|enum|type|trait|fn|const|static|union)\s+{}\b"


@dataclass
class Problem:
    path: str
    line: int
    what: str


def find_uses(text: str) -> list[tuple[int, int, str, str]]:
    """(start, end, visibility, body) of every `use selfheal_core::...;` in `text`."""
    out = []
    for m in USE_RE.finditer(text):
        depth = 0
        j = m.end()
        while j < len(text):
            c = text[j]
            if c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
            elif c == ";" and depth <= 0:
                break
            j += 1
        else:
            continue
        out.append((m.end("ind"), j + 1, m.group("vis") or "", text[m.end() : j]))
    return out


def code_spans(text: str) -> list[tuple[int, int]]:
    """Spans of `text` that are code: not comments, not string or char literals."""
    spans = []
    i = 0
    start = 0
    n = len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            spans.append((start, i))
            j = text.find("\n", i)
            i = n if j < 0 else j
            start = i
            continue
        if text.startswith("/*", i):
            spans.append((start, i))
            depth = 0
            while i < n:
                if text.startswith("/*", i):
                    depth += 1
                    i += 2
                elif text.startswith("*/", i):
                    depth -= 1
                    i += 2
                    if depth == 0:
                        break
                else:
                    i += 1
            start = i
            continue
        raw = None
        if c in "rb" and (i == 0 or not re.match(r"\w", text[i - 1])):
            raw = re.match(r'b?r(#*)"', text[i:])
        if raw:
            spans.append((start, i))
            close = '"' + raw.group(1)
            j = text.find(close, i + raw.end())
            i = n if j < 0 else j + len(close)
            start = i
            continue
        if c == '"':
            spans.append((start, i))
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            i += 1
            start = i
            continue
        if c == "'":
            m = re.match(r"'(\\.[^']*|[^\\'])'", text[i:])
            if m:
                spans.append((start, i))
                i += m.end()
                start = i
                continue
        i += 1
    spans.append((start, n))
    return [(a, b) for a, b in spans if b > a]


def rename_in_code(text: str, renames: dict[str, str]) -> str:
    """Rename identifiers (not path tails like `x::Name`, not fields, not macros) in code."""
    if not renames:
        return text
    # `super::Name` and `self::Name` name the same import from a nested module (`mod tests`).
    pat = re.compile(
        r"(?:(?<=\bsuper::)|(?<=\bself::)|(?<![\w:.]))(" + "|".join(map(re.escape, renames)) + r")\b(?!\s*!)"
    )
    out = []
    last = 0
    for a, b in code_spans(text):
        out.append(text[last:a])
        out.append(pat.sub(lambda m: renames[m.group(1)], text[a:b]))
        last = b
    out.append(text[last:])
    return "".join(out)


def rename_in_blocks(text: str, renames: dict[str, str]) -> str:
    """Rename in the ``` code blocks of a doc comment or Markdown text, not in its prose."""
    parts = re.split(r"(^[ \t]*```[^\n]*$)", text, flags=re.M)
    inside = False
    for n, part in enumerate(parts):
        if n % 2 == 1:
            inside = not inside
        elif inside:
            parts[n] = rename_in_code(part, renames)
    return "".join(parts)


def line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def defines(text: str, name: str) -> bool:
    return re.search(DEFINES_RE.format(re.escape(name)), text) is not None


def rewrite(text: str, api: Api, path: str, base_line: int, problems: list[Problem], *, is_code: bool) -> str:
    """Rewrite the use statements and inline paths of one text (a file's code, a doc block)."""

    def where(pos: int) -> int:
        return base_line + line_of(text, pos) - 1

    # Module imports (`use selfheal_core::call;`) whose `call::X` uses must be rewritten.
    modules: dict[str, str] = {}
    for start, _, _, body in find_uses(text):
        try:
            leaves = parse_use(body)
        except ValueError:
            continue
        for leaf in leaves:
            segs = leaf.segs
            if not segs or segs[0] not in api.private_modules:
                continue
            if (len(segs) == 1 and segs[0] not in api.root_names) or (len(segs) > 1 and segs[1] == "self"):
                modules[leaf.local() or segs[0]] = segs[0]

    extra: set[str] = set()
    if modules:
        mod_re = re.compile(r"(?<![\w:.])(" + "|".join(map(re.escape, modules)) + r")::(" + IDENT + r")")

        def sub_mod(m: re.Match) -> str:
            module = modules[m.group(1)]
            name = api.export(module, m.group(2))
            if name is None:
                problems.append(Problem(path, where(m.start()), f"`{module}::{m.group(2)}` is not re-exported by lib.rs"))
                return m.group(0)
            if defines(text, name):
                return f"selfheal_core::{name}"  # the file has its own item of that name
            extra.add(name)
            return name

        pieces = []
        last = 0
        for s, e, _, _ in find_uses(text):
            pieces.append(mod_re.sub(sub_mod, text[last:s]))
            pieces.append(text[s:e])
            last = e
        pieces.append(mod_re.sub(sub_mod, text[last:]))
        text = "".join(pieces)

    parsed = []
    for start, end, vis, body in find_uses(text):
        try:
            leaves = parse_use(body)
        except ValueError as e:
            problems.append(Problem(path, where(start), f"cannot parse use: {e}"))
            leaves = None
        parsed.append((start, end, vis, leaves))

    # Rewrite the use statements; merge a run of adjacent ones (same visibility) into the first.
    renames: dict[str, str] = {}
    new_text: list[str] = []
    last = 0
    i = 0
    extra_placed = not extra
    while i < len(parsed):
        start, end, vis, leaves = parsed[i]
        if leaves is None:
            i += 1
            continue
        group = [(start, end, leaves)]
        j = i + 1
        while j < len(parsed):
            s2, _, v2, l2 = parsed[j]
            between = text[group[-1][1] : s2]
            if l2 is None or v2 != vis or not re.fullmatch(r"[ \t]*\n[ \t]*", between):
                break
            group.append((s2, parsed[j][1], l2))
            j += 1
        all_leaves: list[Leaf] = []
        changed = len(group) > 1
        for s, _, ls in group:
            for leaf in ls:
                new, problem = api.map_leaf(leaf)
                if problem:
                    problems.append(Problem(path, where(s), problem))
                if new is None:
                    changed = True
                    continue
                if new.segs != leaf.segs:
                    changed = True
                    old_local = leaf.local()
                    if vis and leaf.alias is None and new.segs[-1] != leaf.segs[-1]:
                        # A re-export keeps the name it gives its own crate's users.
                        new = Leaf(new.segs, leaf.segs[-1])
                    elif leaf.alias is None and new.segs[-1] != leaf.segs[-1] and old_local:
                        renames[old_local] = new.segs[-1]
                    elif leaf.alias == new.segs[-1]:
                        # `call::Mode as CallMode` is the root name itself; other aliases stay.
                        new = Leaf(new.segs, None)
                all_leaves.append(new)
        if not extra_placed and not vis:
            all_leaves.extend(Leaf([name]) for name in sorted(extra))
            extra_placed = True
            changed = True
        line_start = text.rfind("\n", 0, start) + 1
        indent = re.match(r"[ \t]*", text[line_start:start]).group(0)
        new_text.append(text[last:start])
        last = group[-1][1]
        if not changed:
            new_text.append(text[start:last])
        elif all_leaves:
            new_text.append(render_use(vis, all_leaves, indent))
        else:
            # Nothing left to import: drop the statement and its line.
            new_text[-1] = new_text[-1].rstrip(" \t")
            if text[last : last + 1] == "\n":
                last += 1
        i = j
    new_text.append(text[last:])
    text = "".join(new_text)
    if not extra_placed:
        problems.append(Problem(path, base_line, f"no private use statement to add {sorted(extra)} to"))

    # A renamed item imported under its old name: rename it in the code.
    if renames:
        text = rename_in_code(text, renames) if is_code else rename_in_blocks(text, renames)

    # Inline paths: `selfheal_core::module::Item` anywhere (code, comments, docs).
    def sub_inline(m: re.Match) -> str:
        module, item = m.group(1), m.group(2)
        if module not in api.private_modules:
            return m.group(0)
        if item is None and module in api.root_names:
            return m.group(0)  # the root item named as its module (`selfheal_core::replay(..)`)
        if item is None:
            problems.append(Problem(path, where(m.start()), f"mentions private module `selfheal_core::{module}`"))
            return m.group(0)
        name = api.export(module, item)
        if name is None:
            problems.append(Problem(path, where(m.start()), f"`{module}::{item}` is not re-exported by lib.rs"))
            return m.group(0)
        return f"selfheal_core::{name}"

    return INLINE_RE.sub(sub_inline, text)


DOC_LINE = re.compile(r"^(?P<ind>[ \t]*)(?P<mark>//!|///)(?P<rest>.*)$")
PLACEHOLDER = "\x00DOC\x00"


def rewrite_rust(text: str, api: Api, path: str, problems: list[Problem]) -> str:
    """Rewrite a Rust file: its code, and each doc-comment block as its own text (doc tests)."""
    lines = text.split("\n")
    blocks: list[tuple[int, int, str, str]] = []  # first line, end line (excl.), indent, marker
    i = 0
    while i < len(lines):
        m = DOC_LINE.match(lines[i])
        if not m:
            i += 1
            continue
        ind, mark = m.group("ind"), m.group("mark")
        j = i
        while j < len(lines):
            m2 = DOC_LINE.match(lines[j])
            if not m2 or m2.group("ind") != ind or m2.group("mark") != mark:
                break
            j += 1
        blocks.append((i, j, ind, mark))
        i = j

    # The code, with each doc line a placeholder line, is one text; each doc block another.
    masked = list(lines)
    for a, b, _, _ in blocks:
        for k in range(a, b):
            masked[k] = PLACEHOLDER
    code_lines = rewrite("\n".join(masked), api, path, 1, problems, is_code=True).split("\n")

    result: list[str] = []
    block_iter = iter(blocks)
    k = 0
    while k < len(code_lines):
        if code_lines[k] != PLACEHOLDER:
            result.append(code_lines[k])
            k += 1
            continue
        a, b, ind, mark = next(block_iter)
        contents = []
        for line in lines[a:b]:
            rest = DOC_LINE.match(line).group("rest")
            contents.append(rest[1:] if rest.startswith(" ") else rest)
        new = rewrite("\n".join(contents), api, path, a + 1, problems, is_code=False)
        for c in new.split("\n"):
            result.append(f"{ind}{mark} {c}" if c else f"{ind}{mark}")
        k += b - a
    return "\n".join(result)


# ---------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------


def files(root: str):
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("."))
        for f in sorted(filenames):
            if f in SKIP_FILES or not f.endswith((".rs", ".md")):
                continue
            yield os.path.relpath(os.path.join(dirpath, f), root)


def inventory(root: str, api: Api) -> None:
    count: Counter[tuple[str, str]] = Counter()
    for rel in files(root):
        if rel.startswith(CORE_SRC) and rel.endswith(".rs"):
            continue
        text = open(os.path.join(root, rel), encoding="utf-8").read()
        for _, _, _, body in find_uses(text):
            try:
                leaves = parse_use(body)
            except ValueError:
                continue
            for leaf in leaves:
                if len(leaf.segs) >= 2 and leaf.segs[1] not in ("self", "*"):
                    count[(leaf.segs[0], leaf.segs[1])] += 1
        for m in INLINE_RE.finditer(text):
            if m.group(2):
                count[(m.group(1), m.group(2))] += 1
    for (module, item), n in sorted(count.items()):
        mapped = api.export(module, item)
        note = "" if module not in api.private_modules else (f"-> {mapped}" if mapped else "UNMAPPED")
        print(f"{module}::{item}\t{n}\t{note}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default=ROOT, help="the workspace root (default: this script's repository)")
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 if a file would change")
    ap.add_argument("--inventory", action="store_true", help="list the (module, item) pairs used outside the core")
    ap.add_argument("--renames", action="store_true", help="list the items whose root name is not their own")
    ap.add_argument("paths", nargs="*", help="only these files (default: every .rs and .md)")
    args = ap.parse_args()
    root = os.path.abspath(args.root)
    api = read_api(root)
    if args.inventory:
        inventory(root, api)
        return 0
    if args.renames:
        for (module, item), name in sorted(api.exports.items()):
            if item != name:
                print(f"{module}::{item}\t-> {name}")
        return 0
    problems: list[Problem] = []
    changed = []
    targets = [os.path.relpath(os.path.abspath(p), root) for p in args.paths] if args.paths else list(files(root))
    for rel in targets:
        full = os.path.join(root, rel)
        text = open(full, encoding="utf-8").read()
        if "selfheal_core" not in text:
            continue
        if rel.endswith(".rs"):
            new = rewrite_rust(text, api, rel, problems)
        else:
            new = rewrite(text, api, rel, 1, problems, is_code=False)
        if new != text:
            changed.append(rel)
            if not args.check:
                with open(full, "w", encoding="utf-8") as f:
                    f.write(new)
    for rel in changed:
        print(("would rewrite " if args.check else "rewrote ") + rel)
    for p in problems:
        print(f"{p.path}:{p.line}: {p.what}", file=sys.stderr)
    verb = "to rewrite" if args.check else "rewritten"
    print(f"{len(changed)} file(s) {verb}, {len(problems)} left to fix by hand", file=sys.stderr)
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
