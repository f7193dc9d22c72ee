package replicator

import "testing"

func TestResumeAt(t *testing.T) {
	u := func(v uint64) *uint64 { return &v }
	// The source's log: epoch 3 up to 40, epoch 5 from 40 on.
	search := func(after, end uint64) uint64 {
		if after < 5 {
			return min(40, end)
		}
		return end
	}
	cases := []struct {
		name      string
		applied   uint64
		logEpoch  *uint64
		homeEpoch uint64
		from      uint64
		resend    bool
	}{
		{"mirror did not say its log epoch", 100, nil, 5, 100, false},
		{"mirror's log in the home's epoch", 100, u(5), 5, 100, false},
		{"mirror's log in a later epoch", 100, u(6), 5, 100, false},
		{"empty mirror", 0, u(3), 5, 0, false},
		{"older epoch: resend from the change", 100, u(3), 5, 40, true},
		{"older epoch, change past the applied end: resend from the end", 30, u(3), 5, 30, true},
		{"older epoch 0 said explicitly", 100, u(0), 5, 40, true},
	}
	for _, c := range cases {
		from, resend := ResumeAt(c.applied, c.logEpoch, c.homeEpoch, search)
		if from != c.from || resend != c.resend {
			t.Errorf("%s: ResumeAt = (%d, %v), want (%d, %v)", c.name, from, resend, c.from, c.resend)
		}
	}
	// A search that overshoots the applied end is held to it.
	if from, resend := ResumeAt(10, u(1), 2, func(uint64, uint64) uint64 { return 99 }); from != 10 || !resend {
		t.Errorf("overshooting search: ResumeAt = (%d, %v), want (10, true)", from, resend)
	}
}
