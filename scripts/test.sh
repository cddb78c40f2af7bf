#!/usr/bin/env bash
# The test suite: fetches the reference model if it is missing, then runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-model.sh
cargo test --workspace --release
