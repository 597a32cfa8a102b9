package workload

import (
	"encoding/json"
	"testing"
	"time"
)

func TestAdapters(t *testing.T) {
	opt := Options{Rate: 50, Duration: 120 * time.Second, Seed: 3, Adapters: 16, AdapterZipf: 1}
	reqs, err := Load("chat", opt)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := Load("chat", opt)
	count := map[string]int{}
	bySession := map[string]string{}
	for i, r := range reqs {
		if r.Adapter != again[i].Adapter {
			t.Fatalf("request %d: adapter %q, then %q with the same seed", i, r.Adapter, again[i].Adapter)
		}
		count[r.Adapter]++
		if a, ok := bySession[r.Session]; ok && a != r.Adapter {
			t.Errorf("session %s asks for %s, then %s", r.Session, a, r.Adapter)
		}
		bySession[r.Session] = r.Adapter
		var body struct{ Model string }
		if err := json.Unmarshal(r.Body("base"), &body); err != nil || body.Model != r.Adapter {
			t.Fatalf("request %d: body model %q (%v), want its adapter %q", i, body.Model, err, r.Adapter)
		}
	}
	// Zipf: the most popular adapter is chosen by more conversations than
	// the tenth, and the whole range is used.
	sessions := map[string]int{}
	for _, a := range bySession {
		sessions[a]++
	}
	if sessions[AdapterName(0)] <= sessions[AdapterName(9)] || len(sessions) < 12 {
		t.Errorf("conversations per adapter %v: not Zipf over 16", sessions)
	}
	if n := len(reqs); count[""] != 0 || n == 0 {
		t.Errorf("%d requests, %d without an adapter", n, count[""])
	}
	plain, _ := Load("chat", Options{Rate: 50, Duration: 10 * time.Second, Seed: 3})
	var body struct{ Model string }
	if err := json.Unmarshal(plain[0].Body("base"), &body); err != nil || plain[0].Adapter != "" || body.Model != "base" {
		t.Errorf("without adapters: adapter %q, model %q", plain[0].Adapter, body.Model)
	}
	for _, bad := range []Options{{Adapters: -1}, {Adapters: 4, AdapterZipf: -1}, {Adapters: MaxAdapters + 1}} {
		if _, err := Load("chat", bad); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}
