package proxy

import (
	"net/http"
	"strings"

	"github.com/kvroute/kvroute/internal/openai"
)

// guardFraming answers, before anything reaches a backend, the requests
// whose HTTP/1.1 framing the router does not pass on:
//
//   - A request with a Transfer-Encoding gets "Connection: close": RFC
//     9112 section 6.3 says a server that receives both Content-Length
//     and Transfer-Encoding must close the connection after responding,
//     since the two framings may disagree (request smuggling). net/http
//     processes the Transfer-Encoding and deletes the Content-Length
//     before any handler sees the request, so the router cannot tell the
//     two cases apart and closes after every request with a chunked
//     body; API clients (the OpenAI SDKs among them) send a
//     Content-Length and keep their connections.
//   - A protocol upgrade (Upgrade listed in Connection: WebSocket and the
//     like) gets 501 in the OpenAI shape: the OpenAI API has none, and the
//     reverse proxy would otherwise hand the upgrade to a backend. An h2c
//     upgrade offer (curl --http2 on http://) is ignored, as net/http
//     itself would, and the request is served over HTTP/1.1.
func guardFraming(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if len(r.TransferEncoding) > 0 {
			w.Header().Set("Connection", "close")
		}
		if up := upgradeOf(r.Header); up != "" {
			if !strings.EqualFold(up, "h2c") {
				w.Header().Set("Connection", "close")
				openai.WriteError(w, http.StatusNotImplemented, openai.TypeInvalidRequest, "upgrade_not_supported",
					"protocol upgrades ("+up+") are not supported; the API is plain HTTP requests", 0)
				return
			}
			r.Header.Del("Upgrade")
		}
		next.ServeHTTP(w, r)
	})
}

// upgradeOf returns the protocol a request asks to upgrade to: its Upgrade
// header when Connection lists "upgrade", else "".
func upgradeOf(h http.Header) string {
	up := h.Get("Upgrade")
	if up == "" {
		return ""
	}
	for _, v := range h["Connection"] {
		for tok := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(tok), "upgrade") {
				return up
			}
		}
	}
	return ""
}
