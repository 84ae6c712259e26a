#!/usr/bin/env python3
"""Why self-healing loses where it loses: runs `selfheal bench --trace` on fault models and
tabulates how self-healing's faulted episodes end, next to the better equal-detector baseline
(`react+verify` / `full-replan+verify`, the one with more recovered episodes).

Per file and fault rate it prints the faulted episodes, recovered ones per strategy, and for
self-healing's faulted episodes that did not succeed, how the run ended: the core's `finished`
reason with step numbers and values folded away (`the value recovered from tool_unavailable
could not be verified (cross_check: … did not answer)` and so on), and the rule that decided it.
Two counts per reason: all of self-healing's unrecovered faulted episodes (`all`), and those the
better baseline recovered (`lost`: the episodes the `lose` verdict rests on). Then self-healing's
wrong answers returned as correct, by the fault names of the episode.

    scripts/bench-causes.py [--bin B] [--seeds 10] [--rates 0.1,0.3] [--budget 5]
        [--sets heldout,fresh,shipped] [--faults FILE ...] [--json OUT]
"""
import argparse
import collections
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
FAULTS = ROOT / "crates/selfheal-bench/faults"
EQUAL = ["react+verify", "full-replan+verify"]


def fold(reason):
    """A reason with its particulars (steps, numbers, tool names, values) folded away."""
    if reason is None:
        return "(complete)"
    r = re.sub(r"`[^`]*`", "`…`", reason)
    r = re.sub(r"step \d+", "step N", r)
    r = re.sub(r"-?\d+(\.\d+)?(e-?\d+)?", "N", r)
    r = re.sub(r"\{.*\}", "{…}", r)
    # A verifier's detail after the first colon inside the parentheses is kept short.
    m = re.match(r"(.*?\((\w+): )(.*)\)$", r)
    if m:
        detail = m.group(3)
        for key in ("did not answer", "unreadable body", "has no", "no second source"):
            if key in detail:
                detail = key
                break
        r = f"{m.group(1)}{detail})"
    return r


def rule(reason):
    """Which rule of the core decided an end, by its reason."""
    if reason is None:
        return "-"
    if "could not be verified" in reason:
        return "doubt rule (in_doubt + claims_unverified false; check_again used up)"
    if "changed when read again" in reason:
        return "contested rule (claim_refused: re-read differed)"
    if "recovery options exhausted" in reason:
        return "ladder end (policy.decide: degrade / per-failure cap R)"
    if "budget is spent" in reason or "budget" in reason:
        return "run budget (ledger)"
    if "terminated on" in reason:
        return "ladder end (terminate)"
    if "unresolved" in reason:
        return "finish: failure left open"
    if "claims no answer" in reason:
        return "claim_after_recovery"
    return "monitor / other"


def run(binary, faults, rate, budget, seeds, tasks=None):
    with tempfile.NamedTemporaryFile(suffix=".jsonl", delete=False) as t:
        tpath = t.name
    cmd = [binary, "bench", "--json", "--seeds", str(seeds), "--fault-rate", str(rate),
           "--budget", str(budget), "--strategies", ",".join(EQUAL + ["self-healing"]),
           "--trace", tpath]
    if faults:
        cmd += ["--faults", faults]
    if tasks:
        cmd += ["--tasks", tasks]
    rep = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    eps = {}
    ends = {}
    with open(tpath) as f:
        for line in f:
            e = json.loads(line)
            key = (e["strategy"], e["seed"], e["task"])
            if e["event"] == "episode":
                eps[key] = e
            elif e["event"] == "finished" and e["strategy"] == "self-healing":
                ends[key] = (e.get("status"), e.get("reason"))
    os.unlink(tpath)
    det = {d["strategy"]: d for d in rep["details"]}
    better = max(EQUAL, key=lambda s: det[s]["recovered"])
    causes_all = collections.Counter()
    causes_lost = collections.Counter()
    silent = collections.Counter()
    won = 0
    for (strat, seed, task), e in eps.items():
        if strat != "self-healing" or not e["faults"]:
            continue
        base = eps.get((better, seed, task))
        if e["success"]:
            won += int(base is not None and not base["success"])
            continue
        if e["claimed"]:
            silent[", ".join(sorted(set(e["faults"])))] += 1
            continue
        status, reason = ends.get((strat, seed, task), (None, "(no finished event)"))
        k = (fold(reason), rule(reason))
        causes_all[k] += 1
        if base is not None and base["success"]:
            causes_lost[k] += 1
    return {
        "faulted": det["self-healing"]["faulted"],
        "recovered": {s: det[s]["recovered"] for s in EQUAL + ["self-healing"]},
        "silent_total": {s: det[s]["silent_failures"] for s in EQUAL + ["self-healing"]},
        "better": better,
        "only_self_healing": won,
        "causes": [{"reason": k[0], "rule": k[1], "all": n, "lost": causes_lost.get(k, 0)}
                   for k, n in causes_all.most_common()],
        "silent_by_faults": dict(silent.most_common()),
    }


def files(sets):
    out = []
    for s in sets:
        if s in ("heldout", "fresh"):
            out += [(f"{s}/{f.stem}", str(f)) for f in sorted((FAULTS / s).glob("*.toml"))]
        elif s == "shipped":
            out.append(("default", None))
            out += [(f.stem, str(f)) for f in sorted(FAULTS.glob("*.toml")) if f.stem != "default"]
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", default=str(ROOT / "target/debug/selfheal"))
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--rates", default="0.1,0.3")
    p.add_argument("--budget", type=int, default=5)
    p.add_argument("--sets", default="heldout")
    p.add_argument("--faults", nargs="*", default=None, help="these files instead of --sets")
    p.add_argument("--json", default=None, help="also write the rows as JSON here")
    a = p.parse_args()
    todo = [(pathlib.Path(f).stem, f) for f in a.faults] if a.faults else files(a.sets.split(","))
    rows = []
    for name, f in todo:
        for rate in [float(x) for x in a.rates.split(",")]:
            r = run(a.bin, f, rate, a.budget, a.seeds)
            r.update(set=name, rate=rate)
            rows.append(r)
            rec = r["recovered"]
            print(f"\n### {name} @ {rate}: faulted {r['faulted']}; recovered SH {rec['self-healing']}, "
                  f"{r['better']} {rec[r['better']]} (SH-only {r['only_self_healing']}); silent SH "
                  f"{r['silent_total']['self-healing']}, re+v {r['silent_total']['react+verify']}, "
                  f"fr+v {r['silent_total']['full-replan+verify']}")
            print("| all | lost | how self-healing's unrecovered faulted episode ended | rule |")
            print("|---:|---:|---|---|")
            for c in r["causes"]:
                print(f"| {c['all']} | {c['lost']} | {c['reason']} | {c['rule']} |")
            if r["silent_by_faults"]:
                print("silent (claimed wrong) by faults: " +
                      "; ".join(f"{k}: {n}" for k, n in r["silent_by_faults"].items()))
            sys.stdout.flush()
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
