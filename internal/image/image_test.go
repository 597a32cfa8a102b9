package image

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/google/go-containerregistry/pkg/v1/validate"

	"github.com/kvroute/kvroute/internal/racetest"
)

// hello is a small program that prints internal/version's version: the
// test builds it as Binary builds kvroute, in a fraction of the time.
const hello = "./internal/image/testdata/hello"

var (
	amd64 = v1.Platform{OS: "linux", Architecture: "amd64"}
	arm64 = v1.Platform{OS: "linux", Architecture: "arm64"}
)

// buildHello builds the stand-in binary for p with the version stamped.
func buildHello(t *testing.T, p v1.Platform, version string) []byte {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command on PATH to build the test binary with")
	}
	bin, err := Binary(context.Background(), "../..", hello, p, version)
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// TestBuild builds the image of two platforms from a static binary and
// checks what a container runtime reads: the config (entrypoint, user,
// port, labels, platform), the one layer's files and owners, that the
// binary is static and carries the version, and that the manifests and
// the index are valid OCI.
func TestBuild(t *testing.T) {
	racetest.Heavy(t, "compresses two images' layers in the test binary (no goroutines to watch)")
	const version = "1.2.3-test"
	created := time.Date(2026, 11, 5, 10, 0, 0, 0, time.UTC)
	ca := []byte("-----BEGIN CERTIFICATE-----\nnot a real one\n-----END CERTIFICATE-----\n")
	var imgs []v1.Image
	for _, p := range []v1.Platform{amd64, arm64} {
		bin := buildHello(t, p, version)
		f, err := elf.NewFile(bytes.NewReader(bin))
		if err != nil {
			t.Fatal(err)
		}
		for _, prog := range f.Progs {
			if prog.Type == elf.PT_INTERP || prog.Type == elf.PT_DYNAMIC {
				t.Errorf("%s: the binary is dynamically linked (%v); it must run on an image without a C library", p, prog.Type)
			}
		}
		// Stripped (-s -w): no symbol table, no DWARF.
		for _, sec := range f.Sections {
			if sec.Name == ".symtab" || strings.HasPrefix(sec.Name, ".debug_") || strings.HasPrefix(sec.Name, ".zdebug_") {
				t.Errorf("%s: the binary has a %s section; Binary must strip it (%s)", p, sec.Name, StripFlags)
			}
		}
		img, err := Build(bin, p, Options{Version: version, Created: created, CACerts: ca})
		if err != nil {
			t.Fatal(err)
		}
		if err := validate.Image(img); err != nil {
			t.Fatalf("%s: not a valid image: %v", p, err)
		}
		checkConfig(t, img, p, version, created)
		files := checkLayer(t, img, created)
		if !bytes.Equal(files[Entrypoint[1:]].data, bin) || !bytes.Equal(files[CACertsPath[1:]].data, ca) {
			t.Errorf("%s: the layer's %s or %s is not what was given", p, Entrypoint, CACertsPath)
		}
		if p.Equals(amd64) && runtime.GOOS == "linux" && runtime.GOARCH == "amd64" {
			// What kvroute version would print, from the binary in the layer.
			exe := filepath.Join(t.TempDir(), "kvroute")
			if err := os.WriteFile(exe, files[Entrypoint[1:]].data, 0o755); err != nil {
				t.Fatal(err)
			}
			out, err := exec.Command(exe).Output()
			if err != nil || strings.TrimSpace(string(out)) != version {
				t.Errorf("the packed binary says version %q (%v), want %q: the link-time variable %s is not internal/version's", out, err, version, VersionVar)
			}
		}
		imgs = append(imgs, img)
	}
	idx, err := Index(imgs...)
	if err != nil {
		t.Fatal(err)
	}
	if err := validate.Index(idx); err != nil {
		t.Fatalf("not a valid index: %v", err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if im.MediaType != types.OCIImageIndex || len(im.Manifests) != 2 {
		t.Fatalf("index %s with %d manifests, want an OCI index of 2", im.MediaType, len(im.Manifests))
	}
	for i, want := range []v1.Platform{amd64, arm64} {
		if m := im.Manifests[i]; m.Platform == nil || !m.Platform.Equals(want) || m.MediaType != types.OCIManifestSchema1 {
			t.Errorf("index entry %d: %s %v, want an OCI manifest for %s", i, m.MediaType, m.Platform, want)
		}
	}

	// The wrong binary for the image is refused.
	if _, err := Build(buildHello(t, amd64, ""), arm64, Options{}); err == nil || !strings.Contains(err.Error(), "not linux/arm64") {
		t.Errorf("an amd64 binary for an arm64 image: %v", err)
	}
	if _, err := Build([]byte("#!/bin/sh\n"), amd64, Options{}); err == nil {
		t.Error("a script in place of a Go binary: no error")
	}
}

// checkConfig checks the image config against the image's shape.
func checkConfig(t *testing.T, img v1.Image, p v1.Platform, version string, created time.Time) {
	t.Helper()
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	if m.MediaType != types.OCIManifestSchema1 || m.Config.MediaType != types.OCIConfigJSON ||
		len(m.Layers) != 1 || m.Layers[0].MediaType != types.OCILayer {
		t.Errorf("%s: manifest %s, config %s, layers %+v; want OCI media types and one gzip layer", p, m.MediaType, m.Config.MediaType, m.Layers)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS != p.OS || cf.Architecture != p.Architecture || !cf.Created.Time.Equal(created) {
		t.Errorf("%s: config for %s/%s created %v, want created %v", p, cf.OS, cf.Architecture, cf.Created, created)
	}
	c := cf.Config
	if !slices.Equal(c.Entrypoint, []string{"/kvroute"}) || len(c.Cmd) != 0 {
		t.Errorf("%s: entrypoint %q, cmd %q; want [/kvroute] and none", p, c.Entrypoint, c.Cmd)
	}
	if c.User != "65532:65532" {
		t.Errorf("%s: user %q, want 65532:65532 (the chart's runAsUser)", p, c.User)
	}
	if _, ok := c.ExposedPorts["8080/tcp"]; !ok || len(c.ExposedPorts) != 1 {
		t.Errorf("%s: exposed ports %v, want 8080/tcp", p, c.ExposedPorts)
	}
	want := map[string]string{
		"org.opencontainers.image.title":    "kvroute",
		"org.opencontainers.image.version":  version,
		"org.opencontainers.image.created":  created.Format(time.RFC3339),
		"org.opencontainers.image.source":   "https://github.com/kvroute/kvroute",
		"org.opencontainers.image.revision": "",
	}
	for k, v := range want {
		got, ok := c.Labels[k]
		if k == "org.opencontainers.image.revision" {
			// From the binary's VCS stamp: absent where the build had
			// no git (a source archive), else a commit.
			if ok && len(strings.TrimSuffix(got, "-dirty")) < 7 {
				t.Errorf("%s: label %s = %q", p, k, got)
			}
			continue
		}
		if got != v {
			t.Errorf("%s: label %s = %q, want %q", p, k, got, v)
		}
	}
	if len(cf.History) != 1 || !cf.History[0].Created.Time.Equal(created) || len(cf.RootFS.DiffIDs) != 1 {
		t.Errorf("%s: history %+v, rootfs %+v; want one entry, at the build time", p, cf.History, cf.RootFS)
	}
}

type file struct {
	hdr  *tar.Header
	data []byte
}

// checkLayer reads the image's one layer: every file has the build's
// time, the root user owns all but the nonroot user's home, and nonroot
// is user 65532 in /etc/passwd and /etc/group.
func checkLayer(t *testing.T, img v1.Image, created time.Time) map[string]file {
	t.Helper()
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers %v, %v; want one", layers, err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	files := map[string]file{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[h.Name] = file{h, data}
		if !h.ModTime.Equal(created) {
			t.Errorf("%s: modified %v, want the build's time %v", h.Name, h.ModTime, created)
		}
		if owner := h.Uid; (h.Name == "home/nonroot/") != (owner == 65532) || h.Gid != owner {
			t.Errorf("%s: owned by %d:%d", h.Name, h.Uid, h.Gid)
		}
	}
	exe, ok := files["kvroute"]
	if !ok || exe.hdr.Typeflag != tar.TypeReg || exe.hdr.Mode&0o111 != 0o111 || exe.hdr.Mode&0o022 != 0 {
		t.Errorf("/kvroute %+v: want a regular file everyone can run and only root can write", exe.hdr)
	}
	user := func(path, line string) {
		sc := bufio.NewScanner(bytes.NewReader(files[path].data))
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), line) {
				return
			}
		}
		t.Errorf("/%s has no line starting %q:\n%s", path, line, files[path].data)
	}
	user("etc/passwd", "nonroot:x:65532:65532:")
	user("etc/group", "nonroot:x:65532:")
	if tmp := files["tmp/"]; tmp.hdr == nil || tmp.hdr.Mode != 0o1777 {
		t.Errorf("/tmp %+v, want mode 1777", tmp.hdr)
	}
	return files
}

