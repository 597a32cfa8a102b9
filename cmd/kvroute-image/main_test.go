package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"sigs.k8s.io/yaml"

	"github.com/kvroute/kvroute/internal/racetest"
)

// TestDefaultsRunInTheChart builds an image with the command's defaults
// (but for a small program in place of kvroute, one platform and no CA
// file) and checks that the chart's defaults name it: the tarball's tag is
// values.yaml's image.repository and Chart.yaml's appVersion, which is
// also the image's version; the OCI layout holds the index the command
// printed, under that tag.
func TestDefaultsRunInTheChart(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command on PATH to build the test binary with")
	}
	t.Chdir("../..")
	var chart struct {
		AppVersion string `json:"appVersion"`
	}
	var values struct {
		Image struct {
			Repository string `json:"repository"`
			Tag        string `json:"tag"`
		} `json:"image"`
	}
	for path, v := range map[string]any{"deploy/helm/kvroute/Chart.yaml": &chart, "deploy/helm/kvroute/values.yaml": &values} {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(b, v); err != nil {
			t.Fatal(err)
		}
	}
	if values.Image.Tag != "" {
		t.Fatalf("values.yaml image.tag %q: the chart no longer runs its appVersion", values.Image.Tag)
	}
	dir := t.TempDir()
	oci, tarFile := filepath.Join(dir, "oci"), filepath.Join(dir, "kvroute.tar")
	args := []string{"-platform", "linux/amd64", "-pkg", "./internal/image/testdata/hello", "-ca-certs", "", "-oci", oci, "-tar", tarFile}
	var out bytes.Buffer
	if err := run(context.Background(), args, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}

	tag, err := name.NewTag(values.Image.Repository + ":" + chart.AppVersion)
	if err != nil {
		t.Fatal(err)
	}
	img, err := tarball.ImageFromPath(tarFile, &tag)
	if err != nil {
		t.Fatalf("the tarball has no image tagged %s, which the chart runs by default: %v", tag, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if v := cf.Config.Labels["org.opencontainers.image.version"]; v != chart.AppVersion {
		t.Errorf("image version %q, want the chart's appVersion %q", v, chart.AppVersion)
	}

	lp, err := layout.ImageIndexFromPath(oci)
	if err != nil {
		t.Fatal(err)
	}
	im, err := lp.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 || !im.Manifests[0].MediaType.IsIndex() ||
		im.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != chart.AppVersion ||
		im.Manifests[0].Annotations["io.containerd.image.name"] != "docker.io/"+values.Image.Repository+":"+chart.AppVersion ||
		!strings.Contains(out.String(), "index\t"+im.Manifests[0].Digest.String()) {
		t.Errorf("layout index %+v; want one index, tagged %s, that the output names:\n%s", im.Manifests, chart.AppVersion, out.String())
	}

	// It says what it does while it does it, and the image says which
	// commit it was built from, and when (the commit's time, not 1970),
	// whether or not Go stamped the binary.
	for _, line := range []string{"linux/amd64: go build ./internal/image/testdata/hello", "linux/amd64: binary ", "layer "} {
		if !strings.Contains(out.String(), line) {
			t.Errorf("output lacks %q:\n%s", line, out.String())
		}
	}
	if head, err := exec.Command("git", "log", "-1", "--format=%H %cI").Output(); err == nil {
		rev, at, _ := strings.Cut(strings.TrimSpace(string(head)), " ")
		labels := cf.Config.Labels
		if !strings.HasPrefix(labels["org.opencontainers.image.revision"], rev) {
			t.Errorf("revision label %q, want the commit %s", labels["org.opencontainers.image.revision"], rev)
		}
		want, _ := time.Parse(time.RFC3339, at)
		if os.Getenv("SOURCE_DATE_EPOCH") == "" && !cf.Created.Time.Equal(want) {
			t.Errorf("created %v, want the commit's time %v", cf.Created.Time, want)
		}
	}

	// A second run does not add to (or overwrite) the layout.
	if err := run(context.Background(), args, &out); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Errorf("a second run into %s: %v, want a refusal", oci, err)
	}
}

// maxLayerBytes bounds kvroute's amd64 image layer, compressed: the
// stripped binary and the CA bundle (about 20 MB in December 2026). A
// binary that grows past it should be a decision, not an accident.
const maxLayerBytes = 25_000_000

// TestKvrouteImageSize builds kvroute's own linux/amd64 image, as the
// command's defaults do, and holds its layer to maxLayerBytes.
func TestKvrouteImageSize(t *testing.T) {
	if testing.Short() {
		t.Skip("builds kvroute for linux/amd64")
	}
	racetest.Heavy(t, "the image's layers are compressed in this test binary, some tenfold slower under the race detector")
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command on PATH")
	}
	t.Chdir("../..")
	oci := filepath.Join(t.TempDir(), "oci")
	var out bytes.Buffer
	if err := run(context.Background(), []string{"-platform", "linux/amd64", "-oci", oci}, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	lp, err := layout.ImageIndexFromPath(oci)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := lp.IndexManifest()
	if err != nil || len(idx.Manifests) != 1 {
		t.Fatalf("layout index %+v: %v", idx, err)
	}
	inner, err := lp.ImageIndex(idx.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	im, err := inner.IndexManifest()
	if err != nil || len(im.Manifests) != 1 {
		t.Fatalf("image index %+v: %v", im, err)
	}
	img, err := inner.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	size, err := layerSize(img)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("linux/amd64 layer: %.1f MB compressed", float64(size)/1e6)
	if size > maxLayerBytes {
		t.Errorf("the linux/amd64 layer is %d bytes compressed, more than %d:\n%s", size, maxLayerBytes, out.String())
	}
}
