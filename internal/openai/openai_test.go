package openai

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
)

// An error message quoting the client's input keeps <, > and & as written
// (not \u003c...), and the body stays valid JSON of the OpenAI error shape
// with a Content-Length that matches it.
func TestWriteErrorKeepsMarkup(t *testing.T) {
	for _, tc := range []struct {
		name, msg string
		code      string
		wantCode  any
	}{
		{"angle brackets", `model "<none>" is not served`, "model_not_found", "model_not_found"},
		{"ampersand", `a & b > c`, "", nil},
		{"quotes and newline", "say \"hi\"\nthen", "x", "x"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			WriteError(rec, http.StatusBadRequest, TypeInvalidRequest, tc.code, tc.msg, 0)
			body := rec.Body.String()
			if strings.Contains(body, `\u003c`) || strings.Contains(body, `\u003e`) || strings.Contains(body, `\u0026`) {
				t.Errorf("body escapes markup: %s", body)
			}
			if got := rec.Header().Get("Content-Length"); got != strconv.Itoa(len(body)) {
				t.Errorf("Content-Length %s, body %d bytes", got, len(body))
			}
			var eb struct {
				Error struct {
					Message string `json:"message"`
					Type    string `json:"type"`
					Code    any    `json:"code"`
				} `json:"error"`
			}
			if err := json.Unmarshal([]byte(body), &eb); err != nil {
				t.Fatalf("not JSON: %v: %s", err, body)
			}
			if eb.Error.Message != tc.msg || eb.Error.Type != TypeInvalidRequest || eb.Error.Code != tc.wantCode {
				t.Errorf("decoded %+v", eb.Error)
			}
			if !strings.HasSuffix(body, "}\n") {
				t.Errorf("body does not end in one newline: %q", body)
			}
		})
	}
}
