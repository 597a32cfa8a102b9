// Command kvroute-image builds kvroute's container image without Docker or
// a registry, and reproducibly: the same checkout, Go toolchain and CA
// bundle give the same image digest. It builds the static binary for each
// platform, packs it as the repository's Dockerfile would (internal/image),
// and writes an OCI image layout, a tarball that docker load and kind load
// take, or pushes to a registry:
//
//	go run ./cmd/kvroute-image                               # ./kvroute-oci, linux/amd64
//	go run ./cmd/kvroute-image -platform linux/amd64,linux/arm64
//	go run ./cmd/kvroute-image -tar kvroute.tar
//	go run ./cmd/kvroute-image -push registry.example.com/kvroute:0.1.0
//
// Run it from the repository's root (docs/deploy.md, "An image").
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"sigs.k8s.io/yaml"

	"github.com/kvroute/kvroute/internal/image"
)

// chartFile holds the chart's appVersion, the default version and tag, so
// that the chart's defaults (image.repository, image.tag = appVersion) run
// what this builds.
const chartFile = "deploy/helm/kvroute/Chart.yaml"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "kvroute-image:", err)
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("kvroute-image", flag.ContinueOnError)
	version := fs.String("version", "", "the version stamped in the binary (kvroute version) and the image's tag and label; default: "+chartFile+"'s appVersion")
	platforms := fs.String("platform", "linux/amd64", "comma-separated os/arch[/variant] to build for, e.g. linux/amd64,linux/arm64 (each platform is one go build, minutes the first time)")
	ociDir := fs.String("oci", "kvroute-oci", "write an OCI image layout to this directory (crane push DIR REF, skopeo copy oci:DIR docker://REF); must not exist; \"\" for none")
	tarFile := fs.String("tar", "", "also write a docker-style tarball of the first platform's image, tagged -tag (docker load -i, kind load image-archive)")
	push := fs.String("push", "", "also push the image (an index of every platform) to this reference, with the credentials of docker login or crane auth login")
	tag := fs.String("tag", "", "the name in the tarball and the layout; default "+image.Repository+":<version>")
	caCerts := fs.String("ca-certs", "/etc/ssl/certs/ca-certificates.crt", "PEM bundle to put at "+image.CACertsPath+" (this host's CA certificates); \"\" for none")
	pkg := fs.String("pkg", "./cmd/kvroute", "the main package to build")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: go run ./cmd/kvroute-image [flags]   (from the repository's root)")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		fs.Usage()
		return fmt.Errorf("unexpected arguments %q: %w", fs.Args(), flag.ErrHelp)
	}
	if *version == "" {
		v, err := chartAppVersion(chartFile)
		if err != nil {
			return fmt.Errorf("-version not given: %w", err)
		}
		*version = v
	}
	if *tag == "" {
		*tag = image.Repository + ":" + *version
	}
	ref, err := name.NewTag(*tag)
	if err != nil {
		return fmt.Errorf("-tag: %w", err)
	}
	if *ociDir != "" {
		if _, err := os.Stat(*ociDir); err == nil {
			return fmt.Errorf("-oci %s exists; remove it or name another directory", *ociDir)
		}
	}
	opts := image.Options{Version: *version}
	if opts.Created, err = image.SourceDateEpoch(); err != nil {
		return err
	}
	// The commit's revision and time, for a binary Go does not stamp
	// (-buildvcs=false, a git worktree): the image's labels still say
	// where it came from, and when, rather than 1970.
	if rev, at, err := image.Commit(ctx, "."); err != nil {
		fmt.Fprintf(stdout, "no git checkout here (%v): the image's revision and created time come from the binary's VCS stamp, if any\n", err)
	} else {
		opts.Revision = rev
		if opts.Created.IsZero() {
			opts.Created = at
		}
	}
	if *caCerts != "" {
		if opts.CACerts, err = os.ReadFile(*caCerts); err != nil {
			return fmt.Errorf("-ca-certs: %w (name this system's PEM bundle, or -ca-certs \"\" for an image without one)", err)
		}
	}

	var imgs []v1.Image
	var first string
	for _, s := range strings.Split(*platforms, ",") {
		p, err := v1.ParsePlatform(strings.TrimSpace(s))
		if err != nil {
			return fmt.Errorf("-platform: %w", err)
		}
		fmt.Fprintf(stdout, "%s: go build %s (a first build compiles every dependency: minutes)\n", p, *pkg)
		start := time.Now()
		bin, err := image.Binary(ctx, ".", *pkg, *p, *version)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%s: binary %.1f MB (stripped) in %v; compressing the layer\n", p, float64(len(bin))/1e6, time.Since(start).Round(time.Second))
		img, err := image.Build(bin, *p, opts)
		if err != nil {
			return err
		}
		d, err := img.Digest()
		if err != nil {
			return err
		}
		size, err := layerSize(img)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%s\t%s\t(layer %.1f MB compressed)\n", p, d, float64(size)/1e6)
		if imgs = append(imgs, img); first == "" {
			first = p.String()
		}
	}
	idx, err := image.Index(imgs...)
	if err != nil {
		return err
	}
	d, err := idx.Digest()
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "index\t%s\n", d)

	if *ociDir != "" {
		if err := writeLayout(*ociDir, idx, ref); err != nil {
			return fmt.Errorf("-oci %s: %w", *ociDir, err)
		}
		fmt.Fprintf(stdout, "wrote %s (OCI image layout)\n", *ociDir)
	}
	if *tarFile != "" {
		if err := tarball.WriteToFile(*tarFile, ref, imgs[0]); err != nil {
			return fmt.Errorf("-tar %s: %w", *tarFile, err)
		}
		fmt.Fprintf(stdout, "wrote %s (%s, tagged %s)\n", *tarFile, first, ref)
	}
	if *push != "" {
		dst, err := name.ParseReference(*push)
		if err != nil {
			return fmt.Errorf("-push: %w", err)
		}
		if err := remote.WriteIndex(dst, idx, remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
			return fmt.Errorf("-push %s: %w", dst, err)
		}
		fmt.Fprintf(stdout, "pushed %s@%s\n", dst.Context(), d)
	}
	return nil
}

// writeLayout writes an OCI image layout whose index.json names the
// multi-platform index by its tag (org.opencontainers.image.ref.name), as
// skopeo's oci:DIR:TAG and crane push read it, and by its full name.
func writeLayout(dir string, idx v1.ImageIndex, ref name.Tag) error {
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	// containerd (ctr import, and so kind and k3s) names the image after
	// io.containerd.image.name, in Docker's normal form.
	reg := ref.RegistryStr()
	if reg == name.DefaultRegistry {
		reg = "docker.io"
	}
	return p.AppendIndex(idx, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": ref.TagStr(),
		"io.containerd.image.name":          reg + "/" + ref.RepositoryStr() + ":" + ref.TagStr(),
	}))
}

// layerSize is the compressed size of img's layers.
func layerSize(img v1.Image) (int64, error) {
	layers, err := img.Layers()
	if err != nil {
		return 0, err
	}
	var n int64
	for _, l := range layers {
		s, err := l.Size()
		if err != nil {
			return 0, err
		}
		n += s
	}
	return n, nil
}

// chartAppVersion reads the chart's appVersion.
func chartAppVersion(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("%w (run from the repository's root, or give -version)", err)
	}
	var c struct {
		AppVersion string `json:"appVersion"`
	}
	if err := yaml.Unmarshal(b, &c); err != nil || c.AppVersion == "" {
		return "", fmt.Errorf("%s: no appVersion (%v)", path, err)
	}
	return c.AppVersion, nil
}
