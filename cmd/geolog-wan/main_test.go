package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/geolog/geolog/wan"
)

// TestMain lets the tests run this binary's main in a child process.
func TestMain(m *testing.M) {
	if os.Getenv("GEOLOG_WAN_RUN_MAIN") == "1" {
		os.Args = append([]string{"geolog-wan"}, strings.Fields(os.Getenv("GEOLOG_WAN_ARGS"))...)
		main()
		return
	}
	os.Exit(m.Run())
}

// echoServer echoes every connection until the test ends.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() { defer wg.Done(); defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	return ln.Addr().String()
}

// syncBuffer is a bytes.Buffer safe for a writer and a reader goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// waitLine polls out for a line starting with prefix and returns the rest.
func waitLine(t *testing.T, out interface{ String() string }, prefix string) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		for _, line := range strings.Split(out.String(), "\n") {
			if rest, ok := strings.CutPrefix(line, prefix); ok {
				return rest
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("no line %q in output %q", prefix, out.String())
	return ""
}

func post(t *testing.T, url string) wan.LinksResponse {
	t.Helper()
	resp, err := http.Post(url, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var lr wan.LinksResponse
	if resp.StatusCode != 200 {
		body, _ := io.ReadAll(resp.Body)
		t.Fatalf("POST %s: %d %s", url, resp.StatusCode, body)
	}
	if err := json.NewDecoder(resp.Body).Decode(&lr); err != nil {
		t.Fatal(err)
	}
	return lr
}

func TestRunBadInput(t *testing.T) {
	dir := t.TempDir()
	badFile := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(badFile, []byte(`{"links": [{"name": "a", "upstream": "h:1", "bogus": 1}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{},                                  // no links
		{"--nope"},                          // unknown flag
		{"extra-arg", "--link", "a,:0,h:1"}, // stray argument
		{"--link", "a,:0"},                  // too few fields
		{"--link", "a,:0,h:1,forty"},        // bad latency
		{"--link", "a,:0,h:1,-5ms"},         // negative latency
		{"--link", "a b,:0,h:1"},            // bad name
		{"--link", "a,:0,h:1", "--link", "a,:0,h:2"}, // duplicate name
		{"--link", "a,:0,h:1", "--latency", "soon"},
		{"--link", "a,:0,h:1", "--control", "nowhere"},
		{"--config", filepath.Join(dir, "missing.json")},
		{"--config", badFile},
	} {
		var stderr bytes.Buffer
		if code := run(context.Background(), args, io.Discard, &stderr); code != 2 {
			t.Errorf("run(%q) = %d, want 2 (stderr %q)", args, code, stderr.String())
		}
		if stderr.Len() == 0 {
			t.Errorf("run(%q): nothing on stderr", args)
		}
	}
}

func TestRunInProcess(t *testing.T) {
	up := echoServer(t)
	dir := t.TempDir()
	cfgFile := filepath.Join(dir, "wan.json")
	cfg := fmt.Sprintf(`{"seed": 2, "links": [{"name": "us->eu.n1", "upstream": %q, "latency": "30ms"}]}`, up)
	if err := os.WriteFile(cfgFile, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr syncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"--config", cfgFile, "--link", "eu->us," + "127.0.0.1:0," + up + ",5ms", "--jitter", "1ms", "--log-level", "warn"}, &stdout, &stderr)
	}()
	control := "http://" + waitLine(t, &stdout, "control http://")
	fields := strings.Fields(waitLine(t, &stdout, "link us->eu.n1 "))
	listen := fields[0]
	if got := waitLine(t, &stdout, "link eu->us "); !strings.Contains(got, "latency 5ms jitter 1ms") {
		t.Fatalf("flag link: %q", got)
	}

	c, err := net.Dial("tcp", listen)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ping := func() (time.Duration, error) {
		start := time.Now()
		if _, err := c.Write([]byte("p")); err != nil {
			return 0, err
		}
		_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		var b [1]byte
		_, err := io.ReadFull(c, b[:])
		return time.Since(start), err
	}
	if rtt, err := ping(); err != nil || rtt < 60*time.Millisecond {
		t.Fatalf("ping through a 30ms link: %s, %v", rtt, err)
	}
	if lr := post(t, control+"/regions/eu/cut"); len(lr.Links) != 2 || lr.Links[0].State != "blackhole" {
		t.Fatalf("cut: %+v", lr)
	}
	var ne net.Error
	if _, err := ping(); !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("ping during a cut: %v, want a timeout", err)
	}
	post(t, control+"/heal")
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	var held [1]byte
	if _, err := io.ReadFull(c, held[:]); err != nil {
		t.Fatalf("held ping after heal: %v", err)
	}
	if rtt, err := ping(); err != nil || rtt < 60*time.Millisecond {
		t.Fatalf("ping after heal: %s, %v", rtt, err)
	}

	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("exit code %d, stderr %s", code, stderr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("run did not return after cancel")
	}
}

// TestProcessSIGTERM runs geolog-wan as a real process and stops it with
// SIGTERM: it must exit 0 and stop serving.
func TestProcessSIGTERM(t *testing.T) {
	up := echoServer(t)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "GEOLOG_WAN_RUN_MAIN=1",
		"GEOLOG_WAN_ARGS=--link a->b,127.0.0.1:0,"+up+",1ms --control 127.0.0.1:0")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		exited <- cmd.Wait()
	}()
	var control string
	select {
	case line := <-lines:
		control = strings.TrimPrefix(line, "control ")
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatalf("no control line; stderr %s", stderr.String())
	}
	resp, err := http.Get(control + "/links")
	if err != nil {
		t.Fatal(err)
	}
	var lr wan.LinksResponse
	_ = json.NewDecoder(resp.Body).Decode(&lr)
	resp.Body.Close()
	if len(lr.Links) != 1 || lr.Links[0].Name != "a->b" || lr.Links[0].From != "a" {
		t.Fatalf("links %+v", lr)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for range lines {
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v; stderr %s", err, stderr.String())
		}
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatal("no exit after SIGTERM")
	}
	if !strings.Contains(stderr.String(), "wan stopping") {
		t.Errorf("stderr lacks the shutdown log: %s", stderr.String())
	}
	if _, err := http.Get(control + "/healthz"); err == nil {
		t.Fatal("control API still up after exit")
	}
}
