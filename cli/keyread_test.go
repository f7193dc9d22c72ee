package cli_test

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/geolog/geolog/cli"
	"github.com/geolog/geolog/keyspace"
)

func TestConsumeByKey(t *testing.T)     { testConsumeByKey(t, startFake(t).Addr()) }
func TestNodeConsumeByKey(t *testing.T) { testConsumeByKey(t, startNode(t)) }

// testConsumeByKey: consume --key prints one key's records, in its range
// (derived from the key, or checked against --range), --key ” the
// keyless records of every range, and --follow follows the key.
func testConsumeByKey(t *testing.T, addr string) {
	mustRun(t, addr, "", "streams", "create", "chat", "--ranges", "3")
	var in strings.Builder
	for i := range 40 {
		key := fmt.Sprintf("room-%d", i%4)
		if i%8 == 7 {
			key = "" // keyless: the producer picks a range
		}
		fmt.Fprintf(&in, "%s\tmsg %d\n", key, i)
	}
	mustRun(t, addr, in.String(), "produce", "chat", "--tab")

	values := func(recs []consumed) string {
		var vs []string
		for _, r := range recs {
			vs = append(vs, r.value)
		}
		return strings.Join(vs, ",")
	}
	recs := parseConsumed(t, mustRun(t, addr, "", "consume", "chat", "--key", "room-2"))
	if got := values(recs); got != "msg 2,msg 6,msg 10,msg 14,msg 18,msg 22,msg 26,msg 30,msg 34,msg 38" {
		t.Fatalf("consume --key room-2: %s", got)
	}
	r2 := keyspace.RangeForKey([]byte("room-2"), 3)
	for _, r := range recs {
		if r.rng != r2 || r.key != "room-2" {
			t.Fatalf("consume --key room-2 printed %+v", r)
		}
	}
	recs = parseConsumed(t, mustRun(t, addr, "", "consume", "chat", "--key", "room-2", "--range", strconv.Itoa(int(r2)), "--from-offset", strconv.Itoa(int(recs[2].offset))))
	if got := values(recs); got != "msg 10,msg 14,msg 18,msg 22,msg 26,msg 30,msg 34,msg 38" {
		t.Fatalf("consume --key room-2 --from-offset: %s", got)
	}
	recs = parseConsumed(t, mustRun(t, addr, "", "consume", "chat", "--key", ""))
	if got := values(recs); len(recs) != 5 || !strings.Contains(got, "msg 7") || !strings.Contains(got, "msg 39") {
		t.Fatalf("consume --key '': %s", got)
	}
	_, errOut, code := run(t, testCtx(t), "", "--addr", addr, "consume", "chat", "--key", "room-2", "--range", strconv.Itoa(int(r2+1)%3))
	if code != 2 || !strings.Contains(errOut, fmt.Sprintf("is in range %d", r2)) {
		t.Fatalf("consume --key in another range: exit %d, %q", code, errOut)
	}

	// --follow: what is there and what comes, of that key only.
	ctx, cancel := context.WithTimeout(testCtx(t), 30*time.Second)
	defer cancel()
	var out syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- cli.Run(ctx, []string{"--addr", addr, "consume", "chat", "--key", "room-1", "--follow", "--max", "12"},
			strings.NewReader(""), &out, io.Discard)
	}()
	// It follows from offset 0: whenever it subscribes, it sees these.
	mustRun(t, addr, "room-0\tlate 0\nroom-1\tlate 1\nroom-1\tlate 2\n", "produce", "chat", "--tab")
	if code := <-done; code != 0 {
		t.Fatalf("consume --key --follow: exit %d", code)
	}
	want := "msg 1,msg 5,msg 9,msg 13,msg 17,msg 21,msg 25,msg 29,msg 33,msg 37,late 1,late 2"
	if got := values(parseConsumed(t, out.String())); got != want {
		t.Fatalf("consume --key room-1 --follow: %s", got)
	}
}
