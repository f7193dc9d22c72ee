package homing

import (
	"errors"
	"testing"
)

// TestDeleteHomes: on both stores, deleting a stream's homes removes its
// records and history and no other stream's, bumps the homes version of
// the regions it was homed in (so that their nodes drop the homes at
// their next heartbeat), and lets a new stream of the name start at
// epoch 1.
func TestDeleteHomes(t *testing.T) {
	sql, _ := newSQLStore(t)
	for name, s := range map[string]Store{"mem": NewMemStore(), "sql": sql} {
		t.Run(name, func(t *testing.T) {
			ctx := ctxT(t)
			specs := []HomeSpec{
				{Key: RangeKey{Stream: "a", Range: 0}, Region: "us"},
				{Key: RangeKey{Stream: "a", Range: 1}, Region: "eu"},
				{Key: RangeKey{Stream: "b", Range: 0}, Region: "us"},
			}
			if _, err := s.CreateHomes(ctx, specs); err != nil {
				t.Fatal(err)
			}
			_, usBefore, err := s.RegionHomes(ctx, "us")
			if err != nil {
				t.Fatal(err)
			}
			if err := s.DeleteHomes(ctx, "a"); err != nil {
				t.Fatal(err)
			}
			homes, err := s.Homes(ctx, []RangeKey{specs[0].Key, specs[1].Key, specs[2].Key})
			if err != nil {
				t.Fatal(err)
			}
			if homes[0].Epoch != 0 || homes[1].Epoch != 0 || homes[2].Epoch != 1 {
				t.Fatalf("after deleting a: %+v", homes)
			}
			if hist, err := s.History(ctx, specs[0].Key); err != nil || len(hist) != 0 {
				t.Fatalf("history of a/0: %+v, %v", hist, err)
			}
			us, usAfter, err := s.RegionHomes(ctx, "us")
			if err != nil || usAfter <= usBefore || len(us) != 1 || us[0].Key.Stream != "b" {
				t.Fatalf("us homes %+v at version %d (was %d), %v", us, usAfter, usBefore, err)
			}
			if err := s.DeleteHomes(ctx, "a"); err != nil {
				t.Fatalf("deleting nothing: %v", err)
			}
			if err := s.DeleteHomes(ctx, ""); !errors.Is(err, ErrInvalidArgument) {
				t.Fatalf("an empty stream name: %v", err)
			}
			again, err := s.CreateHomes(ctx, []HomeSpec{{Key: specs[0].Key, Region: "ap"}})
			if err != nil || again[0].Region != "ap" || again[0].Epoch != 1 {
				t.Fatalf("a new stream a: %+v, %v", again, err)
			}
		})
	}
}
