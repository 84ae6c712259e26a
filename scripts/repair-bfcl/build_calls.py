#!/usr/bin/env python3
"""Build $CACHE/calls.jsonl from the BFCL dataset shipped in the bfcl-eval wheel.

For every ground-truth call: each parameter takes the first acceptable value that is not ""
(parameter skipped when "" is the only option).  Dict-typed parameters (dict/HashMap/Hashtable/
object) and arrays of dicts hold BFCL "dict of option lists" answers (see bfcl_eval
eval_checker/ast_eval/ast_checker.py dict_checker/list_dict_checker); those are resolved the same
way one level down.

Each call is also checked with the `jsonschema` package against a normalised copy of its schema
(dict->object, float/double->number, tuple/Array/ArrayList->array, HashMap->object, any->no type,
String->string, long->integer, ...): field valid_per_schema (+ schema_errors).

Run: scripts/repair-bfcl.sh (which runs this after downloading the wheel)
"""
import json
import os
import sys
from collections import Counter

import jsonschema

# Where scripts/repair-bfcl.sh keeps the venv, the unpacked bfcl-eval wheel and the calls.
CACHE = os.environ.get("REPAIR_BFCL_CACHE", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".cache", "repair-bfcl"))

DATA = os.path.join(CACHE, "whl", "bfcl_eval", "data")
OUT = os.path.join(CACHE, "calls.jsonl")
CATS = ["simple_python", "simple_java", "simple_javascript", "multiple", "parallel",
        "parallel_multiple"]

# Non-standard type names -> JSON Schema type (None = no type constraint).
TYPE_MAP = {
    "dict": "object", "object": "object", "HashMap": "object", "Hashtable": "object",
    "float": "number", "double": "number", "number": "number",
    "tuple": "array", "array": "array", "list": "array", "Array": "array",
    "ArrayList": "array", "Queue": "array", "Stack": "array", "Set": "array",
    "integer": "integer", "int": "integer", "long": "integer", "short": "integer",
    "byte": "integer", "Bigint": "integer",
    "string": "string", "String": "string", "char": "string",
    "boolean": "boolean", "bool": "boolean", "Boolean": "boolean",
    "null": "null",
    "any": None, "Any": None, "": None,
}
DICT_TYPES = {"dict", "object", "HashMap", "Hashtable"}

unknown_types = Counter()


def normalise(s):
    """Return a standard JSON-Schema copy of a BFCL schema node."""
    if isinstance(s, list):
        return [normalise(x) for x in s]
    if not isinstance(s, dict):
        return s
    out = {}
    for k, v in s.items():
        if k == "type":
            if isinstance(v, str):
                if v in TYPE_MAP:
                    if TYPE_MAP[v] is not None:
                        out["type"] = TYPE_MAP[v]
                elif v.lower() in TYPE_MAP and TYPE_MAP[v.lower()] is not None:
                    out["type"] = TYPE_MAP[v.lower()]
                else:
                    unknown_types[v] += 1
                    out["type"] = v
            else:
                out["type"] = v
        elif k == "properties" and isinstance(v, dict):
            out[k] = {pk: normalise(pv) for pk, pv in v.items()}
        elif k in ("items", "additionalProperties", "not", "if", "then", "else"):
            out[k] = normalise(v)
        elif k in ("anyOf", "oneOf", "allOf", "prefixItems"):
            out[k] = normalise(v)
        elif k == "optional":
            continue  # BFCL-only annotation
        else:
            out[k] = v
    return out


def is_opt_dict(v):
    return isinstance(v, dict) and all(isinstance(x, list) for x in v.values())


def pick(options):
    """First acceptable value that is not "" ; returns (found, value)."""
    for o in options:
        if o != "":
            return True, o
    return False, None


def resolve_value(value, pschema, notes):
    t = pschema.get("type") if isinstance(pschema, dict) else None
    if t in DICT_TYPES and is_opt_dict(value):
        return resolve_dict(value, pschema, notes)
    if t in DICT_TYPES and isinstance(value, dict):
        notes.append("dict answer not in option-list form; kept as is")
        return value
    items = pschema.get("items") if isinstance(pschema, dict) else None
    if isinstance(value, list) and value and all(isinstance(x, dict) for x in value) and (
            isinstance(items, dict) and items.get("type") in DICT_TYPES):
        out = []
        for x in value:
            if is_opt_dict(x):
                out.append(resolve_dict(x, items, notes))
            else:
                notes.append("list-of-dict element not in option-list form; kept")
                out.append(x)
        return out
    return value


def resolve_dict(optdict, schema, notes):
    props = schema.get("properties") or {}
    out = {}
    for k, opts in optdict.items():
        ok, v = pick(opts)
        if not ok:
            continue
        out[k] = resolve_value(v, props.get(k, {}), notes)
    return out


def main():
    stats = Counter()
    unresolved = []
    n = 0
    with open(OUT, "w") as fo:
        for cat in CATS:
            qpath = os.path.join(DATA, f"BFCL_v4_{cat}.json")
            apath = os.path.join(DATA, "possible_answer", f"BFCL_v4_{cat}.json")
            if not (os.path.exists(qpath) and os.path.exists(apath)):
                print("missing", cat, file=sys.stderr)
                continue
            questions = {}
            for line in open(qpath):
                if line.strip():
                    d = json.loads(line)
                    questions[d["id"]] = d
            for line in open(apath):
                if not line.strip():
                    continue
                a = json.loads(line)
                q = questions.get(a["id"])
                if q is None:
                    unresolved.append((a["id"], "no question"))
                    continue
                funcs = {f["name"]: f for f in q["function"]}
                for i, gt in enumerate(a["ground_truth"]):
                    (name, params), = gt.items()
                    f = funcs.get(name)
                    if f is None:
                        unresolved.append((a["id"], f"function {name} not found"))
                        continue
                    schema = f["parameters"]
                    notes = []
                    args = resolve_dict(params, schema, notes)
                    norm = normalise(schema)
                    errs = []
                    try:
                        cls = jsonschema.validators.validator_for(norm, default=jsonschema.Draft202012Validator)
                        cls.check_schema(norm)
                        v = cls(norm)
                        errs = [f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
                                for e in sorted(v.iter_errors(args), key=lambda e: list(map(str, e.path)))]
                        valid = not errs
                    except jsonschema.exceptions.SchemaError as e:
                        valid = None
                        errs = [f"schema error: {e.message}"]
                    rec = {
                        "source": os.path.basename(qpath),
                        "category": cat,
                        "id": f"{a['id']}#{i}",
                        "tool": name,
                        "schema": schema,
                        "args": args,
                        "valid_per_schema": valid,
                    }
                    if errs:
                        rec["schema_errors"] = errs[:5]
                    if notes:
                        rec["notes"] = notes
                    fo.write(json.dumps(rec, ensure_ascii=False) + "\n")
                    n += 1
                    stats[(cat, valid)] += 1
    print(f"wrote {n} calls to {OUT}")
    for (cat, valid), c in sorted(stats.items(), key=lambda x: (x[0][0], str(x[0][1]))):
        print(f"  {cat:20s} valid_per_schema={valid}: {c}")
    if unresolved:
        print("unresolved:", len(unresolved), unresolved[:10])
    if unknown_types:
        print("unknown types left as is:", dict(unknown_types))


if __name__ == "__main__":
    main()
