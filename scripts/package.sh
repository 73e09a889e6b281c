#!/usr/bin/env bash
# Builds the Debian package: target/debian/ferrovs_VERSION-1_ARCH.deb (docs/packaging.md).
#   1. the release binaries (ferrovsd, ferrovs, ferrovs-gen);
#   2. their man pages and bash/zsh/fish completions, written by the binaries themselves
#      from their clap definitions ($FERROVS_WRITE_DOCS, crates/docgen) into target/docs;
#   3. cargo-deb (scripts/deps.sh installs it) with the metadata in crates/ferrovsd/Cargo.toml.
# Prints the .deb's path on its last line.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=$HOME/.cargo/bin:$PATH
cargo build --release --quiet -p ferrovsd -p ferrovs -p ferrovs-gen
rm -rf target/docs
for b in ferrovsd ferrovs ferrovs-gen; do
    FERROVS_WRITE_DOCS=target/docs "target/release/$b" >/dev/null
done
cargo deb -p ferrovsd --no-build --strip --quiet 2>&1 | tail -n 1
