#!/usr/bin/env python3
"""Runs every strategy of `selfheal bench` over the held-out fault models
(crates/selfheal-bench/faults/heldout/), the shipped ones and NESTFUL (and, with `--sets fresh`,
the fresh out-of-sample models in crates/selfheal-bench/faults/fresh/, reported on their own; with
`--sets twins`, the pair in crates/selfheal-bench/faults/twins/ that a run cannot tell apart), and
judges self-healing
against the equal-detector baselines with the bench's own paired statistics (`--json`'s
`paired`: the RSR difference's 95 % interval, a paired bootstrap clustered by task).

Per file, fault rate and budget R it prints the faulted episodes, recovered episodes and silent
failures (wrong answers returned as correct) per strategy, and three verdicts:

- `lose`: self-healing's RSR is significantly below the better of `react+verify` and
  `full-replan+verify` (the interval of the difference lies below 0);
- `win`: significantly above both;
- `sfr+`: more silent failures than some recovering baseline (retry-only, react, react+verify,
  full-replan, full-replan+verify) — raw counts, the issue's reading;
- `sfr+sig`: the same with significance: self-healing's SFR is significantly above some recovering
  baseline's (the paired interval of the SFR difference lies above 0). A difference of a
  handful of answers is inside that interval; both verdicts are printed.

`--save FILE` writes the rows as JSON; `--compare BEFORE.json AFTER.json` prints the two side by
side (self-healing's recovered and silent counts, the verdicts). Usage:

    scripts/bench-heldout.py [--bin target/release/selfheal] [--seeds 10] [--rates 0.1,0.3]
        [--budgets 5,1] [--sets heldout,shipped,nestful,fresh,twins] [--policy FILE] [--deployment]
        [--save FILE]
    scripts/bench-heldout.py --compare BEFORE.json AFTER.json
"""
import argparse
import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
FAULTS = ROOT / "crates/selfheal-bench/faults"
ORDER = ["static", "retry-only", "react", "react+verify", "full-replan", "full-replan+verify",
         "class-agnostic", "self-healing"]
EQUAL = ["react+verify", "full-replan+verify"]
RECOVERING = ["retry-only", "react", "react+verify", "full-replan", "full-replan+verify"]
SHORT = {"static": "st", "retry-only": "ro", "react": "re", "react+verify": "re+v",
         "full-replan": "fr", "full-replan+verify": "fr+v", "class-agnostic": "ca",
         "self-healing": "SH"}


def combos(sets):
    out = []
    if "heldout" in sets:
        out += [(f"heldout/{f.stem}", str(f), None) for f in sorted((FAULTS / "heldout").glob("*.toml"))]
    if "fresh" in sets:
        out += [(f"fresh/{f.stem}", str(f), None) for f in sorted((FAULTS / "fresh").glob("*.toml"))]
    if "twins" in sets:
        out += [(f"twins/{f.stem}", str(f), None) for f in sorted((FAULTS / "twins").glob("*.toml"))]
    if "shipped" in sets:
        out.append(("default", None, None))
        out += [(f.stem, str(f), None) for f in sorted(FAULTS.glob("*.toml")) if f.stem != "default"]
    if "nestful" in sets:
        out.append(("nestful", None, str(ROOT / "data/nestful.jsonl")))
    return out


def run(binary, faults, tasks, rate, budget, seeds, policy, deployment=False):
    cmd = [binary, "bench", "--json", "--seeds", str(seeds), "--fault-rate", str(rate),
           "--budget", str(budget)]
    if deployment:
        cmd.append("--deployment")
    if faults:
        cmd += ["--faults", faults]
    if tasks:
        cmd += ["--tasks", tasks]
    if policy:
        cmd += ["--policy", policy]
    rep = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    det = {d["strategy"]: d for d in rep["details"]}
    paired = {p["against"]: p for p in rep["paired"] if p["budget"] == budget}
    better = max(EQUAL, key=lambda s: det[s]["recovered"])
    lose = paired[better]["rsr_ci"][1] < 0
    win = all(paired[s]["rsr_ci"][0] > 0 for s in EQUAL)
    sh = det["self-healing"]["silent_failures"]
    fewest = min(det[s]["silent_failures"] for s in RECOVERING)
    sfr_sig = [s for s in RECOVERING if paired[s]["sfr_ci"][0] > 0]
    return {
        "cmd": " ".join(c.replace(str(ROOT) + "/", "") for c in cmd[1:] if c != "--json"),
        "faulted": det["self-healing"]["faulted"],
        "recovered": {s: det[s]["recovered"] for s in ORDER if s in det},
        "silent": {s: det[s]["silent_failures"] for s in ORDER if s in det},
        "better_baseline": better,
        "rsr_diff": paired[better]["rsr_diff"],
        "rsr_ci": paired[better]["rsr_ci"],
        "lose": lose, "win": win, "sfr_plus": sh > fewest,
        "sfr_plus_sig": bool(sfr_sig), "sfr_sig_against": sfr_sig,
    }


