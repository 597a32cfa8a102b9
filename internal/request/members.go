package request

import "errors"

// Members calls member for each top-level member of body, a JSON object,
// in order: its decoded key (valid only during the call) and the offsets
// in body of the member (start, its key's opening quote), of its value
// and of the value's end. It validates the whole body as Parse does (the same scanner, the
// same rules as Python's json.loads) and returns an error, having called
// member for some members or none, when body is not one JSON object.
// Repeated keys are each reported: a reader takes the last, as json.loads
// does. It is how a body is rewritten without being decoded and encoded
// again (package disagg splices the legs of a split request).
func Members(body []byte, member func(key []byte, start, value, end int)) error {
	if len(body) > maxBody {
		return errors.New("body too large")
	}
	d := scanner{buf: body}
	d.space()
	if d.peek() != '{' {
		return errors.New("not a JSON object")
	}
	ok := d.members(func(key []byte) bool {
		start, value := d.keyAt, d.pos
		if !d.skip() {
			return false
		}
		member(key, start, value, d.pos)
		return true
	})
	if ok {
		d.space()
		if d.pos != len(body) {
			ok = d.unexpected("the end of the body")
		}
	}
	if !ok {
		if d.err == nil {
			return errors.New("invalid JSON")
		}
		return d.err
	}
	return nil
}
