# meshp2p image for machines with registry access (multi-stage: build with
# the Go toolchain on Debian bookworm, run on bookworm-slim).
#
#   docker build -t meshp2p .                        # portable: -march=x86-64-v3
#   docker build --build-arg SIMD=native -t meshp2p . # this CPU only
#
# SIMD is the -march level llama.cpp is compiled for. The default is a
# portable level because images move between machines; a -march=native
# build runs only on CPUs with the build machine's features.
# Offline (no registry, as in this project's CI): `make image` builds an
# equivalent image FROM scratch out of the local binary.
# Not built in the project's CI (no registry there); checked with a parse.
ARG GO_VERSION=1.26.8

FROM golang:${GO_VERSION}-bookworm AS build
ARG SIMD=x86-64-v3
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN make build SIMD=${SIMD} VERSION=docker

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates iproute2 iptables \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/bin/meshp2p /usr/local/bin/meshp2p
ENV MESHP2P_DATA_DIR=/data
VOLUME /data
WORKDIR /data
# libp2p: TCP and QUIC on 4001 (start --listen /ip4/0.0.0.0/tcp/4001 ...)
EXPOSE 4001/tcp 4001/udp
ENTRYPOINT ["/usr/local/bin/meshp2p"]
CMD ["--help"]
