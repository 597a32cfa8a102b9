package config

import (
	"fmt"
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// examplePath is the example that docs/configuration.md calls complete,
// with every default.
const examplePath = "../../examples/kvroute.yaml"

// TestExampleHasEveryDefault keeps examples/kvroute.yaml from drifting
// from the config: every key is in it (a backend entry's keys in some
// entry, as a key or, for keys that exclude each other such as url, srv
// and kubernetes, as a commented-out key in the backends list; a list of
// other mappings as the list), and every value but the backends list is
// the default. A default changed without the example fails here.
func TestExampleHasEveryDefault(t *testing.T) {
	b, err := os.ReadFile(examplePath)
	if err != nil {
		t.Fatal(err)
	}
	var root yaml.Node
	if err := yaml.Unmarshal(b, &root); err != nil {
		t.Fatal(err)
	}
	present := map[string]bool{}
	if len(root.Content) == 1 {
		nodeKeys(root.Content[0], "", present)
	}
	commented := commentedBackendKeys(string(b))
	for _, k := range keyPaths(reflect.TypeFor[Config](), "") {
		list, field, inList := strings.Cut(k, "[].")
		switch {
		case !inList:
			if !present[k] {
				t.Errorf("%s has no key %s", examplePath, k)
			}
		case list == "backends":
			if !present[k] && !commented[field] {
				t.Errorf("%s: no backend entry has the key %s, not even commented out", examplePath, field)
			}
		default:
			if !present[list] {
				t.Errorf("%s has no key %s", examplePath, list)
			}
		}
	}

	c, err := Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("%s does not validate: %v", examplePath, err)
	}
	c.Backends = nil
	def := Default()
	def.Backends = nil
	for _, d := range differences(reflect.ValueOf(*c), reflect.ValueOf(*def), "") {
		t.Errorf("%s: %s", examplePath, d)
	}
}

// nodeKeys records the key paths of a YAML mapping node as keyPaths names
// them: "a.b", and "a[].b" for the keys of a list's mappings.
func nodeKeys(n *yaml.Node, prefix string, out map[string]bool) {
	switch n.Kind {
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := prefix + n.Content[i].Value
			out[k] = true
			nodeKeys(n.Content[i+1], k+".", out)
		}
	case yaml.SequenceNode:
		list := strings.TrimSuffix(prefix, ".") + "[]."
		for _, e := range n.Content {
			nodeKeys(e, list, out)
		}
	}
}

// commentedBackendKeys are the keys commented out ("# srv: ...",
// "# - kubernetes: ...") between backends: and the next top-level key.
func commentedBackendKeys(doc string) map[string]bool {
	out := map[string]bool{}
	_, rest, ok := strings.Cut(doc, "\nbackends:")
	if !ok {
		return out
	}
	if i := regexp.MustCompile(`(?m)^[a-z_]+:`).FindStringIndex(rest); i != nil {
		rest = rest[:i[0]]
	}
	for _, m := range regexp.MustCompile(`(?m)^\s*#\s*(?:-\s*)?([a-z_]+):`).FindAllStringSubmatch(rest, -1) {
		out[m[1]] = true
	}
	return out
}

// differences lists the leaves (by key path) where got and want, two
// values of one config type, differ.
func differences(got, want reflect.Value, prefix string) []string {
	t := got.Type()
	if t.Kind() == reflect.Struct && t.PkgPath() == reflect.TypeFor[Config]().PkgPath() && !isScalar(t) {
		var out []string
		for i := range t.NumField() {
			if k := yamlKey(t.Field(i)); k != "" {
				out = append(out, differences(got.Field(i), want.Field(i), prefix+k+".")...)
			}
		}
		return out
	}
	g, w := got.Interface(), want.Interface()
	if reflect.DeepEqual(g, w) || got.Kind() == reflect.Slice && got.Len() == 0 && want.Len() == 0 {
		return nil // [] in the file is the default's nil
	}
	return []string{fmt.Sprintf("%s is %v, the default is %v", strings.TrimSuffix(prefix, "."), show(got), show(want))}
}

// show prints a leaf value as a reader of the file knows it.
func show(v reflect.Value) string {
	if v.Kind() == reflect.Pointer && !v.IsNil() {
		v = v.Elem()
	}
	return fmt.Sprintf("%v", v.Interface())
}
