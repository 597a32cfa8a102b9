package deploy

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestTryPD runs docs/deploy.md's "Try P/D in five minutes" commands as a
// new user would (bash, curl, the kvroute binary), on free loopback ports
// in place of the page's, and checks that the request it sends is split:
// the answer names the prefill and the decode engine.
func TestTryPD(t *testing.T) {
	if testing.Short() {
		t.Skip("builds kvroute and runs three processes")
	}
	for _, tool := range []string{"bash", "curl"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not on PATH", tool)
		}
	}
	doc, err := os.ReadFile("../docs/deploy.md")
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(doc), "\n## Try P/D in five minutes\n")
	_, script, ok2 := strings.Cut(sec, "```sh\n")
	script, _, ok3 := strings.Cut(script, "```\n")
	if !ok || !ok2 || !ok3 {
		t.Fatal("docs/deploy.md has no Try P/D section with a sh block")
	}
	const build = "go build -o kvroute ./cmd/kvroute\n"
	if !strings.HasPrefix(script, build) {
		t.Fatalf("the section's commands do not start with %q", build)
	}
	dir := t.TempDir()
	start := time.Now()
	if out, err := exec.Command("go", "build", "-o", filepath.Join(dir, "kvroute"), "../cmd/kvroute").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	t.Logf("go build: %v", time.Since(start).Round(time.Millisecond))
	script = strings.TrimPrefix(script, build)
	for _, port := range []string{"8100", "8101", "8102"} {
		if !strings.Contains(script, "127.0.0.1:"+port) {
			t.Fatalf("the commands do not use 127.0.0.1:%s", port)
		}
		script = strings.ReplaceAll(script, "127.0.0.1:"+port, freeAddr(t))
	}

	// A hung command (a router that never gets ready) ends the test
	// rather than the test binary's timeout.
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-e", "-c", script)
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // the background processes go with it
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	// Files, not pipes: the background processes keep their output open
	// after the script ends, and Wait would wait for them.
	stdout, stderr := outFile(t, dir, "stdout"), outFile(t, dir, "stderr")
	cmd.Stdout, cmd.Stderr = stdout, stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
	run := time.Now()
	err = cmd.Wait()
	t.Logf("the commands ran in %v", time.Since(run).Round(time.Millisecond))
	out, _ := os.ReadFile(stdout.Name())
	errOut, _ := os.ReadFile(stderr.Name())
	if err != nil {
		t.Fatalf("the commands failed: %v\nstdout:\n%s\nstderr:\n%s", err, out, errOut)
	}
	headers := map[string]string{}
	for line := range strings.SplitSeq(strings.ReplaceAll(string(out), "\r", ""), "\n") {
		if k, v, ok := strings.Cut(line, ": "); ok {
			headers[strings.ToLower(k)] = v
		}
	}
	if headers["x-kvroute-prefill-backend"] != "prefill-0" || headers["x-kvroute-backend"] != "decode-0" ||
		!strings.HasPrefix(headers["x-kvroute-reason"], "prefill prefill-0: ") || !strings.Contains(headers["x-kvroute-reason"], "; decode decode-0: ") {
		t.Errorf("headers %v: want a split request, prefill-0 then decode-0\nstderr:\n%s", headers, errOut)
	}
}

// outFile is a file in dir for a command's output.
func outFile(t *testing.T, dir, name string) *os.File {
	t.Helper()
	f, err := os.Create(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Close() })
	return f
}

// freeAddr is a loopback address with a port free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}
