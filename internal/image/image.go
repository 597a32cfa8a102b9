package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"debug/buildinfo"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The image's shape, which the Dockerfile repeats.
const (
	// Entrypoint is where the binary sits, and the image's entrypoint.
	Entrypoint = "/kvroute"
	// User is distroless's nonroot user and group, which the chart's
	// securityContext runs as.
	User = "65532:65532"
	// Port is the port the chart has kvroute listen on (its
	// containerPort); kvroute's own default listen address is loopback.
	Port = "8080/tcp"
	// CACertsPath is where Go's crypto/x509 looks first on Linux.
	CACertsPath = "/etc/ssl/certs/ca-certificates.crt"
	// Repository is the name the image is tagged with by default, which
	// the chart's image.repository names.
	Repository = "kvroute/kvroute"
	// VersionVar is the variable release builds set at link time
	// (internal/version.Version).
	VersionVar = "github.com/kvroute/kvroute/internal/version.Version"
)

// Labels are the OCI annotations every kvroute image carries as labels,
// beside org.opencontainers.image.version, .revision and .created, which
// depend on the build.
var Labels = map[string]string{
	"org.opencontainers.image.title":       "kvroute",
	"org.opencontainers.image.description": "KV-cache- and load-aware router for LLM inference servers",
	"org.opencontainers.image.source":      "https://github.com/kvroute/kvroute",
	"org.opencontainers.image.url":         "https://github.com/kvroute/kvroute",
}

// Options are what a build varies on besides the binary.
type Options struct {
	// Version is the org.opencontainers.image.version label; empty: the
	// binary's module version (debug/buildinfo), as kvroute version says.
	Version string
	// Created is the image's creation time and every file's modification
	// time. Zero: the binary's VCS commit time (vcs.time), else the Unix
	// epoch; SOURCE_DATE_EPOCH is the caller's to read (SourceDateEpoch).
	Created time.Time
	// CACerts is a PEM bundle put at CACertsPath; nil: none (kvroute then
	// reaches https engines, NATS and OTLP only with a CA file of its own).
	CACerts []byte
	// Revision is the org.opencontainers.image.revision label for a binary
	// without VCS stamping (built with -buildvcs=false, or in a checkout
	// Go does not stamp, such as a git worktree): Commit's. The binary's
	// own vcs.revision wins.
	Revision string
}

// Build returns the image of one platform around a static kvroute binary.
func Build(binary []byte, p v1.Platform, o Options) (v1.Image, error) {
	bi, err := buildinfo.Read(bytes.NewReader(binary))
	if err != nil {
		return nil, fmt.Errorf("image: the binary has no Go build info: %w", err)
	}
	settings := map[string]string{}
	for _, s := range bi.Settings {
		settings[s.Key] = s.Value
	}
	if settings["CGO_ENABLED"] != "0" {
		return nil, fmt.Errorf("image: the binary was built with CGO_ENABLED=%q; the image has no C library, build it with CGO_ENABLED=0", settings["CGO_ENABLED"])
	}
	if settings["GOOS"] != p.OS || settings["GOARCH"] != p.Architecture {
		return nil, fmt.Errorf("image: the binary is for %s/%s, not %s/%s", settings["GOOS"], settings["GOARCH"], p.OS, p.Architecture)
	}
	created := o.Created
	if created.IsZero() {
		created = time.Unix(0, 0)
		if t, err := time.Parse(time.RFC3339, settings["vcs.time"]); err == nil {
			created = t
		}
	}
	created = created.UTC()
	version := o.Version
	if version == "" {
		version = bi.Main.Version
	}
	revision := settings["vcs.revision"]
	if revision != "" && settings["vcs.modified"] == "true" {
		revision += "-dirty"
	}
	if revision == "" {
		revision = o.Revision
	}

	layerTar, err := files(binary, o.CACerts, created)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithCompressionLevel(gzip.BestCompression), tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("image: layer: %w", err)
	}

	labels := map[string]string{
		"org.opencontainers.image.version": version,
		"org.opencontainers.image.created": created.Format(time.RFC3339),
	}
	if revision != "" {
		labels["org.opencontainers.image.revision"] = revision
	}
	for k, v := range Labels {
		labels[k] = v
	}
	base := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	base = mutate.ConfigMediaType(base, types.OCIConfigJSON)
	img, err := mutate.Append(base, mutate.Addendum{
		// Wrapped: the tarball layer's own descriptor carries an empty
		// annotation map, which marshals away and so fails validation.
		Layer:     struct{ v1.Layer }{layer},
		MediaType: types.OCILayer,
		History: v1.History{
			Created:   v1.Time{Time: created},
			CreatedBy: "kvroute-image: CGO_ENABLED=0 go build -trimpath -ldflags " + strconv.Quote(settings["-ldflags"]),
			Comment:   "the static kvroute binary, /etc/passwd and /etc/group with nonroot (65532), CA certificates",
		},
	})
	if err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	cf = cf.DeepCopy()
	cf.Created = v1.Time{Time: created}
	cf.OS, cf.Architecture, cf.Variant = p.OS, p.Architecture, p.Variant
	cf.Config = v1.Config{
		Entrypoint:   []string{Entrypoint},
		User:         User,
		ExposedPorts: map[string]struct{}{Port: {}},
		Labels:       labels,
		WorkingDir:   "/",
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	return img, nil
}

