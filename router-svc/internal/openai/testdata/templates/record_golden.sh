#!/bin/sh
# Records golden/<family>.json: jinja2's renderings (render.py) of the corpus
# with each family's REAL chat template, which Baton does not ship.
#
#   cd router-svc/internal/openai/testdata/templates && sh record_golden.sh DIR
#
# DIR holds the real templates under these names: ik_llama.cpp's
# models/templates (snapshot 8337e4cd, 2026-08-15), e.g.
#   git -C /work/.mirror/ikawrakow+ik_llama.cpp/repo show HEAD:models/templates/Qwen-Qwen3-0.6B.jinja
# and google-gemma-3-1b-it.jinja, the chat_template of google/gemma-3-*-it's
# tokenizer_config.json (ik_llama.cpp has none for Gemma 3).
# The BOS and EOS texts are the ones the families' GGUF files name.
set -e
R=${1:?usage: sh record_golden.sh DIR}
python3 render.py corpus.json $R/Qwen-Qwen2.5-7B-Instruct.jinja '<|endoftext|>' '<|im_end|>' > golden/qwen25.json
python3 render.py corpus.json $R/Qwen-Qwen3-0.6B.jinja '<|endoftext|>' '<|im_end|>' > golden/qwen3.json
python3 render.py corpus.json $R/meta-llama-Llama-3.1-8B-Instruct.jinja '<|begin_of_text|>' '<|eot_id|>' > golden/llama3.json
python3 render.py corpus.json $R/meta-llama-Llama-3.2-3B-Instruct.jinja '<|begin_of_text|>' '<|eot_id|>' > golden/llama32.json
python3 render.py corpus.json $R/microsoft-Phi-3.5-mini-instruct.jinja '<s>' '<|endoftext|>' > golden/phi3.json
python3 render.py corpus.json $R/google-gemma-2-2b-it.jinja '<bos>' '<eos>' > golden/gemma2.json
python3 render.py corpus.json $R/google-gemma-3-1b-it.jinja '<bos>' '<eos>' > golden/gemma3.json
python3 render.py corpus.json $R/mistralai-Mistral-Nemo-Instruct-2407.jinja '<s>' '</s>' > golden/mistral.json
