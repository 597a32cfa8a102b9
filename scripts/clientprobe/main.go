// Command clientprobe plays the hostile clients of docs/reliability.md
// (issue 28, findings 4 and 9) against a running `kvroute serve` on
// loopback and reports what they cost it:
//
//	clientprobe headers --target ADDR --pid PID [--conns 1000] [--bytes 65536]
//	    open --conns connections that each send a request line and about
//	    --bytes of headers, never the blank line that ends them, and hold
//	    them; print the router's resident memory (VmRSS of --pid) before
//	    and while they are held, and how many the router closed.
//	clientprobe bodies --target ADDR [--attackers 8] [--length 33554432] [--sent 1] [--requests 20] [--wait 0s] [--from IP]
//	    open --attackers connections that each declare a body of --length
//	    bytes, send --sent bytes of it and wait; then send --requests
//	    ordinary completions one after the other (from --from, another
//	    client's address, when set) and print their statuses
//	    and the router's kvroute_buffered_body_bytes; after --wait, print
//	    the statuses the attackers got.
//	clientprobe idle --target ADDR [--conns 15000]
//	    open --conns keep-alive connections that each make one request and
//	    stay idle; then one more client's request: its status, and the
//	    router's kvroute_client_limit_hits_total.
//
// It is a measurement fixture, not part of the router. It only ever
// connects to the address it is given.
package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: clientprobe headers|bodies|idle [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "headers":
		err = headers(os.Args[2:])
	case "bodies":
		err = bodies(os.Args[2:])
	case "idle":
		err = idle(os.Args[2:])
	default:
		err = fmt.Errorf("unknown probe %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "clientprobe:", err)
		os.Exit(1)
	}
}

// rss is the resident memory of pid in bytes, from /proc.
func rss(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no VmRSS for pid %d", pid)
}

func headers(args []string) error {
	fs := flag.NewFlagSet("headers", flag.ExitOnError)
	target := fs.String("target", "127.0.0.1:8080", "router address")
	pid := fs.Int("pid", 0, "router process id")
	conns := fs.Int("conns", 1000, "connections")
	size := fs.Int("bytes", 64<<10, "bytes of headers a connection sends")
	hold := fs.Duration("hold", 3*time.Second, "time to hold them before measuring")
	_ = fs.Parse(args)
	before, err := rss(*pid)
	if err != nil {
		return err
	}
	var open []net.Conn
	defer func() {
		for _, c := range open {
			_ = c.Close()
		}
	}()
	line := "X-Filler: " + strings.Repeat("a", 1000) + "\r\n"
	var hdr bytes.Buffer
	hdr.WriteString("POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
	for hdr.Len()+len(line) <= *size {
		hdr.WriteString(line)
	}
	refused := 0
	for range *conns {
		c, err := net.DialTimeout("tcp", *target, 5*time.Second)
		if err != nil {
			return fmt.Errorf("after %d connections: %w", len(open), err)
		}
		open = append(open, c)
		_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write(hdr.Bytes()); err != nil {
			refused++ // the router answered 431 and closed while we wrote
		}
	}
	time.Sleep(*hold)
	during, err := rss(*pid)
	if err != nil {
		return err
	}
	closed := 0
	for _, c := range open {
		_ = c.SetReadDeadline(time.Now().Add(time.Millisecond))
		var b [1]byte
		if _, err := c.Read(b[:]); err == nil || !isTimeout(err) {
			closed++ // answered (431) or closed
		}
	}
	fmt.Printf("connections %d, headers %d bytes each: rss before %.1f MB, held %.1f MB (+%.1f MB, %.1f KB a connection); answered or closed by the router: %d (write refused %d)\n",
		*conns, hdr.Len(), mb(before), mb(during), mb(during-before), float64(during-before)/1024/float64(*conns), closed, refused)
	return nil
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

func mb(n int64) float64 { return float64(n) / 1e6 }

func bodies(args []string) error {
	fs := flag.NewFlagSet("bodies", flag.ExitOnError)
	target := fs.String("target", "127.0.0.1:8080", "router address")
	attackers := fs.Int("attackers", 8, "connections that stall their bodies")
	length := fs.Int("length", 32<<20, "declared Content-Length")
	requests := fs.Int("requests", 20, "ordinary requests sent while they stall")
	sent := fs.Int("sent", 1, "bytes of its body each attacker sends")
	wait := fs.Duration("wait", 0, "time to wait before reading the attackers' answers")
	from := fs.String("from", "", "local address of the ordinary requests (e.g. 127.0.0.2: another client than the attackers)")
	model := fs.String("model", "", "model of the ordinary requests (default: the first the router lists)")
	_ = fs.Parse(args)
	base := "http://" + *target
	if *model == "" {
		m, err := firstModel(base)
		if err != nil {
			return err
		}
		*model = m
	}
	var open []net.Conn
	defer func() {
		for _, c := range open {
			_ = c.Close()
		}
	}()
	for range *attackers {
		c, err := net.DialTimeout("tcp", *target, 5*time.Second)
		if err != nil {
			return err
		}
		open = append(open, c)
		fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", *length)
		go func() { _, _ = c.Write(bytes.Repeat([]byte(" "), *sent)) }()
	}
	time.Sleep(time.Second)
	held := gauge(base, "kvroute_buffered_body_bytes")
	statuses := map[int]int{}
	client := &http.Client{Timeout: 30 * time.Second}
	if *from != "" {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(*from)}}
		client.Transport = &http.Transport{DialContext: d.DialContext}
	}
	body := `{"model":"` + *model + `","prompt":"hello","max_tokens":4}`
	for range *requests {
		resp, err := client.Post(base+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			statuses[0]++
			continue
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		statuses[resp.StatusCode]++
	}
	// What the attackers got, if anything yet.
	time.Sleep(*wait)
	answered := map[int]int{}
	for _, c := range open {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
		if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err == nil {
			answered[resp.StatusCode]++
			resp.Body.Close()
		}
	}
	fmt.Printf("%d connections declaring %d bytes and sending %d: buffered_body_bytes %s; %d ordinary requests: statuses %v; attackers answered after %v more: %v\n",
		*attackers, *length, *sent, held, *requests, statuses, *wait, answered)
	return nil
}

// gauge reads one unlabelled metric off the router's /metrics.
func gauge(base, name string) string {
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		return "?"
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			return v
		}
	}
	return "?"
}

