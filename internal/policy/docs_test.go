package policy

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestDocsListEveryPolicy: docs/configuration.md's policy row names every
// policy kvroute serve accepts (and lists in serve -h), and no other.
func TestDocsListEveryPolicy(t *testing.T) {
	doc, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	var row string
	for line := range strings.SplitSeq(string(doc), "\n") {
		if strings.HasPrefix(line, "| `policy` |") {
			row = line
		}
	}
	if row == "" {
		t.Fatal("docs/configuration.md has no `policy` row")
	}
	// The row's third cell: what the key takes.
	cells := strings.Split(row, " | ")
	if len(cells) < 3 {
		t.Fatalf("policy row %q has no description", row)
	}
	desc := cells[2]
	listed := map[string]bool{}
	for _, m := range regexp.MustCompile("`([a-z0-9-]+)`").FindAllStringSubmatch(desc, -1) {
		listed[m[1]] = true
	}
	for _, n := range Names() {
		if !listed[n] {
			t.Errorf("docs/configuration.md's policy row does not list %s", n)
		}
		delete(listed, n)
	}
	for n := range listed {
		t.Errorf("docs/configuration.md's policy row lists %s, which is no policy", n)
	}
}
