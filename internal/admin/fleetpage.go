package admin

import (
	"crypto/sha256"
	_ "embed"
	"encoding/base64"
	"net/http"
	"strings"
)

// The fleet page: one self-contained HTML document (inline CSS and
// JavaScript, no external assets) that polls GET /admin/backends and
// GET /admin/decisions every second and shows them as two tables.
//
// The page itself holds no router state, so it is served without the
// admin token (when the API is enabled at all): a browser's navigation
// cannot carry a bearer token, and the alternatives are worse. A token in
// the query string ends up in access logs, browser history and Referer
// headers; HTTP Basic credentials are cached by the browser and sent with
// every request to the origin, which would let another site's form POST
// a drain. Instead the page asks for the token, keeps it in the tab's
// sessionStorage (gone when the tab closes) and sends it as
// Authorization: Bearer with each fetch, like any other client of the
// API. For links and scripts it also takes the token once from the URL
// fragment (/admin/fleet#token=...), which browsers never send to the
// server, and removes it from the address bar at once.
//
// The Content-Security-Policy allows only the page's own inline script
// and style (by hash) and connections to its own origin, so even a
// backend name crafted to look like markup cannot run code; the script
// also only ever sets textContent.

//go:embed fleetpage/fleet.html
var fleetHTML string

//go:embed fleetpage/fleet.css
var fleetCSS string

//go:embed fleetpage/fleet.js
var fleetJS string

// fleetPage is the assembled document and its CSP header, built once.
var fleetPage, fleetCSP = assembleFleetPage()

func assembleFleetPage() (page, csp string) {
	page = strings.Replace(fleetHTML, "/*STYLE*/", fleetCSS, 1)
	page = strings.Replace(page, "/*SCRIPT*/", fleetJS, 1)
	csp = "default-src 'none'; script-src " + cspHash(fleetJS) + "; style-src " + cspHash(fleetCSS) +
		"; connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
	return page, csp
}

func cspHash(s string) string {
	d := sha256.Sum256([]byte(s))
	return "'sha256-" + base64.StdEncoding.EncodeToString(d[:]) + "'"
}

// fleet serves the fleet page.
func (h *Handler) fleet(w http.ResponseWriter) {
	hd := w.Header()
	hd.Set("Content-Type", "text/html; charset=utf-8")
	hd.Set("Content-Security-Policy", fleetCSP)
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("Referrer-Policy", "no-referrer")
	hd.Set("Cache-Control", "no-store")
	_, _ = w.Write([]byte(fleetPage))
}
