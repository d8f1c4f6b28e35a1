# syntax=docker/dockerfile:1
# throttle-worker images. The default target is the production image: the
# binary built without the dev tools (`--no-default-features`: no demo, no
# stub, no load generator, no mock broker), running `run` and the operator
# commands (limits, dlq, check-config).
#   docker build -t throttle-worker .
# The `dev` target is the same runtime with the tools built in (the
# `dev-tools` feature): docker-compose's stub and load generator run it.
#   docker build --target dev -t throttle-worker:dev .
# tests/deploy_files.rs checks this file against the repository (packages,
# copied paths, user, port, healthcheck); there is no Docker engine in CI.

# --- build -----------------------------------------------------------------
FROM rust:1-bookworm AS build
# The Debian packages .ci/run installs for the build: librdkafka is compiled
# from source with its configure and make (C toolchain, pkg-config, python3
# for its linker script), with OpenSSL for the ssl feature and zlib.
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      build-essential pkg-config libssl-dev zlib1g-dev python3 ca-certificates \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# rust-toolchain.toml pins the toolchain CI uses; rustup installs it here on
# the first cargo call, so the image is built by the same compiler.
COPY rust-toolchain.toml Cargo.toml Cargo.lock ./
# Cargo.toml declares benches/limiter.rs; src/ compiles in lua/ and
# config/default.toml (include_str!).
COPY src ./src
COPY lua ./lua
COPY config/default.toml ./config/default.toml
COPY benches ./benches
# Cache mounts keep the registry and the target directory between builds;
# the binary is copied out of the cached target before the layer ends.
# The release profile strips debug info (Cargo.toml, `strip = "debuginfo"`):
# the image ships a binary without it. To profile, build
# `--profile profiling` (release with line tables) outside the image.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --no-default-features \
 && cp target/release/throttle-worker /usr/local/bin/throttle-worker

# --- build-dev: the binary with the tools (the default features) -------------
# Built only for the dev target; shares the cache mounts, so only the crate
# itself is compiled again.
FROM build AS build-dev
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked \
 && cp target/release/throttle-worker /usr/local/bin/throttle-worker

# --- runtime: what both images share -----------------------------------------
FROM debian:bookworm-slim AS runtime
# Runtime libraries only: what the binary links (ldd: libssl3 with
# libcrypto, zlib1g; libc6 and libgcc-s1 are in the base) and CA
# certificates for TLS to Kafka, Redis or the downstream. No libsasl2-2:
# librdkafka is built without GSSAPI, and SASL PLAIN/SCRAM need only OpenSSL
# (tests/deploy_files.rs checks this list against ldd of the built binary).
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates libssl3 zlib1g \
 && rm -rf /var/lib/apt/lists/*
# A numeric, non-root user: Kubernetes' runAsNonRoot can only verify a
# numeric USER (deploy/kubernetes/deployment.yaml runs as the same uid).
RUN groupadd --system --gid 10001 throttle \
 && useradd --system --uid 10001 --gid 10001 --no-create-home \
      --home-dir /nonexistent --shell /usr/sbin/nologin throttle
COPY --chmod=0755 deploy/docker/healthcheck.sh /usr/local/bin/throttle-healthcheck
USER 10001:10001
# The default http.listen is 127.0.0.1:9898, which nothing outside the
# container can reach (no probe, no Prometheus).
ENV THROTTLE__HTTP__LISTEN=0.0.0.0:9898
EXPOSE 9898
# Configuration: THROTTLE__SECTION__KEY variables over the compiled-in
# defaults, and a mounted limits file (THROTTLE__LIMITS__FILE), watched for
# live edits. SIGTERM drains within worker.shutdown_timeout (20s): give
# `docker stop` / Kubernetes a longer grace period.
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
  CMD ["/usr/local/bin/throttle-healthcheck"]
ENTRYPOINT ["throttle-worker"]
CMD ["run"]

# --- dev: the runtime with the tools (docker-compose's stub, produce) --------
FROM runtime AS dev
COPY --from=build-dev /usr/local/bin/throttle-worker /usr/local/bin/throttle-worker

# --- run: the production image, the default target (last stage) --------------
FROM runtime
COPY --from=build /usr/local/bin/throttle-worker /usr/local/bin/throttle-worker
