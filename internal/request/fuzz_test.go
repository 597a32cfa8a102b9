package request

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzParse checks that no body makes Parse panic, that every rejection is
// a client error (4xx) with a type and a message, that a parsed view is
// well formed (valid UTF-8 prompt, no negative counts) and that parsing is
// deterministic; and that Parse agrees with refParse, the reference on
// encoding/json's maps (which read a body as json.loads does, see
// ref_test.go): it accepts a body iff refParse does, with the same view,
// and else rejects it with the same error code. Both run with the default
// limits and with tiny ones. Seeds are the bodies in testdata/seeds, for
// both endpoints: odd content parts, invalid UTF-8, deeply nested and long
// bodies, escapes and repeated keys among them.
func FuzzParse(f *testing.F) {
	for _, b := range seedBodies(f) {
		f.Add(b, false, "user")
		f.Add(b, true, "")
	}
	f.Fuzz(func(t *testing.T, body []byte, completion bool, field string) {
		k := Chat
		if completion {
			k = Completion
		}
		for _, opt := range []Options{{SessionField: field}, {SessionField: field, MaxMessages: 2, MaxContentParts: 2, MaxPromptItems: 3}} {
			sameAsReference(t, k, body, opt)
		}
		v, e := Parse(k, body, Options{SessionField: field})
		if e != nil {
			if v != nil {
				t.Fatal("both a view and an error")
			}
			if e.Status < 400 || e.Status > 499 || e.Type == "" || e.Message == "" {
				t.Fatalf("error %+v is not a well-formed client error", e)
			}
			return
		}
		if v == nil {
			t.Fatal("neither a view nor an error")
		}
		if v.PromptTokens < 0 || v.MaxTokens < 0 || v.MinTokens < 0 {
			t.Fatalf("negative counts in %+v", v)
		}
		// A body with invalid UTF-8 is refused, so the index hashes valid
		// text.
		if !utf8.ValidString(v.Prompt) || !utf8.ValidString(v.Model) {
			t.Fatalf("invalid UTF-8 in the view: model %q prompt %q", v.Model, v.Prompt)
		}
		if !strings.Contains(v.Prompt, v.FirstUser) {
			t.Fatalf("first user text %q is not part of the prompt", v.FirstUser)
		}
		again, e := Parse(k, body, Options{SessionField: field})
		if e != nil || !reflect.DeepEqual(v, again) {
			t.Fatalf("Parse is not deterministic: %+v then %+v (%v)", v, again, e)
		}
	})
}

// seedBodies are the bodies in testdata/seeds.
func seedBodies(f *testing.F) [][]byte {
	seeds, err := filepath.Glob("testdata/seeds/*.json")
	if err != nil || len(seeds) == 0 {
		f.Fatalf("no seeds in testdata/seeds: %v", err)
	}
	var bodies [][]byte
	for _, p := range seeds {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		bodies = append(bodies, b)
	}
	return bodies
}

// sameAsReference fails unless Parse and refParse agree on body.
func sameAsReference(t *testing.T, k Kind, body []byte, opt Options) {
	t.Helper()
	v, e := Parse(k, body, opt)
	rv, re := refParse(k, body, opt)
	switch {
	case (e == nil) != (re == nil):
		t.Fatalf("%s body %q with %+v: Parse gives %+v, %v; the reference gives %+v, %v", k, body, opt, v, e, rv, re)
	case e != nil && e.Code != re.Code:
		t.Fatalf("%s body %q with %+v: Parse fails with %s (%s), the reference with %s (%s)", k, body, opt, e.Code, e.Message, re.Code, re.Message)
	case e == nil && *v != *rv:
		t.Fatalf("%s body %q with %+v: Parse gives\n%+v\nthe reference gives\n%+v", k, body, opt, *v, *rv)
	}
}

// FuzzModelOf: ModelOf never panics, and on a JSON body it accepts what
// the reference accepts (see refParse), with the top-level "model" string
// it finds.
func FuzzModelOf(f *testing.F) {
	f.Add("application/json", []byte(`{"model":"m","input":["a",1]}`))
	f.Add("application/json", []byte(`{"MODEL":"m","model":null}`))
	f.Add("application/json", []byte(`{"model":"a","MODEL":"b","mod\u0065l":"c"}`))
	f.Add("multipart/form-data; boundary=x", []byte("--x\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwhisper\r\n--x--\r\n"))
	f.Fuzz(func(t *testing.T, ct string, body []byte) {
		model, e := ModelOf(ct, body)
		if strings.HasPrefix(ct, "multipart/") || len(bytes.Trim(body, " \t\r\n")) == 0 {
			return
		}
		var top map[string]json.RawMessage
		var ref string
		err := refStrict(body)
		if err == nil {
			err = json.Unmarshal(body, &top)
		}
		if err == nil {
			err = refValue(top["model"], &ref)
		}
		if (e == nil) != (err == nil) || e == nil && ref != model {
			t.Fatalf("ModelOf(%q) = %q, %v; the reference gives %q, %v", body, model, e, ref, err)
		}
	})
}
