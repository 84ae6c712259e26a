#!/usr/bin/env python3
"""Runs every strategy of `selfheal bench` on every fault model in crates/selfheal-bench/faults/
(and on NESTFUL), at several fault rates, and prints RSR / TSR / SFR per strategy as Markdown.

A row is marked `SFR!` when self-healing returned more wrong answers as correct than some other
strategy on the same episodes. Usage:

    scripts/bench-fault-models.py [--bin target/release/selfheal] [--seeds 10] [--rates 0.1,0.3]
        [--models default,mixed,...] [--tasks FILE] [--budget 5] [--policy FILE]
"""
import argparse
import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
ORDER = ["static", "retry-only", "react", "react+verify", "full-replan", "full-replan+verify",
         "class-agnostic", "self-healing"]


def run(binary, model, rate, seeds, tasks, budget, policy):
    cmd = [binary, "bench", "--json", "--seeds", str(seeds), "--fault-rate", str(rate),
           "--budget", str(budget)]
    if policy:
        cmd += ["--policy", policy]
    if model != "default":
        cmd += ["--faults", str(ROOT / "crates/selfheal-bench/faults" / f"{model}.toml")]
    if tasks:
        cmd += ["--tasks", tasks]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return cmd, json.loads(out)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", default=str(ROOT / "target/release/selfheal"))
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--rates", default="0.1,0.3")
    p.add_argument("--budget", type=int, default=5)
    p.add_argument("--tasks", default=None)
    p.add_argument("--models", default=None)
    p.add_argument("--policy", default=None, help="run self-healing under this policy file")
    a = p.parse_args()
    models = a.models.split(",") if a.models else ["default"] + sorted(
        f.stem for f in (ROOT / "crates/selfheal-bench/faults").glob("*.toml")
        if f.stem != "default")
    worse = 0
    for model in models:
        for rate in [float(r) for r in a.rates.split(",")]:
            cmd, rep = run(a.bin, model, rate, a.seeds, a.tasks, a.budget, a.policy)
            rows = {r["strategy"]: r for r in rep["results"]}
            det = {d["strategy"]: d for d in rep["details"]}
            shown = " ".join(c.replace(str(ROOT) + "/", "") for c in cmd[1:] if c != "--json")
            print(f"\n**{model}**, fault rate {rate} (`selfheal {shown}`), "
                  f"{det['self-healing']['faulted']} faulted episodes of "
                  f"{rows['self-healing']['episodes']}\n")
            print("| strategy | RSR | TSR | SFR | silent | K |")
            print("|---|---:|---:|---:|---:|---:|")
            sh = det["self-healing"]["silent_failures"]
            for s in ORDER:
                if s not in rows:
                    continue
                r, d = rows[s], det[s]
                flag = ""
                if s != "self-healing" and d["silent_failures"] < sh:
                    flag = " SFR!"
                    worse += 1
                print(f"| {s} | {100 * r['rsr']:.1f} % | {100 * r['tsr']:.1f} % | "
                      f"{100 * r['sfr']:.1f} % | {d['silent_failures']}{flag} | {r['cost']:.2f} |")
    print(f"\nself-healing has more silent failures than a baseline in {worse} row(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
