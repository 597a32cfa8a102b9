//go:build goexperiment.jsonv2

package libs

import (
	"bytes"
	"encoding/json/jsontext"
	"testing"
)

// BenchmarkJSONText reads every token of the body, strings unescaped: a
// lower bound of a Parse on jsontext.Decoder.
func BenchmarkJSONText(b *testing.B) {
	run(b, func(body []byte) int {
		d := jsontext.NewDecoder(bytes.NewReader(body))
		n := 0
		for {
			tok, err := d.ReadToken()
			if err != nil {
				break
			}
			if tok.Kind() == '"' {
				n += len(tok.String())
			}
		}
		return n
	})
}
