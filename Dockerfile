# syntax=docker/dockerfile:1
# kvroute's container image: a static binary on distroless's static base
# (CA certificates, /etc/passwd with the nonroot user, no shell), run as
# nonroot (65532), kvroute as the entrypoint.
#
#   docker build -t kvroute/kvroute:0.1.0 --build-arg VERSION=0.1.0 \
#     --build-arg REVISION=$(git rev-parse HEAD) .
#   docker buildx build --platform linux/amd64,linux/arm64 -t REGISTRY/kvroute:0.1.0 --push .
#
# `go run ./cmd/kvroute-image` builds the same image without Docker, and
# reproducibly (internal/image, whose test holds this file to the same
# entrypoint, user, port and labels); docs/deploy.md, "An image".

ARG GO_VERSION=1.26.10

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS build
ARG TARGETOS
ARG TARGETARCH
# The version kvroute version and kvroute_build_info report; empty: "(devel)".
ARG VERSION=""
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
# Static (no C library in the image), no build paths in the binary, no
# symbol table or debug information (-s -w), and the version set at link
# time as internal/version reads it. The build context has no .git
# (.dockerignore): the revision is a label instead.
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -buildvcs=false \
      -ldflags "-s -w -X github.com/kvroute/kvroute/internal/version.Version=${VERSION}" \
      -o /out/kvroute ./cmd/kvroute

FROM gcr.io/distroless/static-debian13:nonroot
ARG VERSION=""
ARG REVISION=""
LABEL org.opencontainers.image.title="kvroute" \
      org.opencontainers.image.description="KV-cache- and load-aware router for LLM inference servers" \
      org.opencontainers.image.source="https://github.com/kvroute/kvroute" \
      org.opencontainers.image.url="https://github.com/kvroute/kvroute" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
COPY --from=build /out/kvroute /kvroute
USER 65532:65532
# The port the chart has kvroute listen on (0.0.0.0:8080); kvroute's own
# default is 127.0.0.1:8080, so outside the chart pass --listen 0.0.0.0:8080.
EXPOSE 8080
ENTRYPOINT ["/kvroute"]
