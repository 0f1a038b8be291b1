# syntax=docker/dockerfile:1
# The `pelican` image: one binary for the API, the workers and `migrate`,
# built from Cargo.lock. Build: docker build -t pelican .

FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --package pelican-real --bin pelican \
    && cp target/release/pelican /pelican

# glibc and nothing else: no shell, no package manager, a non-root user.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /pelican /usr/local/bin/pelican
# 65532: distroless's nonroot user.
USER 65532:65532
EXPOSE 8080 9090
ENTRYPOINT ["/usr/local/bin/pelican"]
CMD ["--help"]
