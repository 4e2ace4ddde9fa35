#!/usr/bin/env python3
"""Render chat templates over Baton's conversation corpus with Python's jinja2,
set up as Hugging Face's apply_chat_template sets it up: the oracle that
router-svc/internal/openai's chat-template tests compare Baton's renderer with.

    python3 render.py CORPUS TEMPLATE BOS EOS > out.json

CORPUS is corpus.json (beside this file). Each conversation is rendered in
every variant (add_generation_prompt true/false x enable_thinking
unset/true/false). The output maps "<conversation>/<variant>" to
{"text": ...} or, when the template raises, {"error": ...}. BOS or EOS "-"
leaves that token undefined (a model without one). strftime_now answers
for the corpus's fixed clock ("now"), so the output does not depend on the day.
"""

import json
import sys
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # Hugging Face's tojson filter (transformers' chat template utilities).
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def environment(now):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: now.strftime(fmt)
    return env


def message(m):
    """A corpus message as an OpenAI-compatible server hands it to
    apply_chat_template: content a string, tool calls with their arguments
    parsed to a mapping when they are a JSON object."""
    out = {"role": m["role"], "content": m.get("content", "")}
    if m.get("name"):
        out["name"] = m["name"]
    if m.get("tool_calls"):
        calls = []
        for c in m["tool_calls"]:
            args = c["arguments"]
            try:
                parsed = json.loads(args)
                if isinstance(parsed, dict):
                    args = parsed
            except ValueError:
                pass
            calls.append({"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": args}})
        out["tool_calls"] = calls
    if m.get("tool_call_id"):
        out["tool_call_id"] = m["tool_call_id"]
    return out


def tool(t):
    fn = {"name": t["name"]}
    if "description" in t:
        fn["description"] = t["description"]
    if "parameters" in t:
        fn["parameters"] = t["parameters"]
    return {"type": "function", "function": fn}


VARIANTS = [(agp, think) for agp in (True, False) for think in (None, True, False)]


def variant_name(agp, think):
    return "gen" if agp else "nogen", {None: "", True: "+think", False: "+nothink"}[think]


def main():
    corpus_path, template_path, bos, eos = sys.argv[1:5]
    with open(corpus_path, encoding="utf-8") as f:
        corpus = json.load(f)
    with open(template_path, encoding="utf-8") as f:
        src = f.read()
    now = datetime.fromisoformat(corpus["now"])
    template = environment(now).from_string(src)
    out = {}
    for conv in corpus["conversations"]:
        for agp, think in VARIANTS:
            ctx = {"messages": [message(m) for m in conv["messages"]], "add_generation_prompt": agp,
                   "tools": [tool(t) for t in conv["tools"]] if conv.get("tools") else None}
            if bos != "-":
                ctx["bos_token"] = bos
            if eos != "-":
                ctx["eos_token"] = eos
            if think is not None:
                ctx["enable_thinking"] = think
            name = conv["name"] + "/" + "".join(variant_name(agp, think))
            try:
                out[name] = {"text": template.render(**ctx)}
            except Exception as e:  # the template's raise_exception, or a failure to evaluate it
                out[name] = {"error": "%s: %s" % (type(e).__name__, e)}
    json.dump(out, sys.stdout, ensure_ascii=False, indent=1, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