// firstModel is the first model the router's /v1/models lists.
func firstModel(base string) (string, error) {
	resp, err := http.Get(base + "/v1/models")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	_, rest, ok := strings.Cut(string(b), `"id":"`)
	if !ok {
		return "", fmt.Errorf("no model in %s", b)
	}
	id, _, _ := strings.Cut(rest, `"`)
	return id, nil
}

func idle(args []string) error {
	fs := flag.NewFlagSet("idle", flag.ExitOnError)
	target := fs.String("target", "127.0.0.1:8080", "router address")
	conns := fs.Int("conns", 15000, "idle keep-alive connections")
	_ = fs.Parse(args)
	var open []net.Conn
	defer func() {
		for _, c := range open {
			_ = c.Close()
		}
	}()
	failed := 0
	for range *conns {
		c, err := net.DialTimeout("tcp", *target, 2*time.Second)
		if err != nil {
			failed++
			continue
		}
		open = append(open, c)
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			failed++
			continue
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			failed++ // waiting for a place: the router was full of busy connections
			continue
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	client := &http.Client{Timeout: 10 * time.Second}
	status := "no answer"
	if resp, err := client.Get("http://" + *target + "/healthz"); err == nil {
		status = resp.Status
		resp.Body.Close()
	} else {
		status += ": " + err.Error()
	}
	hits := []string{}
	if resp, err := client.Get("http://" + *target + "/metrics"); err == nil {
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if l := sc.Text(); strings.HasPrefix(l, "kvroute_client_limit_hits_total{limit=\"max_connections\"}") || strings.HasPrefix(l, "kvroute_client_limit_hits_total{limit=\"idle_closed\"}") {
				hits = append(hits, l)
			}
		}
		resp.Body.Close()
	}
	fmt.Printf("%d idle keep-alive connections (%d failed); one more client: %s; %v\n", *conns, failed, status, hits)
	return nil
}
