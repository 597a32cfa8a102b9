package epp_test

import (
	"context"
	"encoding/json"
	"io"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/epp"
)

// FuzzProcess: whatever a data plane sends (any headers and metadata, any
// body in chunks of any size, any response phase), the picker answers with
// a decision naming an engine of the pool or an immediate response in
// OpenAI's error shape, never crashes, and releases everything once the
// stream ends.
func FuzzProcess(f *testing.F) {
	rg := newRig(f, 2, func(c *config.Config) { c.Limits.MaxBodyBytes = 64 << 10 })
	hs, _ := proto.Marshal(&corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":path", RawValue: []byte("/v1/chat/completions")}}})
	sub, _ := structpb.NewStruct(map[string]any{epp.KeySubset: []any{"127.0.0.1:1"}})
	md, _ := proto.Marshal(&corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{epp.MetadataSubset: sub}})
	f.Add(hs, []byte(nil), []byte(chat("s", "hi", true)), 7, []byte(nil), uint16(200))
	f.Add([]byte(nil), md, []byte(chat("s", "hi", false)), 0, hs, uint16(503))
	f.Add(hs, []byte(nil), []byte(`{"model":"m","prompt":"x"}`), 1, []byte(nil), uint16(0))
	f.Add([]byte(nil), []byte(nil), []byte(`{"model":`), 3, []byte(nil), uint16(200))
	f.Fuzz(func(t *testing.T, headers, metadata, body []byte, chunk int, respHeaders []byte, code uint16) {
		var h, rh corev3.HeaderMap
		var m corev3.Metadata
		_ = proto.Unmarshal(headers, &h)
		_ = proto.Unmarshal(respHeaders, &rh)
		_ = proto.Unmarshal(metadata, &m)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		st := rg.open(t, ctx)
		send(t, st, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
			RequestHeaders: &extprocv3.HttpHeaders{Headers: &h, EndOfStream: len(body) == 0}}, MetadataContext: &m})
		if chunk <= 0 || chunk > len(body) {
			chunk = len(body)
		}
		for b := body; len(b) > 0; {
			n := min(chunk, len(b))
			send(t, st, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
				RequestBody: &extprocv3.HttpBody{Body: b[:n], EndOfStream: n == len(b)}}})
			b = b[n:]
		}
		var d decision
		if len(body) == 0 {
			// Nothing to route on (GET /v1/models): the headers' answer
			// alone, a pick without accounting, or an immediate response.
			d = readBodiless(t, st)
		} else {
			d = readDecision(t, st)
		}
		if d.immediate != nil {
			var e struct {
				Error struct{ Message string } `json:"error"`
			}
			if c := d.immediate.GetStatus().GetCode(); c < 400 || json.Unmarshal(d.immediate.GetBody(), &e) != nil || e.Error.Message == "" {
				t.Fatalf("immediate %d %q", c, d.immediate.GetBody())
			}
			cancel()
			rg.waitIdle(t)
			return
		}
		if rg.byAddr[d.dest] == nil || d.metadata != d.dest {
			t.Fatalf("destination %q, metadata %q", d.dest, d.metadata)
		}
		rh.Headers = append(rh.Headers, &corev3.HeaderValue{Key: ":status", Value: string(rune('0' + code%10))})
		send(t, st, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{
			ResponseHeaders: &extprocv3.HttpHeaders{Headers: &rh}}, MetadataContext: &m})
		send(t, st, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
			ResponseBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}}})
		if err := st.CloseSend(); err != nil {
			t.Fatal(err)
		}
		for {
			if _, err := st.Recv(); err == io.EOF {
				break
			} else if err != nil {
				t.Fatalf("recv: %v", err)
			}
		}
		rg.waitIdle(t)
	})
}

// readBodiless reads the picker's one answer to a request without a body.
func readBodiless(t *testing.T, st extprocv3.ExternalProcessor_ProcessClient) decision {
	t.Helper()
	resp, err := st.Recv()
	if err != nil {
		t.Fatalf("recv: %v", err)
	}
	if ir := resp.GetImmediateResponse(); ir != nil {
		return decision{immediate: ir}
	}
	var d decision
	for _, h := range resp.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
		if h.GetHeader().GetKey() == epp.HeaderDestination {
			d.dest = string(h.GetHeader().GetRawValue())
		}
	}
	d.metadata = resp.GetDynamicMetadata().GetFields()[epp.MetadataLB].GetStructValue().GetFields()[epp.HeaderDestination].GetStringValue()
	return d
}
