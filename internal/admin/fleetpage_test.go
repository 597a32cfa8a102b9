package admin

import (
	"net/http"
	"regexp"
	"strings"
	"testing"
)

func TestFleetPage(t *testing.T) {
	t.Run("off without a token", func(t *testing.T) {
		h := New("", newFakeSource("b0"), NewLog(4))
		for _, p := range []string{"/admin/", "/admin/fleet"} {
			if status, _, _ := call(t, h, http.MethodGet, p, ""); status != 404 {
				t.Errorf("GET %s with the API off: status %d, want 404", p, status)
			}
		}
	})

	h := New("s3cret-token", newFakeSource("secret-backend-name"), NewLog(4))
	for _, p := range []string{"/admin/", "/admin/fleet"} {
		status, body, hdr := call(t, h, http.MethodGet, p, "")
		if status != 200 {
			t.Fatalf("GET %s: status %d, want 200: %s", p, status, body)
		}
		if ct := hdr.Get("Content-Type"); ct != "text/html; charset=utf-8" {
			t.Errorf("GET %s: Content-Type %q", p, ct)
		}
		for k, want := range map[string]string{"X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer", "Cache-Control": "no-store"} {
			if got := hdr.Get(k); got != want {
				t.Errorf("GET %s: %s %q, want %q", p, k, got, want)
			}
		}
		// The page is public, so it must carry nothing but itself: no
		// router state, no token.
		if strings.Contains(body, "secret-backend-name") || strings.Contains(body, "s3cret-token") {
			t.Errorf("GET %s: the page carries router state or the token", p)
		}
		checkSelfContained(t, body)
		checkCSP(t, hdr.Get("Content-Security-Policy"), body)
	}

	// What the page shows comes from calls that need the token.
	for _, p := range []string{"/admin/backends", "/admin/decisions?limit=50"} {
		if status, _, _ := call(t, h, http.MethodGet, p, ""); status != 401 {
			t.Errorf("GET %s without the token: status %d, want 401", p, status)
		}
		if status, _, _ := call(t, h, http.MethodGet, p, "Bearer s3cret-token"); status != 200 {
			t.Errorf("GET %s with the token: status %d, want 200", p, status)
		}
	}
	if status, _, _ := call(t, h, http.MethodPost, "/admin/fleet", ""); status != 405 {
		t.Errorf("POST /admin/fleet: status %d, want 405", status)
	}
	if status, _, _ := call(t, h, http.MethodGet, "/admin/fleet/x", ""); status != 401 {
		t.Errorf("GET /admin/fleet/x without the token: status %d, want 401", status)
	}
}

// checkSelfContained fails if the page loads or links anything from
// elsewhere: every asset is inline and every fetch goes to its own origin.
func checkSelfContained(t *testing.T, page string) {
	t.Helper()
	if m := regexp.MustCompile(`(?i)(https?:)?//[a-z0-9.-]+\.[a-z]{2,}`).FindString(page); m != "" {
		t.Errorf("the page names an outside address: %q", m)
	}
	if m := regexp.MustCompile(`(?i)<(link|img|iframe|object|embed)\b|<script[^>]*\bsrc=|@import|url\(`).FindString(page); m != "" {
		t.Errorf("the page loads an external asset: %q", m)
	}
	for _, placeholder := range []string{"/*STYLE*/", "/*SCRIPT*/"} {
		if strings.Contains(page, placeholder) {
			t.Errorf("the page still holds the placeholder %s", placeholder)
		}
	}
	if !strings.Contains(page, `fetch(path, { headers: { Authorization: "Bearer "`) {
		t.Errorf("the page's fetches do not send the token as a bearer header")
	}
}

// checkCSP checks that the policy allows exactly the page's own inline
// script and style, by hash, and nothing from elsewhere.
func checkCSP(t *testing.T, csp, page string) {
	t.Helper()
	for _, want := range []string{"default-src 'none'", "connect-src 'self'", "frame-ancestors 'none'",
		"script-src " + cspHash(fleetJS), "style-src " + cspHash(fleetCSS)} {
		if !strings.Contains(csp, want) {
			t.Errorf("Content-Security-Policy %q lacks %q", csp, want)
		}
	}
	if strings.Contains(csp, "unsafe-inline") || strings.Contains(csp, "*") {
		t.Errorf("Content-Security-Policy %q is too wide", csp)
	}
	if !strings.Contains(page, "<script>"+fleetJS+"</script>") || !strings.Contains(page, "<style>"+fleetCSS+"</style>") {
		t.Errorf("the inline script or style differs from the hashed one")
	}
}
