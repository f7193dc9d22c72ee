package regionsvc

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/geolog/geolog/atrest"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

// unitKeys counts the units of every segment log file under dir by data
// key (0: plain frames). A unit cut short at a file's end (an append in
// flight) ends that file's count.
func unitKeys(t *testing.T, dir string) map[atrest.KeyID]int {
	t.Helper()
	out := map[atrest.KeyID]int{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if os.IsNotExist(err) {
				return nil // renamed or deleted while walking
			}
			return err
		}
		if d.IsDir() || !strings.HasSuffix(p, ".log") || strings.HasPrefix(d.Name(), "_") {
			return nil
		}
		b, err := os.ReadFile(p)
		if os.IsNotExist(err) {
			return nil
		}
		if err != nil {
			return err
		}
		for pos := 0; pos+4 <= len(b); {
			n, err := atrest.UnitSize(b[pos:])
			if err != nil || pos+n > len(b) {
				break
			}
			out[atrest.UnitKey(b[pos:])]++
			pos += n
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestResealAfterRotation: a node's data key is rotated offline (as
// geolog keys rotate does); started again, the node re-encrypts every
// segment sealed under the old key in the background, rate-limited, the
// idle ranges' active segments included, while producers append, until no
// unit under the old key is left on disk (the gauge of pending segments
// reaches 0). Every record reads back identical, and with the old key
// retired from the keyring the node still starts and reads them all.
func TestResealAfterRotation(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	_, kek := newKEKFile(t)
	withKEK := func(reseal bool) func(*Config) {
		return func(cfg *Config) {
			cfg.SegmentBytesMax = 4 << 10
			cfg.KEK = kek
			cfg.ResealBytesPerSecond = -1
			if reseal {
				cfg.ResealBytesPerSecond = 256 << 10
				cfg.ResealInterval = 100 * time.Millisecond
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	n, c := testNode(t, dir, withKEK(false))
	createStream(t, c, "s", 1)
	appendMarked := func(c geologv1.LogClient, from, count int) {
		for i := from; i < from+count; i++ {
			var rs []*geologv1.Record
			for j := range 5 {
				rs = append(rs, &geologv1.Record{Key: fmt.Appendf(nil, "k%d", j),
					Value: fmt.Appendf(nil, "%s-%d-%d-%s", atRestMarker, i, j, bytes.Repeat([]byte("x"), 100))})
			}
			if _, err := c.Append(ctx, &geologv1.AppendRequest{Stream: "s", Range: 0, Records: rs}); err != nil {
				t.Fatal(err)
			}
		}
	}
	appendMarked(c, 0, 60)
	want := readRange(t, ctx, c, "s", 0, geologv1.Consistency_CONSISTENCY_LOCAL, 0)
	if len(want) != 300 {
		t.Fatalf("%d records in s", len(want))
	}
	n.Close()

	k, err := atrest.Open(ctx, atrest.Config{Dir: KeysDir(dir), KEK: kek})
	if err != nil {
		t.Fatal(err)
	}
	old := k.Active()
	if _, err := k.Rotate(ctx); err != nil {
		t.Fatal(err)
	}
	k.Close()
	before := unitKeys(t, dir)
	if before[old] == 0 {
		t.Fatalf("no unit under the old key %v before the restart: %v", old, before)
	}

	n, c = testNode(t, dir, withKEK(true))
	rs := n.resealer.Load()
	if rs == nil {
		t.Fatal("a node with a keyring runs no resealer")
	}
	appendMarked(c, 60, 20) // appends under the new key while resealing
	deadline := time.Now().Add(2 * time.Minute)
	for {
		keys := unitKeys(t, dir)
		if keys[old] == 0 && rs.pending.Load() == 0 {
			t.Logf("units by key before %v, after %v; %d segments re-encrypted", before, keys, rs.resealed.Load())
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("units under the old key %v after 2 minutes: %v (%d segments pending)", old, keys, rs.pending.Load())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if rs.resealed.Load() == 0 {
		t.Fatal("no segment was re-encrypted")
	}
	got := readRange(t, ctx, c, "s", 0, geologv1.Consistency_CONSISTENCY_LOCAL, 0)
	if len(got) != 400 || !slices.Equal(got[:300], want) {
		t.Fatalf("after re-encryption: %d records, the first 300 identical: %v", len(got), len(got) >= 300 && slices.Equal(got[:300], want))
	}
	n.Close()
	grepTree(t, dir, []byte(atRestMarker))

	// Retire the old key: the node starts without it and reads everything.
	k, err = atrest.Open(ctx, atrest.Config{Dir: KeysDir(dir), KEK: kek})
	if err != nil {
		t.Fatal(err)
	}
	if err := k.Retire(k.Active()); err == nil {
		t.Fatal("the active key was retired")
	}
	if err := k.Retire(old); err != nil {
		t.Fatal(err)
	}
	k.Close()
	_, c = testNode(t, dir, withKEK(false))
	if again := readRange(t, ctx, c, "s", 0, geologv1.Consistency_CONSISTENCY_LOCAL, 0); !slices.Equal(again, got) {
		t.Fatalf("with the old key retired: %d records, want the %d read before", len(again), len(got))
	}
}

// TestRotationWhileRunning: a node that runs for longer than its data key
// rotation period starts new data keys without a restart, and every record
// written under the older ones still reads back identical.
func TestRotationWhileRunning(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	_, kek := newKEKFile(t)
	n, c := testNode(t, dir, func(cfg *Config) {
		cfg.SegmentBytesMax = 4 << 10
		cfg.KEK = kek
		cfg.DataKeyRotationPeriod = 300 * time.Millisecond
		cfg.ResealInterval = 100 * time.Millisecond
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	createStream(t, c, "s", 1)
	first := n.keyring.Active()
	deadline := time.Now().Add(time.Minute)
	for i := 0; len(n.keyring.Keys()) < 3; i++ {
		if time.Now().After(deadline) {
			t.Fatalf("%d data keys after a minute with a rotation period of 300 ms", len(n.keyring.Keys()))
		}
		if _, err := c.Append(ctx, &geologv1.AppendRequest{Stream: "s", Range: 0,
			Records: []*geologv1.Record{{Value: fmt.Appendf(nil, "%s-%d", atRestMarker, i)}}}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n.keyring.Active() == first {
		t.Fatal("the active key did not change")
	}
	got := readRange(t, ctx, c, "s", 0, geologv1.Consistency_CONSISTENCY_LOCAL, 0)
	for i, r := range got {
		if !strings.HasSuffix(r, fmt.Sprintf("%s-%d", atRestMarker, i)) {
			t.Fatalf("record %d reads %q", i, r)
		}
	}
	t.Logf("%d data keys, %d records", len(n.keyring.Keys()), len(got))
}
