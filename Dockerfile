# kfelastic's image, for people with a container daemon:
#
#   docker build --build-arg VERSION=$(git describe --tags --always --dirty) -t ghcr.io/kfelastic/kfelastic:TAG .
#
# `make image` builds the same image without any daemon, as an OCI image
# layout in out/image (internal/ociimage; its test keeps this file in step).
# The image holds the static binary at /kfelastic and nothing else: the
# plugin's init container runs `/kfelastic install DIR` (the binary copies
# itself into the training pod) and its master replica `/kfelastic master`.
FROM golang:1.26-bookworm AS build
ARG VERSION=dev
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 GOOS=linux go build -trimpath -ldflags "-s -w -X github.com/kfelastic/kfelastic/internal/version.version=${VERSION}" -o /out/kfelastic ./cmd/kfelastic

FROM scratch
ARG VERSION=dev
LABEL org.opencontainers.image.title="kfelastic" \
      org.opencontainers.image.source="https://github.com/kfelastic/kfelastic" \
      org.opencontainers.image.version="${VERSION}"
COPY --from=build /out/kfelastic /kfelastic
ENTRYPOINT ["/kfelastic"]
