package request

import (
	"reflect"
	"testing"
)

// TestMembers: each top-level member with its decoded key and offsets
// (key, value, end), repeated keys each reported, and the bodies that are
// not one JSON object refused as Parse refuses them.
func TestMembers(t *testing.T) {
	type got struct {
		key               string
		start, value, end int
	}
	body := ` { "a" : [1, {"b":2}] ,"str\u0065am":true,"a":"x"} `
	var members []got
	if err := Members([]byte(body), func(key []byte, start, value, end int) {
		members = append(members, got{string(key), start, value, end})
	}); err != nil {
		t.Fatal(err)
	}
	want := []got{{"a", 3, 9, 21}, {"stream", 23, 37, 41}, {"a", 42, 46, 49}}
	if !reflect.DeepEqual(members, want) {
		t.Fatalf("members %+v, want %+v", members, want)
	}
	for _, m := range want {
		if body[m.start] != '"' {
			t.Errorf("member %q does not start at its key's quote", m.key)
		}
	}
	for _, bad := range []string{``, `[]`, `{"a":1`, `{"a":1} {}`, "{\"a\":\"\xff\"}", `{"a":"\ud800"}`, `{"a":NaN}`, `{"a":1,}`} {
		if err := Members([]byte(bad), func([]byte, int, int, int) {}); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}
