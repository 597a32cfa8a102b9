package config

import (
	"reflect"
	"strings"
)

// keyPaths lists the leaf keys of t's yaml tags: "section.key", and
// "list[].key" for the fields of list elements.
func keyPaths(t reflect.Type, prefix string) []string {
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		name := yamlKey(f)
		if name == "" {
			continue
		}
		key := prefix + name
		ft := f.Type
		switch {
		case ft.Kind() == reflect.Struct && ft.PkgPath() == t.PkgPath() && !isScalar(ft):
			out = append(out, keyPaths(ft, key+".")...)
		case ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct:
			out = append(out, keyPaths(ft.Elem(), key+"[].")...)
		default:
			out = append(out, key)
		}
	}
	return out
}

// yamlKey is the key of a struct field in the file, "" for none.
func yamlKey(f reflect.StructField) string {
	name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
	if name == "-" {
		return ""
	}
	return name
}

// isScalar reports whether a struct type of this package decodes from a
// YAML scalar (it has its own UnmarshalYAML).
func isScalar(t reflect.Type) bool {
	_, ok := reflect.PointerTo(t).MethodByName("UnmarshalYAML")
	return ok
}

// structKeys maps each mapping type of the file (as the YAML decoder names
// it in an error, "config.Backend") to its keys.
var structKeys = func() map[string][]string {
	m := map[string][]string{}
	var walk func(t reflect.Type)
	walk = func(t reflect.Type) {
		for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct || t.PkgPath() != reflect.TypeFor[Config]().PkgPath() || isScalar(t) {
			return
		}
		if _, seen := m[t.String()]; seen {
			return
		}
		m[t.String()] = nil
		for i := range t.NumField() {
			if k := yamlKey(t.Field(i)); k != "" {
				m[t.String()] = append(m[t.String()], k)
				walk(t.Field(i).Type)
			}
		}
	}
	walk(reflect.TypeFor[Config]())
	return m
}()

// nearestKey is the key of the mapping type typ (as structKeys names it)
// nearest to key, the unknown one, by edit distance; "" when none is near
// enough to be a likely typo: at most a third of the longer name's
// letters apart, and at most 3.
func nearestKey(typ, key string) string {
	best, bestD := "", 0
	for _, k := range structKeys[typ] {
		d := editDistance(key, k)
		if limit := min(3, max(len(key), len(k))/3); d > max(limit, 1) {
			continue
		}
		if best == "" || d < bestD {
			best, bestD = k, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b, in bytes (the
// file's keys are ASCII), with a swap of two neighbours counted once, as
// a typist makes it.
func editDistance(a, b string) int {
	// d[i][j] is the distance between a[:i] and b[:j]; three rows kept.
	prev2, prev, cur := make([]int, len(b)+1), make([]int, len(b)+1), make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(b)]
}