// TestReproducible builds the image twice, from two separate builds of
// the binary, and writes each to an OCI layout: the digests and every
// file of the layouts are the same. A different time gives another
// digest, so the digest does depend on what it should.
func TestReproducible(t *testing.T) {
	racetest.Heavy(t, "compresses three images' layers in the test binary (no goroutines to watch)")
	created := time.Date(2026, 11, 5, 10, 0, 0, 0, time.UTC)
	digest := func(bin []byte, o Options) (v1.Hash, string) {
		img, err := Build(bin, amd64, o)
		if err != nil {
			t.Fatal(err)
		}
		idx, err := Index(img)
		if err != nil {
			t.Fatal(err)
		}
		d, err := idx.Digest()
		if err != nil {
			t.Fatal(err)
		}
		dir := filepath.Join(t.TempDir(), "oci")
		if _, err := layout.Write(dir, idx); err != nil {
			t.Fatal(err)
		}
		return d, dir
	}
	o := Options{Version: "1.2.3", Created: created, CACerts: []byte("certs\n")}
	d1, dir1 := digest(buildHello(t, amd64, "1.2.3"), o)
	d2, dir2 := digest(buildHello(t, amd64, "1.2.3"), o)
	if d1 != d2 {
		t.Fatalf("two builds of the same source: index digests %s and %s", d1, d2)
	}
	if a, b := tree(t, dir1), tree(t, dir2); !maps.EqualFunc(a, b, bytes.Equal) {
		t.Errorf("two builds' OCI layouts differ: %v and %v", slices.Sorted(maps.Keys(a)), slices.Sorted(maps.Keys(b)))
	}
	var idx struct {
		Manifests []struct{ Digest string } `json:"manifests"`
	}
	if err := json.Unmarshal(tree(t, dir1)["index.json"], &idx); err != nil || len(idx.Manifests) != 1 {
		t.Fatalf("index.json: %v %+v", err, idx)
	}
	o.Created = created.Add(time.Second)
	if d3, _ := digest(buildHello(t, amd64, "1.2.3"), o); d3 == d1 {
		t.Errorf("another build time gives the same digest %s", d3)
	}
}

// tree reads every file under dir, by its path in dir.
func tree(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		rel, _ := filepath.Rel(dir, path)
		files[rel] = b
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}
