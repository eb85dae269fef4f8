#!/usr/bin/env bash
# `make mutants`: cargo-mutants on the mechanism crate's modules that its unit tests cover. Each
# mutant (a function's body replaced, an operator swapped, a condition negated) is built and the
# crate's unit tests run against it; a mutant no test fails is "missed". The modules, the mutants
# explained rather than killed, and the score are in scripts/mutants.toml and tests/README.md.
#
# About 10 minutes on 2 cores (233 mutants). `SHARD=k/n` runs the k-th of n shards (the same filters in each).
# Exits non-zero when a mutant is missed that scripts/mutants.toml does not explain.
set -euo pipefail
cd "$(dirname "$0")/.."

version=27.0.0
if ! cargo mutants --version 2>/dev/null | grep -qF "$version"; then
  echo "mutants: installing cargo-mutants $version from crates.io (about four minutes)"
  cargo install --locked --quiet cargo-mutants --version "$version"
fi

export SQLX_OFFLINE=true
# One job: the mutants share one target directory (each build then recompiles only the crate), and
# two jobs on 2 cores would each build their dependencies first.
export CARGO_TARGET_DIR="$PWD/target/mutants-build"
args=(--config scripts/mutants.toml --package idempotency --test-package idempotency
  --profile mutants --cap-lints true --jobs 1 --minimum-test-timeout 30
  --output target/mutants --no-shuffle)
if [[ -n "${SHARD:-}" ]]; then
  args+=(--shard "$SHARD")
fi
started=$(date +%s)
status=0
cargo mutants "${args[@]}" || status=$?
echo "mutants: $(($(date +%s) - started)) s; caught, missed, timed out and unviable in target/mutants/mutants.out/{caught,missed,timeout,unviable}.txt"
for outcome in caught missed timeout unviable; do
  printf '  %-9s %s\n' "$outcome" "$(wc -l < "target/mutants/mutants.out/$outcome.txt" 2>/dev/null || echo 0)"
done
exit "$status"
