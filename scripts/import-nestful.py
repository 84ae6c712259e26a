#!/usr/bin/env python3
"""Convert the NESTFUL executable set into `selfheal bench --tasks` JSONL.

NESTFUL (Basu et al., "NESTFUL: A Benchmark for Evaluating LLMs on Nested Sequences of API
Calls", IBM Research) is distributed on PyPI as `nestful-wrapper` under the Apache License 2.0.
This script reads its executable split (85 nested call sequences over 39 real API specs, with
`$varN.field$` references between calls) and writes one task per line in the format of
docs/bench/tasks.md. The tools are simulated deterministically from their specs by selfheal
bench: it cannot call RapidAPI, so outputs are synthesised from each tool's output parameters
and the arguments, and the expected answer is the simulated world's fault-free answer.

Usage:
    pip download --no-deps -d /tmp/nf nestful-wrapper
    python3 scripts/import-nestful.py /tmp/nf/nestful_wrapper-*.whl > data/nestful.jsonl

Attribution: the task sequences and tool specs are from NESTFUL, Copyright IBM, Apache-2.0
(see data/NESTFUL-LICENSE).
"""

import json
import re
import sys
import zipfile

TYPES = {
    "string": "string",
    "number": "number",
    "float": "number",
    "integer": "integer",
    "boolean": "boolean",
    "array": "array",
    "object": "object",
}

REF = re.compile(r"\$([^$]+)\$")


def split_ref(inner):
    """`var1.a.b[0].c` -> ("var1", "a.b[0].c")."""
    m = re.match(r"([A-Za-z_][A-Za-z0-9_]*)(.*)", inner)
    label, rest = m.group(1), m.group(2)
    return label, rest[1:] if rest.startswith(".") else rest


def close_refs(value, labels):
    """One reference in the source data lacks its closing `$` (`"$var1.artist_id"`): close it."""
    if isinstance(value, str) and value.startswith("$") and value.count("$") == 1:
        label, _ = split_ref(value[1:])
        if label in labels:
            return value + "$"
    return value


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    with zipfile.ZipFile(sys.argv[1]) as z:
        data = json.loads(z.read("data_v1/executable/executable-data.json"))
        specs = json.loads(z.read("data_v1/executable/executable-spec.json"))
    by_name = {s["name"]: s for s in specs}
    for i, sample in enumerate(data):
        calls = [c for c in sample["output"] if c["name"] != "var_result"]
        result = next((c for c in sample["output"] if c["name"] == "var_result"), None)
        labels = {c.get("label"): c["name"] for c in calls if c.get("label")}
        for c in calls + ([result] if result else []):
            c["arguments"] = {k: close_refs(v, labels) for k, v in c["arguments"].items()}
        # Output paths each tool must produce: its declared outputs plus every path referenced.
        outputs = {}
        param_types = {}
        for c in calls:
            spec = by_name[c["name"]]
            out = outputs.setdefault(c["name"], {})
            for k, p in (spec.get("output_parameters") or {}).items():
                out.setdefault(k, TYPES.get(p.get("type"), "string"))
            for pk, pv in spec.get("query_parameters", {}).items():
                param_types[(c["name"], pk)] = TYPES.get(pv.get("type"), "string")

        def see(value, fed_type):
            if not isinstance(value, str):
                return
            for inner in REF.findall(value):
                label, path = split_ref(inner)
                tool = labels.get(label)
                if tool is None or path == "":
                    continue
                whole = value == "$" + inner + "$"
                outputs[tool][path] = fed_type if whole and fed_type in ("number", "integer", "boolean") else "string"

        for c in calls:
            for k, v in c["arguments"].items():
                see(v, param_types.get((c["name"], k), "string"))
        if result:
            for v in result["arguments"].values():
                see(v, "string")

        tools = []
        for name in dict.fromkeys(c["name"] for c in calls):
            spec = by_name[name]
            props, required = {}, []
            for pk, pv in spec.get("query_parameters", {}).items():
                props[pk] = {"type": TYPES.get(pv.get("type"), "string")}
                if pv.get("required"):
                    required.append(pk)
            tools.append(
                {
                    "name": name,
                    "description": spec.get("description", ""),
                    "parameters": {"type": "object", "properties": props, "required": required},
                    "output": outputs[name],
                    "external": True,
                }
            )
        plan = [
            {"tool": c["name"], "args": c["arguments"], "label": c.get("label", f"step{j}")}
            for j, c in enumerate(calls)
        ]
        line = {
            "id": f"nestful-{i}",
            "query": sample["input"],
            "tools": tools,
            "plan": plan,
        }
        if result:
            line["answer"] = result["arguments"]
        print(json.dumps(line, ensure_ascii=False, sort_keys=False))


if __name__ == "__main__":
    main()
