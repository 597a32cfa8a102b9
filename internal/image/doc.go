// Package image builds kvroute's container image without a container
// daemon or a registry: a static kvroute binary (go build with cgo off and
// -trimpath, the version set at link time as internal/version reads it),
// the few files a program needs around it (/etc/passwd and /etc/group with
// the nonroot user 65532, CA certificates), one layer, and an OCI image
// config whose entrypoint, user, port and labels are the Dockerfile's at
// the repository root. Every timestamp is fixed, so the same source and
// toolchain give the same digest: the image can be rebuilt and checked.
//
// It owns the image's shape (Entrypoint, User, Port, the labels); the
// Dockerfile says the same, and a test holds the two together.
// cmd/kvroute-image is its command line. It must not import other kvroute
// packages: the binary it packs is built from source, not linked in.
package image
