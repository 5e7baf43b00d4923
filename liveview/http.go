package liveview

import (
	"crypto/subtle"
	"embed"
	"encoding/json"
	"errors"
	"io/fs"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"
)

//go:embed page
var pageFiles embed.FS

// page is the embedded page's folder.
var page = func() fs.FS {
	sub, err := fs.Sub(pageFiles, "page")
	if err != nil {
		panic(err)
	}
	return sub
}()

// pingEvery is how often a stream that carries nothing else says it is
// alive: a page tells a stream that died from one that is quiet, and a
// connection that takes nothing is found within WriteTimeout.
const pingEvery = 15 * time.Second

// Headers on every answer. The page loads its script and style from
// here only and runs no inline script; nothing is cached, nothing is
// sniffed, no referrer leaves, no other site frames it.
var securityHeaders = map[string]string{
	"Cache-Control":           "no-store",
	"X-Content-Type-Options":  "nosniff",
	"Referrer-Policy":         "no-referrer",
	"X-Frame-Options":         "DENY",
	"Content-Security-Policy": "default-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'; object-src 'none'",
}

// Handler serves the page (without the token) and the data endpoints
// (with it), to requests whose Host is loopback unless AllowRemote.
func (v *View) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /{$}", file("index.html", "text/html; charset=utf-8"))
	mux.Handle("GET /app.js", file("app.js", "text/javascript; charset=utf-8"))
	mux.Handle("GET /style.css", file("style.css", "text/css; charset=utf-8"))
	mux.Handle("GET /api/snapshot", v.authorized(http.HandlerFunc(v.serveSnapshot)))
	mux.Handle("GET /api/events", v.authorized(http.HandlerFunc(v.serveEvents)))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for k, val := range securityHeaders {
			w.Header().Set(k, val)
		}
		if !v.cfg.AllowRemote && !LoopbackHost(r.Host) {
			problem(w, http.StatusForbidden, "the live view answers only requests to a loopback address or localhost (Host: "+r.Host+"); serve --allow-remote lifts this")
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// LoopbackHost reports whether a Host header names a loopback address
// or localhost, with or without a port.
func LoopbackHost(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Zone() == "" && ip.Unmap().IsLoopback()
}

// file serves one embedded file.
func file(name, contentType string) http.Handler {
	body, err := fs.ReadFile(page, name)
	if err != nil {
		panic(err)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", contentType)
		w.Write(body)
	})
}

// authorized passes requests that carry the token as a bearer token.
func (v *View) authorized(next http.Handler) http.Handler {
	want := []byte(v.cfg.Token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		scheme, token, _ := strings.Cut(r.Header.Get("Authorization"), " ")
		if !strings.EqualFold(scheme, "Bearer") || subtle.ConstantTimeCompare([]byte(strings.TrimSpace(token)), want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="a2a-bus live view"`)
			problem(w, http.StatusUnauthorized, "a missing or wrong token: open the address serve logged, which carries it after #token=, or take uiToken from the connection file")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// problem answers an error as {"error": message}.
func problem(w http.ResponseWriter, code int, message string) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(map[string]string{"error": message})
}

func (v *View) serveSnapshot(w http.ResponseWriter, r *http.Request) {
	body, err := v.snapshot(r.Context())
	switch {
	case errors.Is(err, ErrClosed):
		problem(w, http.StatusServiceUnavailable, "the live view is shutting down")
		return
	case err != nil:
		if r.Context().Err() == nil {
			v.log.Warn("live view: reading the broker failed", "error", err)
		}
		problem(w, http.StatusBadGateway, "the broker did not answer: "+err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Write(body)
}

// serveEvents follows the timeline: a reset line, then entry, changed and
// ping lines, until the page goes, the view closes, or the page falls
// behind (cut: it reconnects and starts again from a reset).
func (v *View) serveEvents(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodHead {
		w.Header().Set("Content-Type", "application/x-ndjson; charset=utf-8")
		return // no stream, no viewer
	}
	rc := http.NewResponseController(w)
	// A cut makes a write under way fail at once. It comes from the view
	// while this handler runs: the viewer leaves before it returns.
	vw, reset, err := v.join(func() { rc.SetWriteDeadline(time.Now()) })
	switch {
	case errors.Is(err, errFull):
		w.Header().Set("Retry-After", "5")
		problem(w, http.StatusServiceUnavailable, "too many pages follow the live view; close one")
		return
	case errors.Is(err, ErrClosed):
		problem(w, http.StatusServiceUnavailable, "the live view is shutting down")
		return
	case err != nil:
		v.log.Warn("live view: following the broker failed", "error", err)
		problem(w, http.StatusBadGateway, "the broker did not answer: "+err.Error())
		return
	}
	defer v.leave(vw)
	defer func() {
		select {
		case <-vw.cut:
			// The connection of a page cut closes: the end of the
			// response, which the deadline fails, is not written, and the
			// page reconnects. (A write since the cut may have moved
			// the deadline on.)
			rc.SetWriteDeadline(time.Now())
		default:
		}
	}()
	w.Header().Set("Content-Type", "application/x-ndjson; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	write := func(line []byte) bool {
		rc.SetWriteDeadline(time.Now().Add(v.cfg.WriteTimeout))
		select {
		case <-vw.cut: // after the deadline is set: a cut's deadline stays
			return false
		default:
		}
		if _, err := w.Write(line); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	if !write(reset) {
		return
	}
	ping := time.NewTicker(pingEvery)
	defer ping.Stop()
	for {
		var line []byte
		select {
		case line = <-vw.lines:
		case <-vw.hint:
			line = changedLine
		case <-ping.C:
			line = pingLine
		case <-vw.cut:
			return
		case <-r.Context().Done():
			return
		case <-v.ctx.Done():
			return
		}
		if !write(line) {
			return
		}
	}
}
