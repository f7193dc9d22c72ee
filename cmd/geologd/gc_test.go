package main

import "testing"

// TestGCPercentDefault: geologd collects at GOGC=400 unless told otherwise
// (the runtime's 100 took 10-13% of the nodes' CPU at half rate), GOGC in
// the environment is kept, and --gc-percent wins over both.
func TestGCPercentDefault(t *testing.T) {
	for _, c := range []struct {
		env  string
		flag int
		want int
	}{
		{"", 0, 400},
		{"100", 0, 0},
		{"off", 0, 0},
		{"", 150, 150},
		{"100", 200, 200},
		{"", -1, -1},
	} {
		if got := gcPercent(c.env, c.flag); got != c.want {
			t.Errorf("gcPercent(GOGC=%q, --gc-percent=%d) = %d, want %d", c.env, c.flag, got, c.want)
		}
	}
}