// files is the image's one layer, an uncompressed tar: directories, the
// user database, the CA bundle and the binary, owned by root (the nonroot
// user reads and runs them; kvroute writes no files) except the nonroot
// user's home and /tmp.
func files(binary, caCerts []byte, mtime time.Time) ([]byte, error) {
	type entry struct {
		name string
		mode int64
		uid  int
		data []byte // nil for a directory
	}
	entries := []entry{
		{name: "etc/", mode: 0o755},
		{name: "etc/group", mode: 0o644, data: []byte("root:x:0:\nnonroot:x:65532:\n")},
		{name: "etc/passwd", mode: 0o644, data: []byte("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
		{name: "home/", mode: 0o755},
		{name: "home/nonroot/", mode: 0o700, uid: 65532},
		{name: "tmp/", mode: 0o1777},
	}
	if caCerts != nil {
		entries = append(entries,
			entry{name: "etc/ssl/", mode: 0o755},
			entry{name: "etc/ssl/certs/", mode: 0o755},
			entry{name: CACertsPath[1:], mode: 0o644, data: caCerts})
	}
	entries = append(entries, entry{name: Entrypoint[1:], mode: 0o755, data: binary})

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: e.mode, Uid: e.uid, Gid: e.uid, ModTime: mtime, Format: tar.FormatPAX}
		if e.uid != 0 {
			h.Uname, h.Gname = "nonroot", "nonroot"
		} else {
			h.Uname, h.Gname = "root", "root"
		}
		if e.data == nil {
			h.Typeflag = tar.TypeDir
		} else {
			h.Typeflag, h.Size = tar.TypeReg, int64(len(e.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("image: %s: %w", e.name, err)
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, fmt.Errorf("image: %s: %w", e.name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	return buf.Bytes(), nil
}

// Index is the multi-platform index of images built by Build, each
// described by the platform in its config.
func Index(imgs ...v1.Image) (v1.ImageIndex, error) {
	adds := make([]mutate.IndexAddendum, 0, len(imgs))
	for _, img := range imgs {
		cf, err := img.ConfigFile()
		if err != nil {
			return nil, fmt.Errorf("image: %w", err)
		}
		adds = append(adds, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{
			MediaType: types.OCIManifestSchema1,
			Platform:  &v1.Platform{OS: cf.OS, Architecture: cf.Architecture, Variant: cf.Variant},
		}})
	}
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	return mutate.AppendManifests(idx, adds...), nil
}

// Binary builds the main package pkg (./cmd/kvroute) of the module in dir
// for the platform, as the Dockerfile does: cgo off (a static binary),
// -trimpath (no build paths in it, so that two checkouts build the same
// bytes), stripped of its symbol table and DWARF debug information
// (-ldflags "-s -w": a third of its size, which panics' stack traces do not
// need), and version, when not empty, set at link time as VersionVar.
func Binary(ctx context.Context, dir, pkg string, p v1.Platform, version string) ([]byte, error) {
	tmp, err := os.MkdirTemp("", "kvroute-image-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	out := filepath.Join(tmp, "kvroute")
	ldflags := StripFlags
	if version != "" {
		ldflags += " -X " + VersionVar + "=" + version
	}
	args := []string{"build", "-trimpath", "-ldflags", ldflags, "-o", out}
	cmd := exec.CommandContext(ctx, "go", append(args, pkg)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+p.OS, "GOARCH="+p.Architecture)
	if p.Architecture == "arm" && p.Variant != "" {
		cmd.Env = append(cmd.Env, "GOARM="+p.Variant[len("v"):])
	}
	if b, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go %v: %w\n%s", append(args, pkg), err, b)
	}
	return os.ReadFile(out)
}

// StripFlags are the linker flags that leave the symbol table (-s) and the
// DWARF debug information (-w) out of the image's binary; the Dockerfile
// passes the same.
const StripFlags = "-s -w"

// Commit is the revision and commit time of the git checkout in dir, with
// "-dirty" when its tracked files have changes (as Go's VCS stamping
// says): the image's revision label and creation time when the binary has
// no VCS stamp. An error when dir is no git checkout or git is missing.
func Commit(ctx context.Context, dir string) (revision string, at time.Time, err error) {
	out, err := exec.CommandContext(ctx, "git", "-C", dir, "log", "-1", "--format=%H %cI").Output()
	if err != nil {
		return "", time.Time{}, fmt.Errorf("git log: %w", err)
	}
	rev, ts, ok := strings.Cut(strings.TrimSpace(string(out)), " ")
	if !ok {
		return "", time.Time{}, fmt.Errorf("git log: unexpected output %q", out)
	}
	if at, err = time.Parse(time.RFC3339, ts); err != nil {
		return "", time.Time{}, fmt.Errorf("git log: %w", err)
	}
	status, err := exec.CommandContext(ctx, "git", "-C", dir, "status", "--porcelain", "--untracked-files=no").Output()
	if err != nil {
		return "", time.Time{}, fmt.Errorf("git status: %w", err)
	}
	if len(bytes.TrimSpace(status)) > 0 {
		rev += "-dirty"
	}
	return rev, at.UTC(), nil
}

// SourceDateEpoch is the time the SOURCE_DATE_EPOCH environment variable
// names (reproducible-builds.org), or the zero time when it is unset.
func SourceDateEpoch() (time.Time, error) {
	s := os.Getenv("SOURCE_DATE_EPOCH")
	if s == "" {
		return time.Time{}, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH=%q: want seconds since 1970", s)
	}
	return time.Unix(n, 0).UTC(), nil
}
