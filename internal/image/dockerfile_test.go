package image

import (
	"os"
	"strings"
	"testing"
)

// instruction is one Dockerfile instruction, continuation lines joined.
type instruction struct{ cmd, args string }

// parseDockerfile reads the instructions of a Dockerfile: comments and
// blank lines dropped, lines ending in a backslash joined.
func parseDockerfile(t *testing.T, path string) []instruction {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []instruction
	var cur strings.Builder
	for line := range strings.SplitSeq(string(b), "\n") {
		trimmed := strings.TrimSpace(line)
		if cur.Len() == 0 && (trimmed == "" || strings.HasPrefix(trimmed, "#")) {
			continue
		}
		if body, ok := strings.CutSuffix(trimmed, `\`); ok {
			cur.WriteString(body + " ")
			continue
		}
		cur.WriteString(trimmed)
		cmd, args, _ := strings.Cut(cur.String(), " ")
		out = append(out, instruction{strings.ToUpper(cmd), strings.Join(strings.Fields(args), " ")})
		cur.Reset()
	}
	return out
}

// TestDockerfile holds the repository's Dockerfile to the image Build
// makes: the final stage runs the static binary at Entrypoint as User,
// exposes Port and carries Labels, and the build stage builds it as Binary
// does (cgo off, -trimpath, stripped, the version at VersionVar).
func TestDockerfile(t *testing.T) {
	ins := parseDockerfile(t, "../../Dockerfile")
	last := 0
	for i, in := range ins {
		if in.cmd == "FROM" {
			last = i
		}
	}
	final := map[string][]string{}
	for _, in := range ins[last:] {
		final[in.cmd] = append(final[in.cmd], in.args)
	}
	if from := final["FROM"][0]; !strings.HasPrefix(from, "gcr.io/distroless/static-") || !strings.HasSuffix(from, ":nonroot") {
		t.Errorf("final stage FROM %s, want distroless static, nonroot", from)
	}
	want := map[string]string{
		"USER":       User,
		"EXPOSE":     strings.TrimSuffix(Port, "/tcp"),
		"ENTRYPOINT": `["` + Entrypoint + `"]`,
		"COPY":       "--from=build /out/kvroute " + Entrypoint,
	}
	for cmd, args := range want {
		if got := final[cmd]; len(got) != 1 || got[0] != args {
			t.Errorf("final stage %s %q, want %s %s", cmd, got, cmd, args)
		}
	}
	if len(final["CMD"]) != 0 || len(final["RUN"]) != 0 {
		t.Errorf("final stage runs %q, has CMD %q; want neither (distroless has no shell)", final["RUN"], final["CMD"])
	}
	labels := strings.Join(final["LABEL"], " ")
	for k, v := range Labels {
		if !strings.Contains(labels, k+`="`+v+`"`) {
			t.Errorf("LABEL lacks %s=%q", k, v)
		}
	}
	for _, k := range []string{"org.opencontainers.image.version", "org.opencontainers.image.revision"} {
		if !strings.Contains(labels, k+"=") {
			t.Errorf("LABEL lacks %s", k)
		}
	}
	build := ""
	for _, in := range ins[:last] {
		if in.cmd == "RUN" && strings.Contains(in.args, "go build") {
			build = in.args
		}
	}
	for _, s := range []string{"CGO_ENABLED=0", "-trimpath", `-ldflags "` + StripFlags + ` -X ` + VersionVar + `=${VERSION}"`, "-o /out/kvroute ./cmd/kvroute"} {
		if !strings.Contains(build, s) {
			t.Errorf("the build stage's go build %q lacks %q", build, s)
		}
	}
}
