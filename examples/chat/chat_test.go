package main

import (
	"bytes"
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/geolog/geolog/regionsvc"
	"github.com/geolog/geolog/segment"
)

// startNode starts a geolog node in-process (a region of one) and
// returns its address.
func startNode(t *testing.T) string {
	t.Helper()
	n, err := regionsvc.New(regionsvc.Config{
		DataDir:    t.TempDir(),
		ListenAddr: "127.0.0.1:0",
		Fsync:      segment.FsyncNever,
		Logger:     hclog.New(&hclog.LoggerOptions{Name: "node", Level: hclog.Warn, Output: tWriter{t}}),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n.Addr()
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(string(bytes.TrimRight(p, "\n")))
	return len(p), nil
}

// chat runs the chat command against addr and returns its output; it
// fails the test on a non-zero exit.
func chat(t *testing.T, addr string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	if code := run(ctx, append([]string{"--addr", addr}, args...), &stdout, &stderr); code != 0 {
		t.Fatalf("chat %s: exit %d\n%s%s", strings.Join(args, " "), code, stdout.String(), stderr.String())
	}
	t.Logf("$ chat %s\n%s", strings.Join(args, " "), stdout.String())
	return stdout.String()
}

var (
	delivered = regexp.MustCompile(`(?m)^\[(\S+) (\d+)\] (\S+): (.*)$`)
	sentID    = regexp.MustCompile(`id=(\S+)`)
)

// texts lists "conv: text" of every message a sync printed, in order.
func texts(out string) []string {
	var got []string
	for _, m := range delivered.FindAllStringSubmatch(out, -1) {
		got = append(got, m[1]+": "+m[4])
	}
	return got
}

// TestChatOfflineDevice: alice's phone sends to three conversations (on
// two ranges, so two share one) while bob's phone is offline, and resends
// one message under its id as an application retry would; bob's sync
// after coming back delivers each message once, in order; after his ack,
// a resync shows nothing, and a resend of a message he acknowledged is not
// delivered again. Alice's phone, online, acks as it goes and sees only
// what is new each time.
func TestChatOfflineDevice(t *testing.T) {
	addr := startNode(t)
	chat(t, addr, "create", "--ranges", "2")
	convs := "room-1,room-2,room-3"
	first := chat(t, addr, "send", "--from", "alice-phone", "--conv", "room-1", "hello bob")
	id := sentID.FindStringSubmatch(first)[1]
	chat(t, addr, "send", "--from", "alice-phone", "--conv", "room-2", "lunch?")
	chat(t, addr, "send", "--from", "alice-phone", "--conv", "room-1", "--id", id, "hello bob") // app retry
	if got := texts(chat(t, addr, "sync", "--device", "alice-phone", "--conv", convs, "--ack")); len(got) != 2 {
		t.Fatalf("alice's first sync: %q, want her 2 messages once", got)
	}
	for i := range 3 {
		chat(t, addr, "send", "--from", "alice-phone", "--conv", "room-3", fmt.Sprintf("note %d", i))
	}
	chat(t, addr, "send", "--from", "carol-laptop", "--conv", "room-1", "hi all")

	// Bob comes back.
	out := chat(t, addr, "sync", "--device", "bob-phone", "--conv", convs)
	want := []string{"room-1: hello bob", "room-1: hi all", "room-2: lunch?", "room-3: note 0", "room-3: note 1", "room-3: note 2"}
	if got := texts(out); !slices.Equal(got, want) {
		t.Fatalf("bob's sync delivered %q, want %q", got, want)
	}
	if !strings.Contains(out, "dropped 1 resent") {
		t.Fatalf("the resent message was not reported as dropped:\n%s", out)
	}
	if got := texts(chat(t, addr, "sync", "--device", "bob-phone", "--conv", convs)); len(got) != len(want) {
		t.Fatalf("a sync without ack delivered %q, want the same %d again", got, len(want))
	}
	ackArgs := []string{"ack", "--device", "bob-phone"}
	for _, m := range regexp.MustCompile(`(?m)^(room-\d): \d+ new, next (\d+)$`).FindAllStringSubmatch(out, -1) {
		ackArgs = append(ackArgs, m[1]+"@"+m[2])
	}
	if len(ackArgs) != 6 {
		t.Fatalf("sync printed no next position per conversation:\n%s", out)
	}
	chat(t, addr, ackArgs...)
	if got := texts(chat(t, addr, "sync", "--device", "bob-phone", "--conv", convs)); len(got) != 0 {
		t.Fatalf("resync after ack delivered %q", got)
	}

	// Alice's app resends the first message again; both devices
	// acknowledged it, neither gets it.
	chat(t, addr, "send", "--from", "alice-phone", "--conv", "room-1", "--id", id, "hello bob")
	chat(t, addr, "send", "--from", "carol-laptop", "--conv", "room-2", "yes!")
	if got := texts(chat(t, addr, "sync", "--device", "bob-phone", "--conv", convs, "--ack")); !slices.Equal(got, []string{"room-2: yes!"}) {
		t.Fatalf("bob after the second resend: %q, want only the new message", got)
	}
	got := texts(chat(t, addr, "sync", "--device", "alice-phone", "--conv", convs, "--ack"))
	want = []string{"room-1: hi all", "room-2: yes!", "room-3: note 0", "room-3: note 1", "room-3: note 2"}
	if !slices.Equal(got, want) {
		t.Fatalf("alice's second sync: %q, want %q", got, want)
	}
	// Acknowledging below the receipt changes nothing.
	if out := chat(t, addr, "ack", "--device", "bob-phone", "room-1@1"); !strings.Contains(out, "already acked") {
		t.Fatalf("an ack below the receipt: %s", out)
	}
}

// TestChatBadInput: names the formats cannot carry and malformed command
// lines are refused before anything is written.
func TestChatBadInput(t *testing.T) {
	addr := startNode(t)
	chat(t, addr, "create", "--ranges", "2")
	ctx := context.Background()
	for _, args := range [][]string{
		{"send", "--from", "a/b", "--conv", "c", "x"},
		{"send", "--from", "a", "--conv", strings.Repeat("c", 65), "x"},
		{"send", "--from", "a", "--conv", "c", "--id", "x\ny", "x"},
		{"sync", "--device", "", "--conv", "c"},
		{"ack", "--device", "d", "c@zero"},
		{"nosuch"},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(ctx, append([]string{"--addr", addr}, args...), &stdout, &stderr); code == 0 {
			t.Errorf("chat %q succeeded: %s", args, stdout.String())
		}
	}
	if got := texts(chat(t, addr, "sync", "--device", "d", "--conv", "c")); len(got) != 0 {
		t.Fatalf("refused sends were written: %q", got)
	}
}

// TestSeenMetadata: the receipt's ids are kept newest first within the
// metadata bound, and any bytes decode without panic into bounded ids.
func TestSeenMetadata(t *testing.T) {
	var ids []string
	for range 100 {
		ids = append(ids, NewMessageID())
	}
	md := seenMetadata(ids)
	if len(md) > seenBytesMax {
		t.Fatalf("metadata of %d bytes", len(md))
	}
	back := seenOf(md)
	if len(back) == 0 || !slices.Equal(back, ids[len(ids)-len(back):]) {
		t.Fatalf("decoded %d ids, not the newest ones", len(back))
	}
	for _, bad := range []string{"", "\n\n", strings.Repeat("x", 2000), "a\n" + strings.Repeat("y", 65) + "\nb"} {
		for _, id := range seenOf([]byte(bad)) {
			if id == "" || len(id) > idBytesMax {
				t.Fatalf("seenOf(%q) gave id %q", bad, id)
			}
		}
	}
}
