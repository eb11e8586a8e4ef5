# valkey-sidecar: a static (musl) binary in an empty image, running as a non-root user.
# Verified without a Docker engine by tests/image.rs (`cargo test --test image`): it parses this file
# (build and final stage, the build base pinned by digest, the one COPY of the binary, numeric
# non-root USER, exec-form ENTRYPOINT),
# checks that the cargo build below is scripts/static-build.sh's, builds the binary with that
# script, runs it alone in an empty root (no loader, no shared library: so it is static) as this USER
# through this ENTRYPOINT, and holds the image estimate to 10 MiB.
# `COPY . .` brings .cargo/config.toml: the binary's relocations packed (RELR), less of it resident.
# No CC variable is needed: the cc crate finds musl-tools' x86_64-linux-musl-gcc for ring by itself.
# The builder is pinned by digest (the tag moves); refresh with
# `docker buildx imagetools inspect rust:1.95-bookworm` when moving to a newer Rust.
FROM rust:1.95-bookworm@sha256:6258907abe69656e41cd992e0b705cdcfabcbbe3db374f92ed2d47121282d4a1 AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends musl-tools \
 && rm -rf /var/lib/apt/lists/* \
 && rustup target add x86_64-unknown-linux-musl
WORKDIR /src
COPY . .
# The commit the binary reports (`valkey_sidecar_build_info`): docker build --build-arg
# VALKEY_SIDECAR_REVISION=$(git rev-parse HEAD) . (.git is not copied in). scripts/release.sh builds
# the published multi-arch image without Docker.
ARG VALKEY_SIDECAR_REVISION=unknown
RUN cargo build --release --locked --target x86_64-unknown-linux-musl -p valkey-sidecar --bin valkey-sidecar

FROM scratch
COPY --from=build /src/target/x86_64-unknown-linux-musl/release/valkey-sidecar /valkey-sidecar
USER 65532:65532
ENTRYPOINT ["/valkey-sidecar"]
