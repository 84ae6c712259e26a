#!/usr/bin/env python3
"""Explains self-healing's extra silent failures against each baseline, episode by episode.

Runs `selfheal bench --trace` with the options given and, for every other strategy, lists the
episodes where self-healing returned a wrong answer as correct and the other did not: whether
the other returned the right answer or none, and where the wrong value sat — on a step
self-healing recovered (and with which actions), or on a step that never failed. A fault counts
as a wrong-value fault when its family is `semantic` or `context` in the fault model.

    scripts/silent-failures.py [--bin target/release/selfheal] [--show 8] -- BENCH OPTIONS...

e.g. `scripts/silent-failures.py -- --faults crates/selfheal-bench/faults/both-wrong.toml`.

It ends with a counterfactual, re-scored from the same trace: self-healing's silent failures and
correct answers had it claimed nothing on every run that needed a recovery, beside `static`'s.
"""
import argparse
import collections
import json
import pathlib
import subprocess
import sys
import tempfile
import tomllib

ROOT = pathlib.Path(__file__).resolve().parent.parent
VALUE_FAMILIES = {"semantic", "context"}


def value_faults(bench_args):
    """Names of the wrong-value faults of the fault model the options select."""
    path = ROOT / "crates/selfheal-bench/faults/default.toml"
    if "--faults" in bench_args:
        path = pathlib.Path(bench_args[bench_args.index("--faults") + 1])
    model = tomllib.loads(path.read_text())
    return {f["name"] for f in model.get("fault", []) if f.get("family") in VALUE_FAMILIES}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", default=str(ROOT / "target/release/selfheal"))
    p.add_argument("--show", type=int, default=8, help="episode patterns shown per baseline")
    p.add_argument("bench", nargs=argparse.REMAINDER)
    a = p.parse_args()
    bench_args = [x for x in a.bench if x != "--"]
    wrong_kinds = value_faults(bench_args)
    with tempfile.NamedTemporaryFile(suffix=".jsonl") as tf:
        subprocess.run([a.bin, "bench", "--json", "--trace", tf.name] + bench_args, check=True,
                       capture_output=True)
        episodes, actions = {}, collections.defaultdict(lambda: collections.defaultdict(list))
        for line in open(tf.name):
            ev = json.loads(line)
            key = (ev["strategy"], ev["budget"], ev["seed"], ev["task"])
            if ev.get("event") == "episode":
                episodes[key] = ev
            elif ev.get("event") == "action":
                actions[key][ev["step"]].append(ev["action"]["action"])
    silent = {k: e["claimed"] and not e["success"] for k, e in episodes.items()}
    recovered = {k for k in episodes if actions[k]}
    strategies = sorted({k[0] for k in episodes} - {"self-healing"})
    for budget in sorted({k[1] for k in episodes}):
        mine = [k for k in episodes if k[0] == "self-healing" and k[1] == budget]
        print(f"R = {budget}: self-healing {sum(silent[k] for k in mine)} silent failures")
        for other in strategies:
            here = [k for k in mine if silent[k] and not silent[(other,) + k[1:]]]
            there = sum(1 for k in mine if silent[(other,) + k[1:]] and not silent[k])
            kinds, patterns = collections.Counter(), collections.Counter()
            for k in here:
                e, acted = episodes[k], actions[k]
                where = [s for n, s in zip(e["faults"], e["fault_steps"]) if n in wrong_kinds]
                kind = "on a recovered step" if any(s in acted for s in where) else \
                    "on a step that never failed"
                right = episodes[(other,) + k[1:]]["success"]
                kinds[(kind, "right" if right else "none")] += 1
                patterns[" ".join(
                    f"{n}@{s}" + ("*" + "/".join(acted[s]) if s in acted else "")
                    for n, s in zip(e["faults"], e["fault_steps"]))] += 1
            print(f"  vs {other}: {len(here)} wrong only here, {there} wrong only there")
            for (kind, answer), n in sorted(kinds.items()):
                print(f"    {n:4} wrong value {kind}; {other} answered {answer}")
            for pat, n in patterns.most_common(a.show):
                print(f"      {n:3} x {pat}")
        would = [k for k in mine if k not in recovered]
        print(f"  claiming nothing after a recovery: {sum(silent[k] for k in would)} silent, "
              f"{sum(episodes[k]['success'] for k in would)} correct "
              f"(as run: {sum(silent[k] for k in mine)} silent, "
              f"{sum(episodes[k]['success'] for k in mine)} correct)")
        st = [k for k in episodes if k[0] == "static" and k[1] == budget]
        if st:
            print(f"  static: {sum(silent[k] for k in st)} silent, "
                  f"{sum(episodes[k]['success'] for k in st)} correct")
    return 0


if __name__ == "__main__":
    sys.exit(main())
