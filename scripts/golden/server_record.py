#!/usr/bin/env python3
"""Records a running llama-server's greedy outputs in llamacpp_greedy's format.

Usage:
  server_record.py URL PROMPTS_FILE STEPS > out.json

For each prompt of PROMPTS_FILE (same escapes as llamacpp_greedy: \\n \\t \\r
\\\\ \\# \\z; blank and '#' lines skipped) it asks URL/tokenize
(add_special=true, with_pieces=false) and URL/completion (temperature 0,
top_k 1, every other sampler off, n_probs 5, post_sampling_probs false,
cache_prompt false) and writes prompts[].{text, prompt_ids, generated_ids,
steps[].top[].{id, logprob}}. It exists to check llamacpp_greedy against the
server it imitates (compare.py A B).
"""
import json
import sys
import urllib.request


def unescape(line):
    out, i = [], 0
    table = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", "#": "#", "z": ""}
    while i < len(line):
        c = line[i]
        if c == "\\":
            i += 1
            if i == len(line) or line[i] not in table:
                raise ValueError(f"bad escape in {line!r}")
            out.append(table[line[i]])
        else:
            out.append(c)
        i += 1
    return "".join(out)


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    url, path, steps = sys.argv[1].rstrip("/"), sys.argv[2], int(sys.argv[3])
    prompts = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n").rstrip("\r")
            if line and not line.startswith("#"):
                prompts.append(unescape(line))
    out = []
    for text in prompts:
        ids = post(url + "/tokenize", {"content": text, "add_special": True})["tokens"]
        r = post(url + "/completion", {
            "prompt": text, "n_predict": steps, "temperature": 0, "top_k": 1, "top_p": 1, "min_p": 0,
            "typical_p": 1, "repeat_penalty": 1, "repeat_last_n": 0, "presence_penalty": 0,
            "frequency_penalty": 0, "dry_multiplier": 0, "xtc_probability": 0, "mirostat": 0,
            "cache_prompt": False, "n_probs": 5, "post_sampling_probs": False, "return_tokens": True,
            "ignore_eos": True, "seed": 42,
        })
        st = [{"id": p["id"], "top": [{"id": t["id"], "logprob": t["logprob"]} for t in p["top_logprobs"]]}
              for p in r["completion_probabilities"]]
        out.append({"text": text, "prompt_ids": ids, "generated_ids": r["tokens"], "steps": st})
    json.dump({"producer": {"program": "llama-server", "url": url}, "prompts": out}, sys.stdout, indent=1)


if __name__ == "__main__":
    main()
