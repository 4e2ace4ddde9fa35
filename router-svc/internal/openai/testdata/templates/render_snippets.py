#!/usr/bin/env python3
"""Render short template snippets with Python's jinja2, set up as Hugging
Face's apply_chat_template sets it up (the environment of render.py): the
oracle of the snippet tests in chat_prepass_test.go.

    python3 render_snippets.py < snippets.json > out.json

The input is a JSON list of template sources; each is rendered with one
user message ("Hello"), add_generation_prompt true and tools undefined. The
output is a list, one {"text": ...} or {"error": ...} per source.
"""

import json
import os
import sys
from datetime import datetime

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import render  # noqa: E402


def main():
    env = render.environment(datetime(2026, 3, 7, 9, 5, 2))
    out = []
    for src in json.load(sys.stdin):
        try:
            text = env.from_string(src).render(messages=[{"role": "user", "content": "Hello"}],
                                               add_generation_prompt=True, bos_token="<s>", eos_token="</s>")
            out.append({"text": text})
        except Exception as e:
            out.append({"error": "%s: %s" % (type(e).__name__, e)})
    json.dump(out, sys.stdout, ensure_ascii=False, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
