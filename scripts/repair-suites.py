#!/usr/bin/env python3
"""Measure `selfheal repair` against the upstream test suites of the two most used JSON-repair
libraries: PyPI `json_repair` (Python) and npm `jsonrepair` (JavaScript).

usage:
  scripts/repair-suites.py run BINARY [--suite python|javascript|both] [--show wrong|refused|match]
                                      [--limit N] [--groups] [--json FILE] [--flag=--complete ...]
  scripts/repair-suites.py check      # install both libraries and re-check every recorded answer

`run` feeds every recorded input to `BINARY repair` on stdin and sorts the outcome:

  match    exit 0 and the value printed equals the reference's (numbers compared numerically)
  wrong    exit 0 and another value, or exit 0 where the reference refuses (returns nothing/throws)
  refused  exit 1 (split by whether the reference refuses too)
  error    any other exit, a timeout, or exit 0 with stdout that is not JSON

and prints the three shares per suite, per category of input and per upstream test.

The cases live in scripts/repair-suites/{python,javascript}.jsonl (see the README there for where
they come from and their licences). `check` needs network access once: it creates
.cache/repair-suites/ with a Python venv holding `json_repair==PY_VERSION` from PyPI and
`jsonrepair@JS_VERSION` from npm, runs both libraries on every recorded input and reports any
case whose recorded answer the library no longer gives. `run` needs neither library.
"""
import argparse
import json
import math
import re
import subprocess
import sys
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CASES = {"python": HERE / "repair-suites" / "python.jsonl",
         "javascript": HERE / "repair-suites" / "javascript.jsonl"}
CACHE = ROOT / ".cache" / "repair-suites"
PY_VERSION = "0.64.4"
JS_VERSION = "3.15.0"
TIMEOUT = 10.0

# Category of an input, by the upstream test it comes from (first match wins), else by its text.
GROUP_CATEGORIES = [
    ("regex", r"regular expression"),
    ("comments", r"comment|jsonp"),
    ("python literals/tuples", r"python|tuple|parenthesized|boolean_or_null|mongodb|undefined"),
    ("concatenated values", r"multiple_json|newline separated|comma separated list|concatenate"),
    ("numbers", r"number|leading zero"),
    ("missing values", r"missing object value|missing colon"),
    ("truncation / missing brackets", r"truncat|closing brace|closing bracket|merge_at_the_end|"
     r"redundant closing|numbers at the end"),
    ("inner / early-ending quotes", r"quote|escap|string|delimiter|control char"),
    ("bare text / prose", r"unknown symbols|markdown|leading_trailing|llm_block|prose|fenced|"
     r"opening.*brace|speculative"),
]


# Upstream tests whose names say nothing of the input ("edge cases"): categorised by the text.
GENERIC_GROUPS = r"(object|array|string)_edge_cases|^test_parse_(object|array|string)$|with_objects|basic_types|object_edge"


def category(case):
    group = case["group"].lower()
    if not re.search(GENERIC_GROUPS, group):
        for name, pattern in GROUP_CATEGORIES:
            if re.search(pattern, group):
                return name
    text = case["input"]
    try:
        json.loads(text)
        return "valid JSON"
    except ValueError:
        pass
    if re.search(r"//|/\*|#", text):
        return "comments"
    if re.search(r"\b(None|True|False)\b|\(", text):
        return "python literals/tuples"
    if re.search(r":\s*[,}]", text):
        return "missing values"
    opens = sum(text.count(c) for c in "{[")
    closes = sum(text.count(c) for c in "}]")
    if opens > closes or text.replace('\\"', "").count('"') % 2:
        return "truncation / missing brackets" if opens > closes else "inner / early-ending quotes"
    if re.search(r"[}\]]\s*,?\s*[{\[]", text):
        return "concatenated values"
    return "other syntax"


