package segment

import (
	"context"
	"errors"
	"testing"
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
	for _, g := range pending {
		if _, err := s.ResealContext(context.Background(), g.BaseOffset, nil); err != nil {
			t.Fatal(err)
		}
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
