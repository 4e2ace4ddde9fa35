#!/usr/bin/env python3
"""Compares two greedy recordings prompt by prompt.

Usage:
  compare.py A.json B.json

Each file is either llamacpp_greedy's output (prompts[].steps[].top[]) or the
llama-server golden file format of ../shared/golden/stories260K.json
(generations[].steps[].top[]). Prompts are matched by text. For each prompt it
prints whether the prompt ids and the generated ids agree (and where they
first differ), and the largest |logprob| difference over the top tokens the
two files share at the steps before the first difference. Exit status 1 when
any ids differ.
"""
import json
import sys


def load(path):
    with open(path, encoding="utf-8") as f:
        d = json.load(f)
    out = {}
    if "generations" in d:  # llama-server golden format
        for g in d["generations"]:
            steps = [{t["id"]: t["logprob"] for t in s["top"]} for s in g["steps"]]
            out[g["prompt"]] = (g["prompt_ids"], g["generated_ids"], steps)
    else:
        for p in d["prompts"]:
            if "error" in p:
                continue
            # schema 1 as first written: top[] of {id, logprob, logit};
            # the compact form: top[] of [id, logprob].
            steps = [dict((t["id"], t["logprob"]) if isinstance(t, dict) else (t[0], t[1]) for t in s["top"]) for s in p["steps"]]
            out[p["text"]] = (p["prompt_ids"], p["generated_ids"], steps)
    return out


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    a, b = load(sys.argv[1]), load(sys.argv[2])
    bad = False
    worst = 0.0
    for text, (pa, ga, sa) in a.items():
        if text not in b:
            print(f"{text!r}: only in {sys.argv[1]}")
            continue
        pb, gb, sb = b[text]
        n = min(len(ga), len(gb))
        first = next((i for i in range(n) if ga[i] != gb[i]), None)
        upto = n if first is None else first
        diff = 0.0
        for i in range(upto):
            for tid, lp in sa[i].items():
                if tid in sb[i]:
                    diff = max(diff, abs(lp - sb[i][tid]))
        worst = max(worst, diff)
        status = "ids equal" if pa == pb and first is None and len(ga) == len(gb) else "DIFFER"
        if status != "ids equal":
            bad = True
        where = "" if first is None else f", first generated difference at step {first}: {ga[first]} vs {gb[first]}"
        print(f"{text!r}: prompt ids {'equal' if pa == pb else 'DIFFER'}, {n} steps compared, {status}{where}, "
              f"max |logprob diff| {diff:.3g}")
    print(f"largest |logprob diff| over all prompts: {worst:.3g}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
