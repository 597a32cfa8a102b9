package request

import (
	"strings"
	"testing"
)

func TestMaxMessagesOption(t *testing.T) {
	body := []byte(`{"model":"m","messages":[` + strings.Repeat(`{"role":"user","content":"x"},`, 4) + `{"role":"user","content":"x"}]}`)
	tests := []struct {
		limit   int
		wantErr bool
	}{{0, false}, {5, false}, {4, true}, {1, true}}
	for _, tt := range tests {
		_, e := Parse(Chat, body, Options{MaxMessages: tt.limit})
		if (e != nil) != tt.wantErr {
			t.Errorf("limit %d: error %v, want error %v", tt.limit, e, tt.wantErr)
		}
		if e != nil && (e.Status != 400 || e.Code != "too_many_messages") {
			t.Errorf("limit %d: %+v, want 400 too_many_messages", tt.limit, e)
		}
	}
}