def jeq(a, b):
    """JSON value equality: types kept, except that numbers compare numerically."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
            return True
        return a == b
    if isinstance(a, str) or isinstance(b, str):
        return type(a) is type(b) and a == b
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(jeq(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(jeq(x, y) for x, y in zip(a, b))
    return False


def load(suite):
    with open(CASES[suite], encoding="utf-8") as f:
        cases = [json.loads(line) for line in f]
    for i, c in enumerate(cases):
        c["idx"] = i
        c["category"] = category(c)
    return cases


def run_one(binary, case, extra=()):
    data = case["input"].encode("utf-8", "surrogatepass")
    try:
        p = subprocess.run([binary, "repair", *extra], input=data, capture_output=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        return {"status": "error", "why": "timeout"}
    stderr = p.stderr.decode("utf-8", "replace").strip()
    if p.returncode == 0:
        out = p.stdout.decode("utf-8", "replace")
        try:
            got = json.loads(out)
        except ValueError:
            return {"status": "error", "why": "exit 0, stdout is not JSON", "stdout": out[:200]}
        if case["refuse"]:
            return {"status": "wrong", "got": got, "why": "the reference refuses"}
        return {"status": "match" if jeq(got, case["expected"]) else "wrong", "got": got}
    if p.returncode == 1:
        return {"status": "refused", "stderr": stderr.splitlines()[0] if stderr else ""}
    return {"status": "error", "why": f"exit {p.returncode}", "stderr": stderr[-300:]}


def pct(a, n):
    return 100.0 * a / n if n else 0.0


def compact(v):
    return json.dumps(v, ensure_ascii=False, separators=(",", ":"))


def table(title, rows):
    print(f"  {title:<64} {'n':>4} {'match':>6} {'wrong':>6} {'refused':>8} {'(ref too)':>9} {'error':>6}")
    for name, c in rows:
        n = sum(c[k] for k in ("match", "wrong", "refused", "error"))
        print(f"  {name[:64]:<64} {n:>4} {c['match']:>6} {c['wrong']:>6} {c['refused']:>8}"
              f" {c['both_refuse']:>9} {c['error']:>6}")


def cmd_run(args):
    suites = ["python", "javascript"] if args.suite == "both" else [args.suite]
    report = {}
    for suite in suites:
        cases = load(suite)
        with ThreadPoolExecutor(max_workers=args.workers) as pool:
            results = list(pool.map(lambda c: run_one(args.binary, c, args.flag), cases))
        total, by_cat, by_group = Counter(), defaultdict(Counter), defaultdict(Counter)
        for c, r in zip(cases, results):
            r.update(idx=c["idx"], input=c["input"], category=c["category"], group=c["group"],
                     expected=None if c["refuse"] else c["expected"], ref_refuses=c["refuse"])
            keys = [r["status"]] + (["both_refuse"] if r["status"] == "refused" and c["refuse"] else [])
            for k in keys:
                total[k] += 1
                by_cat[c["category"]][k] += 1
                by_group[c["group"]][k] += 1
        n = len(cases)
        print(f"=== {suite}: {n} cases  (binary: {args.binary})")
        print(f"  match {total['match']} ({pct(total['match'], n):.1f} %)   "
              f"wrong with exit 0 {total['wrong']} ({pct(total['wrong'], n):.1f} %)   "
              f"refused {total['refused']} ({pct(total['refused'], n):.1f} %; the reference refuses "
              f"{total['both_refuse']} of them too)   error {total['error']}")
        table("category", sorted(by_cat.items(), key=lambda kv: -sum(kv[1].values())))
        if args.groups:
            table("upstream test", sorted(by_group.items()))
        if args.show:
            shown = [r for r in results if r["status"] == args.show][: args.limit]
            print(f"  --- {args.show}: {len(shown)} shown  (category | input | reference | got/stderr)")
            for r in shown:
                ref = "<refuses>" if r["ref_refuses"] else compact(r["expected"])
                got = compact(r["got"]) if "got" in r else r.get("stderr", r.get("why", ""))
                print(f"  [{r['category']}] {compact(r['input'])} | {ref} | {got}")
        print()
        report[suite] = {"n": n, **{k: total[k] for k in ("match", "wrong", "refused", "both_refuse", "error")}, "cases": results}
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, ensure_ascii=False, indent=1)
    return 0 if all(v["error"] == 0 for v in report.values()) else 1


JS_RUNNER = r"""
const { jsonrepair } = require('jsonrepair')
const inputs = JSON.parse(require('fs').readFileSync(0, 'utf8'))
process.stdout.write(JSON.stringify(inputs.map(t => {
  try { return { ok: true, out: jsonrepair(t) } } catch (e) { return { ok: false } }
})))
"""

PY_RUNNER = r"""
import json, sys
from json_repair import repair_json
out = []
for t in json.load(sys.stdin):
    r = repair_json(t)
    out.append({"ok": r != "", "out": r})
json.dump(out, sys.stdout)
"""


def cmd_check(_args):
    CACHE.mkdir(parents=True, exist_ok=True)
    venv = CACHE / "venv"
    py = venv / "bin" / "python"
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(py), "-m", "pip", "install", "-q", f"json_repair=={PY_VERSION}"], check=True)
    if not (CACHE / "node_modules" / "jsonrepair").exists():
        subprocess.run(["npm", "install", "--silent", "--prefix", str(CACHE), f"jsonrepair@{JS_VERSION}"],
                       check=True)
    bad = 0
    for suite, cmd in (("python", [str(py), "-c", PY_RUNNER]),
                       ("javascript", ["node", "-e", JS_RUNNER])):
        cases = load(suite)
        inputs = json.dumps([c["input"] for c in cases])
        out = subprocess.run(cmd, input=inputs, capture_output=True, text=True, check=True, cwd=CACHE).stdout
        for c, lib in zip(cases, json.loads(out)):
            same = (not lib["ok"] and c["refuse"]) or (
                lib["ok"] and not c["refuse"] and jeq(json.loads(lib["out"]), c["expected"]))
            if not same:
                bad += 1
                print(f"{suite} case {c['idx']}: recorded {compact(c['expected'])} refuse={c['refuse']}, "
                      f"library gives {lib}")
        print(f"{suite}: {len(cases)} cases checked against the installed library")
    print("all recorded answers are the libraries' own" if bad == 0 else f"{bad} differ")
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run BINARY repair on every case")
    r.add_argument("binary")
    r.add_argument("--suite", choices=["python", "javascript", "both"], default="both")
    r.add_argument("--show", choices=["wrong", "refused", "match", "error"])
    r.add_argument("--limit", type=int, default=1000)
    r.add_argument("--groups", action="store_true", help="also print one row per upstream test")
    r.add_argument("--json", metavar="FILE", help="write every case's outcome to FILE")
    r.add_argument("--workers", type=int, default=2)
    r.add_argument("--flag", action="append", default=[], metavar="FLAG",
                   help="pass FLAG to `repair` (e.g. --flag=--complete); repeatable")
    sub.add_parser("check", help="install both libraries and re-check the recorded answers")
    args = ap.parse_args()
    return cmd_run(args) if args.cmd == "run" else cmd_check(args)


if __name__ == "__main__":
    sys.exit(main())
