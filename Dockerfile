# valkey-sidecar: a static (musl) binary in an empty image, running as a non-root user.
# Issue 7 verifies this file in the tests (no Docker engine runs on the development machines);
# until then it is the intended build, not a tested one.
FROM rust:1.95-bookworm AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends musl-tools \
 && rm -rf /var/lib/apt/lists/* \
 && rustup target add x86_64-unknown-linux-musl
WORKDIR /src
COPY . .
RUN cargo build --release --locked --target x86_64-unknown-linux-musl -p valkey-sidecar --bin valkey-sidecar

FROM scratch
COPY --from=build /src/target/x86_64-unknown-linux-musl/release/valkey-sidecar /valkey-sidecar
USER 65532:65532
ENTRYPOINT ["/valkey-sidecar"]
