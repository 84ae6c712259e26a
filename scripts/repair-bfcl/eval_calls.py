#!/usr/bin/env python3
"""Check `selfheal repair --schema` on real function-calling data (BFCL ground-truth calls).

usage: scripts/repair-bfcl.sh BINARY [--limit N] [--show N]
                                  [--calls FILE] [--budget SECONDS] [--offset N] [--out FILE] [--workers 2]

Input: $CACHE/calls.jsonl (built by build_calls.py). For every call the raw BFCL
`parameters` dict is written to a temp file and `BINARY repair --schema FILE` is run with the
argument JSON on stdin.

 a. valid input unchanged   (calls valid per jsonschema; compact and pretty-printed text; byte
    for byte, and a value equal but written otherwise counted apart)
 b. repairable corruptions  (calls valid per jsonschema; 10 corruptions of the compact text)
 c. truncation              (calls valid per jsonschema; up to 3 seeded cut points per call, each of a different kind
                             inside a string value / inside a key / after ':' / after ',')
 plus, for information, what happens to the clean compact text of calls that violate their
 own schema.

Values are compared as JSON values with types kept: 5 vs 5.0 is a change, true vs 1 is a change.
"""
import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor, as_completed

# Where scripts/repair-bfcl.sh keeps the venv, the unpacked bfcl-eval wheel and the calls.
CACHE = os.environ.get("REPAIR_BFCL_CACHE", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".cache", "repair-bfcl"))

CALLS = os.path.join(CACHE, "calls.jsonl")
TIMEOUT = 20
SEED = 20240601

# ---------------------------------------------------------------- comparison


