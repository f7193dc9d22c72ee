package segment

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/geolog/geolog/batch"
)

// TestResealPendingRollStale: after a rotation ResealPending names every
// sealed segment (each starts under the old key) and never the active
// one; RollStale rolls an active segment that starts under the old key
// and then leaves the new active one alone; ResealContext with an ended
// context replaces nothing; once every pending segment is resealed, no
// unit is under the old key and the log reads back exactly, also after a
// reopen. A plain log (at-rest turned on later) is pending too.
func TestResealPendingRollStale(t *testing.T) {
	e := osEnv(t)
	cfg := smallConfig(t, e)
	cfg.Keyring = nil // also under GEOLOG_SEGMENT_ATREST=1
	s := mustOpen(t, cfg)
	var m model
	appendBatches(t, s, &m, 10, 0) // plain: written before at-rest was on
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	cfg.Keyring = newKeyring(13)
	s = mustOpen(t, cfg)
	appendBatches(t, s, &m, 30, 1000)
	old := cfg.Keyring.Active()
	if _, err := cfg.Keyring.Rotate(context.Background()); err != nil {
		t.Fatal(err)
	}
	sealed := s.Sealed()
	pending, err := s.ResealPending()
	if err != nil || len(sealed) < 2 || len(pending) != len(sealed) {
		t.Fatalf("pending %d of %d sealed segments, %v", len(pending), len(sealed), err)
	}
	if rolled, err := s.RollStale(); err != nil || !rolled {
		t.Fatalf("roll of an active segment under the old key: %v %v", rolled, err)
	}
	if rolled, err := s.RollStale(); err != nil || rolled {
		t.Fatalf("second roll: %v %v (the new active segment holds no record)", rolled, err)
	}
	appendBatches(t, s, &m, 3, 5000) // under the new key, in the new active segment
	if rolled, err := s.RollStale(); err != nil || rolled {
		t.Fatalf("roll of an active segment under the active key: %v %v", rolled, err)
	}
	pending, err = s.ResealPending()
	if err != nil || len(pending) != len(sealed)+1 {
		t.Fatalf("after the roll: %d pending, want %d: %v", len(pending), len(sealed)+1, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.ResealContext(ctx, pending[0].BaseOffset, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("reseal with an ended context: %v", err)
	}
	if again, _ := s.ResealPending(); len(again) != len(pending) {
		t.Fatalf("an abandoned reseal changed what is pending: %d, want %d", len(again), len(pending))
	}
	// Readers of the whole log run while the segments are replaced: none
	// may fail or see other frames (a reader of a replaced segment
	// finishes on its old file). A read may stop early at a segment that
	// was replaced under it (the store's viewAfter), so each reader goes
	// on from where the last read ended, as every reader of the log does.
	end := s.NextOffset()
	want, err := s.ReadFrames(0, 1<<30, end)
	if err != nil {
		t.Fatal(err)
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	var readErr atomic.Pointer[string]
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				got, err := readAllBytes(s, end)
				if err != nil || !bytes.Equal(got, want) {
					msg := fmt.Sprintf("%d bytes, %v", len(got), err)
					readErr.Store(&msg)
					return
				}
			}
		}()
	}
	for _, g := range pending {
		if _, err := s.ResealContext(context.Background(), g.BaseOffset, nil); err != nil {
			t.Fatal(err)
		}
	}
	stop.Store(true)
	wg.Wait()
	if p := readErr.Load(); p != nil {
		t.Fatalf("a read during the reseals: %s", *p)
	}
	if left, err := s.ResealPending(); err != nil || len(left) != 0 {
		t.Fatalf("pending after resealing: %v %v", left, err)
	}
	checkLog(t, s, &m)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	keys := unitKeys(t, cfg)
	if len(keys[old]) != 0 || len(keys[0]) != 0 || len(keys) != 1 {
		t.Fatalf("units by key after resealing: %v, want only the active key", keys)
	}
	s = mustOpen(t, cfg)
	defer s.Close()
	checkLog(t, s, &m)
}

// BenchmarkReseal re-encrypts one closed 8 MiB segment of 4 KiB frames
// after a rotation, unthrottled, on the real file system (fdatasync and
// rename included) and reports MB/s of segment re-encrypted:
// go test -run XXX -bench Reseal ./segment/
func BenchmarkReseal(b *testing.B) {
	e := osEnv(b)
	cfg := Config{Dir: e.dir, FS: e.fs, SegmentBytesMax: 8 << 20, Logger: testLogger(b), Keyring: newKeyring(17)}
	s := mustOpen(b, cfg)
	defer s.Close()
	value := make([]byte, 4000)
	for s.Size() < 8<<20 {
		f := batch.Encode(nil, batch.Header{BaseOffset: s.NextOffset(), Epoch: 1}, []batch.Record{{Value: value}})
		if err := s.Append(f); err != nil {
			b.Fatal(err)
		}
	}
	if err := s.SealBefore(s.NextOffset()); err != nil {
		b.Fatal(err)
	}
	seg := s.Sealed()[0]
	b.SetBytes(seg.Bytes)
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		if _, err := cfg.Keyring.Rotate(context.Background()); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		if _, err := s.ResealContext(context.Background(), seg.BaseOffset, nil); err != nil {
			b.Fatal(err)
		}
	}
}

// readAll reads the data frames of s below end, read after read, each from
// the NextOffset of the last frame the previous one returned.
func readAllBytes(s *Store, end uint64) ([]byte, error) {
	var out []byte
	for from := uint64(0); from < end; {
		b, err := s.ReadFrames(from, 1<<30, end)
		if err != nil {
			return out, err
		}
		if len(b) == 0 {
			return out, fmt.Errorf("no progress at offset %d", from)
		}
		out = append(out, b...)
		for len(b) > 0 {
			h, err := batch.DecodeHeader(b)
			if err != nil {
				return out, err
			}
			n, _ := batch.FrameSize(b)
			b, from = b[n:], h.NextOffset()
		}
	}
	return out, nil
}