def verdict(r):
    pairs = (("lose", "lose"), ("win", "win"), ("sfr+", "sfr_plus"), ("sfr+sig", "sfr_plus_sig"))
    return ",".join(v for v, k in pairs if r.get(k)) or "-"


def show(rows):
    head = " | ".join(f"rec {SHORT[s]}" for s in ORDER) + " | " + " | ".join(f"sil {SHORT[s]}" for s in ORDER)
    print(f"| set | rate | R | faulted | {head} | SH−best eq. RSR [95 %] | verdict |")
    print("|---|---:|---:|---:|" + "---:|" * (2 * len(ORDER)) + "---|---|")
    for r in rows:
        rec = " | ".join(str(r["recovered"].get(s, "")) for s in ORDER)
        sil = " | ".join(str(r["silent"].get(s, "")) for s in ORDER)
        print(f"| {r['set']} | {r['rate']} | {r['budget']} | {r['faulted']} | {rec} | {sil} | "
              f"{100 * r['rsr_diff']:+.1f} [{100 * r['rsr_ci'][0]:+.1f}, {100 * r['rsr_ci'][1]:+.1f}] "
              f"vs {r['better_baseline']} | {verdict(r)} |")
    summary(rows)


def kind(r):
    """The set a row belongs to: held-out, fresh (never looked at while tuning) or shipped."""
    return r["set"].split("/")[0] if "/" in r["set"] else "shipped+nestful"


def summary(rows):
    names = {"heldout": "held-out", "fresh": "fresh (out of sample)", "twins": "twins",
             "shipped+nestful": "shipped+nestful"}
    for group in sorted({(kind(r), r["budget"]) for r in rows}):
        sel = [r for r in rows if (kind(r), r["budget"]) == group]
        name = names[group[0]]
        print(f"\n{name}, R = {group[1]}: {len(sel)} rows; lose {sum(r['lose'] for r in sel)}, "
              f"win {sum(r['win'] for r in sel)}, sfr+ {sum(r['sfr_plus'] for r in sel)} "
              f"(significant {sum(r.get('sfr_plus_sig', False) for r in sel)}); "
              f"self-healing recovered {sum(r['recovered']['self-healing'] for r in sel)}, "
              f"silent {sum(r['silent']['self-healing'] for r in sel)}")
        # The sfr+ verdict applied to every strategy alike: rows where it returns more wrong
        # answers as correct than some recovering baseline other than itself.
        each = []
        for s in ORDER:
            if all(s in r["silent"] and all(b in r["silent"] for b in RECOVERING) for r in sel):
                n = sum(r["silent"][s] > min(r["silent"][b] for b in RECOVERING if b != s) for r in sel)
                each.append(f"{SHORT[s]} {n}")
        print(f"  sfr+ of each strategy against the recovering baselines: {', '.join(each)}")


def compare(before, after):
    a = {(r["set"], r["rate"], r["budget"]): r for r in json.load(open(before))}
    b = {(r["set"], r["rate"], r["budget"]): r for r in json.load(open(after))}
    print("| set | rate | R | faulted | SH recovered before → after | SH silent before → after | "
          "fewest silent of recovering baselines | verdict before → after |")
    print("|---|---:|---:|---:|---|---|---:|---|")
    for k in a:
        if k not in b:
            continue
        x, y = a[k], b[k]
        fewest = min(y["silent"][s] for s in RECOVERING)
        print(f"| {k[0]} | {k[1]} | {k[2]} | {x['faulted']} | {x['recovered']['self-healing']} → "
              f"{y['recovered']['self-healing']} | {x['silent']['self-healing']} → "
              f"{y['silent']['self-healing']} | {fewest} | {verdict(x)} → {verdict(y)} |")
    print("\nbefore:")
    summary(list(a.values()))
    print("\nafter:")
    summary(list(b.values()))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", default=str(ROOT / "target/release/selfheal"))
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--rates", default="0.1,0.3")
    p.add_argument("--budgets", default="5,1")
    p.add_argument("--sets", default="heldout,shipped,nestful")
    p.add_argument("--policy", default=None)
    p.add_argument("--save", default=None)
    p.add_argument("--deployment", action="store_true",
                   help="run each seed's episodes as one deployment (trust carried across them)")
    p.add_argument("--compare", nargs=2, default=None)
    a = p.parse_args()
    if a.compare:
        compare(*a.compare)
        return 0
    rows = []
    for name, faults, tasks in combos(a.sets.split(",")):
        for rate in [float(x) for x in a.rates.split(",")]:
            for budget in [int(x) for x in a.budgets.split(",")]:
                r = run(a.bin, faults, tasks, rate, budget, a.seeds, a.policy, a.deployment)
                r.update(set=name, rate=rate, budget=budget)
                rows.append(r)
    show(rows)
    if a.save:
        pathlib.Path(a.save).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