def jeq(a, b):
    """JSON-value equality keeping the int/float/bool distinction."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(jeq(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(jeq(x, y) for x, y in zip(a, b))
    return a == b


def first_diff(a, b, path=()):
    """Path of the first difference between expected a and got b (None if equal)."""
    if type(a) is not type(b):
        return path
    if isinstance(a, dict):
        for k in a:
            if k not in b:
                return path + (k,)
            d = first_diff(a[k], b[k], path + (k,))
            if d is not None:
                return d
        for k in b:
            if k not in a:
                return path + (k,)
        return None
    if isinstance(a, list):
        for i, (x, y) in enumerate(zip(a, b)):
            d = first_diff(x, y, path + (i,))
            if d is not None:
                return d
        if len(a) != len(b):
            return path + (min(len(a), len(b)),)
        return None
    return None if a == b else path


def schema_at(schema, path):
    node = schema
    for p in path:
        if not isinstance(node, dict):
            return None
        if isinstance(p, int):
            node = node.get("items")
        else:
            node = (node.get("properties") or {}).get(p)
        if node is None:
            return None
    return node


def strip_desc(s):
    if isinstance(s, dict):
        return {k: strip_desc(v) for k, v in s.items() if k != "description"}
    if isinstance(s, list):
        return [strip_desc(x) for x in s]
    return s


def short(s, n=300):
    s = s if isinstance(s, str) else json.dumps(s, ensure_ascii=False)
    return s if len(s) <= n else s[:n] + f"...(+{len(s) - n})"


# ---------------------------------------------------------------- tokenizer (compact JSON)


def tokens(text):
    """Scan json.dumps(separators=(',',':')) text. Returns dict with lists of
    strings [(start, end_incl, is_key)], literals [(start, word)], colons, commas."""
    strings, literals, colons, commas = [], [], [], []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            j = i + 1
            while text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            is_key = j + 1 < n and text[j + 1] == ":"
            strings.append((i, j, is_key))
            i = j + 1
            continue
        if c == ":":
            colons.append(i)
        elif c == ",":
            commas.append(i)
        else:
            for w in ("true", "false", "null"):
                if text.startswith(w, i):
                    literals.append((i, w))
                    i += len(w) - 1
                    break
        i += 1
    return {"strings": strings, "literals": literals, "colons": colons, "commas": commas}


def splice(text, edits):
    """edits: list of (start, end_excl, replacement), non-overlapping."""
    out, last = [], 0
    for s, e, r in sorted(edits):
        out.append(text[last:s])
        out.append(r)
        last = e
    out.append(text[last:])
    return "".join(out)


IDENT = re.compile(r"^[A-Za-z_$][A-Za-z0-9_$]*$")


def c_single_quotes(t, tk):
    edits = []
    for s, e, _ in tk["strings"]:
        body = t[s + 1:e]
        if "'" in body or '"' in body or "\\" in body:
            continue
        edits.append((s, e + 1, "'" + body + "'"))
    return splice(t, edits) if edits else None


def c_python_literals(t, tk):
    m = {"true": "True", "false": "False", "null": "None"}
    edits = [(s, s + len(w), m[w]) for s, w in tk["literals"]]
    return splice(t, edits) if edits else None


def c_trailing_comma(t, tk):
    if t == "{}" or not t.endswith("}"):
        return None
    return t[:-1] + ",}"


def c_missing_brace(t, tk):
    return t[:-1] if t.endswith("}") else None


def c_unquoted_keys(t, tk):
    edits = [(s, e + 1, t[s + 1:e]) for s, e, k in tk["strings"] if k and IDENT.match(t[s + 1:e])]
    return splice(t, edits) if edits else None


def c_fence(t, tk):
    return "```json\n" + t + "\n```"


def c_prose(t, tk):
    return "Sure! Here are the arguments: " + t + " Let me know."


def c_comment(t, tk):
    return "{\n// arguments for the call\n" + t[1:] if t.startswith("{") else None


def c_tool_call(t, tk):
    return "<tool_call>" + t + "</tool_call>"


def c_double_encoded(t, tk):
    return json.dumps(t, ensure_ascii=False)


CORRUPTIONS = [
    ("single_quotes", c_single_quotes),
    ("python_literals", c_python_literals),
    ("trailing_comma", c_trailing_comma),
    ("missing_final_brace", c_missing_brace),
    ("unquoted_keys", c_unquoted_keys),
    ("md_fence", c_fence),
    ("prose_around", c_prose),
    ("comment_line", c_comment),
    ("tool_call_tag", c_tool_call),
    ("double_encoded", c_double_encoded),
]


def cut_points(t, tk, rng, k=3):
    cands = {}
    for s, e, is_key in tk["strings"]:
        for p in range(s + 1, e + 1):  # text[:p] ends inside the string (closing quote cut)
            cands.setdefault(p, "in_key" if is_key else "in_string")
    for c in tk["colons"]:
        cands.setdefault(c + 1, "after_colon")
    for c in tk["commas"]:
        cands.setdefault(c + 1, "after_comma")
    cands = {p: w for p, w in cands.items() if 0 < p < len(t)}
    by_kind = defaultdict(list)
    for p in sorted(cands):
        by_kind[cands[p]].append(p)
    # balanced: up to k different kinds (random order), one random position in each
    kinds = sorted(by_kind)
    rng.shuffle(kinds)
    chosen = [(rng.choice(by_kind[w]), w) for w in kinds[:k]]
    return sorted(chosen)


# ---------------------------------------------------------------- running


def run(binary, schema_file, text):
    try:
        r = subprocess.run([binary, "repair", "--schema", schema_file], input=text.encode(),
                           capture_output=True, timeout=TIMEOUT)
        return r.returncode, r.stdout.decode(errors="replace"), r.stderr.decode(errors="replace")
    except subprocess.TimeoutExpired:
        return "timeout", "", ""


def parse_out(out):
    try:
        return True, json.loads(out)
    except Exception:
        return False, None


def classify(rc, out, args):
    """-> (kind, parsed)  kind in same / changed / refused / schema_error / other"""
    if rc == 0:
        ok, v = parse_out(out)
        if not ok:
            return "other(unparsable stdout)", None
        return ("same" if jeq(args, v) else "changed"), v
    if rc == 1:
        return "refused", None
    if rc == 2:
        return "schema_error", None
    return f"other(rc={rc})", None


def example(call, text, rc, out, err, got=None, extra=None):
    ex = {"id": call["id"], "input": short(text, 400), "rc": rc,
          "stdout": short(out.strip(), 400),
          "stderr1": (err.strip().splitlines() or [""])[0][:300]}
    path = first_diff(call["args"], got) if got is not None else None
    if path is not None:
        ex["diff_path"] = "/".join(map(str, path)) or "<root>"
        node = schema_at(call["schema"], path) if path else None
        ex["schema_at_diff"] = short(strip_desc(node), 250) if node is not None else None
        ex["expected_at_diff"] = short(json.dumps(_get(call["args"], path), ensure_ascii=False), 150)
        ex["got_at_diff"] = short(json.dumps(_get(got, path), ensure_ascii=False), 150)
    ex["schema"] = short(strip_desc(call["schema"]), 350)
    if extra:
        ex.update(extra)
    return ex


_MISSING = "<missing>"


def _get(v, path):
    for p in path:
        try:
            v = v[p]
        except (KeyError, IndexError, TypeError):
            return _MISSING
    return v


def eval_call(binary, call, tmpdir):
    res = {"id": call["id"], "category": call["category"], "a": [], "b": [], "c": [], "inv": None}
    sf = os.path.join(tmpdir, re.sub(r"[^A-Za-z0-9_.-]", "_", call["id"]) + ".schema.json")
    with open(sf, "w") as f:
        json.dump(call["schema"], f, ensure_ascii=False)
    args = call["args"]
    compact = json.dumps(args, separators=(",", ":"), ensure_ascii=False)
    try:
        if call["valid_per_schema"] is not True:
            rc, out, err = run(binary, sf, compact)
            kind, got = classify(rc, out, args)
            res["inv"] = (kind, example(call, compact, rc, out, err, got,
                                        {"schema_errors": call.get("schema_errors")}))
            return res
        pretty = json.dumps(args, indent=2, ensure_ascii=False)
        for fmt, text in (("compact", compact), ("pretty", pretty)):
            rc, out, err = run(binary, sf, text)
            kind, got = classify(rc, out, args)
            # Valid input must come back byte for byte, not only equal in value (issue 29).
            if kind == "same" and out.rstrip("\n") != text.strip():
                kind = "other_bytes"
            res["a"].append((fmt, kind, None if kind == "same" else example(call, text, rc, out, err, got)))
        tk = tokens(compact)
        for name, fn in CORRUPTIONS:
            text = fn(compact, tk)
            if text is None:
                continue
            rc, out, err = run(binary, sf, text)
            kind, got = classify(rc, out, args)
            kind = {"same": "restored", "changed": "WRONG"}.get(kind, kind)
            res["b"].append((name, kind, None if kind == "restored" else example(call, text, rc, out, err, got)))
        rng = random.Random(SEED ^ zlib.crc32(call["id"].encode()))
        for p, where in cut_points(compact, tk, rng):
            text = compact[:p]
            rc, out, err = run(binary, sf, text)
            kind, got = classify(rc, out, args)
            kind = {"same": "exit0_equal", "changed": "SILENT_LOSS"}.get(kind, kind)
            res["c"].append((where, kind, None if kind == "refused" else
                             example(call, text, rc, out, err, got, {"cut_at": p, "where": where,
                                                                     "full": short(compact, 400)})))
    finally:
        try:
            os.unlink(sf)
        except OSError:
            pass
    return res


# ---------------------------------------------------------------- report


def pct(a, n):
    return f"{100.0 * a / n:5.1f}%" if n else "   - "


def print_examples(title, exs, n):
    if not exs or n <= 0:
        return
    print(f"    -- {title}: {len(exs)} (showing {min(n, len(exs))})")
    for ex in exs[:n]:
        print("      " + json.dumps(ex, ensure_ascii=False))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("--limit", type=int, default=None, help="evaluate N calls (seeded sample)")
    ap.add_argument("--show", type=int, default=3, help="examples per failure kind")
    ap.add_argument("--calls", default=CALLS)
    ap.add_argument("--budget", type=float, default=None,
                    help="stop starting new calls after this many seconds")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--offset", type=int, default=0,
                    help="skip the first N calls of the seeded order (to continue a --budget run)")
    ap.add_argument("--out", default=os.path.join(CACHE, "results.json"),
                    help="full per-failure details (JSON)")
    a = ap.parse_args()

    calls = [json.loads(l) for l in open(a.calls) if l.strip()]
    # seeded shuffle so that --limit / --budget give a sample spread over all categories
    random.Random(SEED).shuffle(calls)
    calls = calls[a.offset:]
    if a.limit is not None:
        calls = calls[:a.limit]
    t0 = time.time()
    tmpdir = tempfile.mkdtemp(prefix="evalfc_", dir=CACHE)
    results = []
    stop = threading.Event()

    def task(c):
        if stop.is_set() or (a.budget and time.time() - t0 > a.budget):
            stop.set()
            return None
        return eval_call(a.binary, c, tmpdir)

    with ThreadPoolExecutor(max_workers=a.workers) as ex:
        futs = [ex.submit(task, c) for c in calls]
        done = 0
        for f in as_completed(futs):
            r = f.result()
            if r is not None:
                results.append(r)
            done += 1
            if done % 200 == 0:
                print(f"[{time.time() - t0:6.0f}s] {done}/{len(calls)}", file=sys.stderr, flush=True)
    try:
        os.rmdir(tmpdir)
    except OSError:
        pass
    elapsed = time.time() - t0
    results.sort(key=lambda r: r["id"])

    cats = Counter(r["category"] for r in results)
    nvalid = sum(1 for r in results if r["inv"] is None)
    print(f"binary: {a.binary}")
    print(f"calls evaluated: {len(results)} of {len(calls)} selected "
          f"({', '.join(f'{k} {v}' for k, v in sorted(cats.items()))}); "
          f"valid per jsonschema: {nvalid}, violating: {len(results) - nvalid}; "
          f"{elapsed:.0f}s")
    details = {"binary": a.binary, "n_calls": len(results), "elapsed_s": elapsed}

    # a
    print("\n(a) valid input unchanged (same: byte for byte; other_bytes: equal value, other text)")
    print(f"    {'format':8s} {'n':>5s} {'same':>6s} {'other_bytes':>11s} {'changed':>8s} {'refused':>8s} {'exit2':>6s} {'other':>6s}")
    det_a = {}
    for fmt in ("compact", "pretty"):
        rows = [(k, e) for r in results for f, k, e in r["a"] if f == fmt]
        c = Counter(k for k, _ in rows)
        other = sum(v for k, v in c.items()
                    if k not in ("same", "other_bytes", "changed", "refused", "schema_error"))
        print(f"    {fmt:8s} {len(rows):5d} {c['same']:6d} {c['other_bytes']:11d} {c['changed']:8d} "
              f"{c['refused']:8d} {c['schema_error']:6d} {other:6d}")
        det_a[fmt] = {k: [e for kk, e in rows if kk == k] for k in c if k != "same"}
    for fmt in det_a:
        for k, exs in det_a[fmt].items():
            print_examples(f"{fmt} {k}", exs, a.show)
    details["a"] = det_a

    # b
    print("\n(b) repairable corruptions restored (calls valid per schema)")
    print(f"    {'corruption':20s} {'n':>5s} {'restored':>9s} {'refused':>8s} {'WRONG':>6s} {'exit2':>6s} {'other':>6s}")
    det_b = {}
    clean_bad = {r["id"] for r in results for f, k, _ in r["a"] if f == "compact" and k != "same"}
    for name, _ in CORRUPTIONS:
        rows = [(k, e) for r in results for nm, k, e in r["b"] if nm == name]
        c = Counter(k for k, _ in rows)
        n = len(rows)
        other = sum(v for k, v in c.items() if k not in ("restored", "refused", "WRONG", "schema_error"))
        print(f"    {name:20s} {n:5d} {pct(c['restored'], n):>9s} {pct(c['refused'], n):>8s} "
              f"{c['WRONG']:6d} {c['schema_error']:6d} {other:6d}")
        det_b[name] = {k: [e for kk, e in rows if kk == k] for k in c if k != "restored"}
    tot = Counter(k for r in results for _, k, _ in r["b"])
    n = sum(tot.values())
    print(f"    {'ALL':20s} {n:5d} {pct(tot['restored'], n):>9s} {pct(tot['refused'], n):>8s} "
          f"{tot['WRONG']:6d} {tot['schema_error']:6d}")
    nb_clean = sum(1 for r in results for _, k, e in r["b"] if k != "restored" and r["id"] in clean_bad)
    print(f"    (of the non-restored, {nb_clean} belong to calls whose clean compact input already failed (a))")
    for name in det_b:
        for k, exs in det_b[name].items():
            print_examples(f"{name} {k}", exs, a.show)
    details["b"] = det_b

    # c
    print("\n(c) truncation (calls valid per schema; up to 3 seeded cuts each)")
    print(f"    {'cut':12s} {'n':>5s} {'exit1':>7s} {'SILENT_LOSS':>12s} {'exit0=args':>11s} {'exit2':>6s} {'other':>6s}")
    det_c = {}
    for where in ("in_string", "in_key", "after_colon", "after_comma", "ALL"):
        rows = [(k, e) for r in results for w, k, e in r["c"] if where in ("ALL", w)]
        c = Counter(k for k, _ in rows)
        n = len(rows)
        other = sum(v for k, v in c.items() if k not in ("refused", "SILENT_LOSS", "exit0_equal", "schema_error"))
        print(f"    {where:12s} {n:5d} {c['refused']:7d} {c['SILENT_LOSS']:12d} {c['exit0_equal']:11d} "
              f"{c['schema_error']:6d} {other:6d}")
        if where == "ALL":
            det_c = {k: [e for kk, e in rows if kk == k] for k in c if k != "refused"}
    for k, exs in det_c.items():
        print_examples(k, exs, a.show)
    details["c"] = det_c

    # invalid-per-schema calls
    inv = [r["inv"] for r in results if r["inv"] is not None]
    if inv:
        c = Counter(k for k, _ in inv)
        print(f"\n(info) calls violating their own schema (jsonschema, normalised types): {len(inv)}; "
              f"clean compact input -> {dict(c)}")
        for k in c:
            print_examples(f"violating-schema call, {k}", [e for kk, e in inv if kk == k], a.show)
        details["invalid_calls"] = [e for _, e in inv]
    with open(a.out, "w") as f:
        json.dump(details, f, ensure_ascii=False, indent=1)
    print(f"\nfull details: {a.out}")


if __name__ == "__main__":
    main()
