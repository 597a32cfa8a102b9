package disagg

import (
	"slices"

	"github.com/kvroute/kvroute/internal/request"
)

// A leg's body is the client's with a few top-level members changed. A
// request's body can be hundreds of kilobytes of prompt; decoding it into
// a map and encoding it again, for each leg, cost a split request most of
// its hop at 200 KB (docs/benchmarks.md, "The split hop"). splice copies
// the members it keeps as the client wrote them instead, and writes only
// the ones it sets.

// member is a top-level member a splice sets: key (plain ASCII, written as
// is) to value, a JSON value.
type member struct {
	key   string
	value []byte
	// present sets it only when the body has the key.
	present bool
}

// splice returns body, a JSON object, without any occurrence of the
// members named in drop or set, then with each member of set written once
// after the rest (a key repeated in the body is replaced in all its
// occurrences, so that a reader that takes the last, as json.loads does,
// reads the new value). The members kept are the client's bytes, in the
// client's order, separated by a comma without space. ok is false, and out
// nil, when body is not a JSON object (Members' rules).
func splice(body []byte, drop []string, set ...member) (out []byte, ok bool) {
	var seen uint64 // bit i: set[i].key is in the body
	var keep [][2]int
	err := request.Members(body, func(key []byte, start, _, end int) {
		for i := range set {
			if string(key) == set[i].key {
				seen |= 1 << i
				return
			}
		}
		if slices.Contains(drop, string(key)) {
			return
		}
		keep = append(keep, [2]int{start, end})
	})
	if err != nil {
		return nil, false
	}
	n := len(body) + 2
	for _, m := range set {
		n += len(m.key) + len(m.value) + 4
	}
	out = make([]byte, 0, n)
	out = append(out, '{')
	for _, k := range keep {
		if len(out) > 1 {
			out = append(out, ',')
		}
		out = append(out, body[k[0]:k[1]]...)
	}
	for i, m := range set {
		if m.present && seen&(1<<i) == 0 {
			continue
		}
		if len(out) > 1 {
			out = append(out, ',')
		}
		out = append(out, '"')
		out = append(out, m.key...)
		out = append(out, '"', ':')
		out = append(out, m.value...)
	}
	return append(out, '}'), true
}
