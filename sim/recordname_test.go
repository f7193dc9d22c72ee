package sim

import (
	"fmt"
	"testing"
)

// TestScanRecordIsSscanf: scanRecord answers what fmt.Sscanf answers, on
// the names recordName writes and on what is not one of them.
func TestScanRecordIsSscanf(t *testing.T) {
	inputs := []string{recordName(1, 0, 0), recordName(412, 3, 1<<40), recordName(-2, 1, 7),
		"p1/r0/s5x", "p01/r0/s1", "p+1/r0/s1", "p1/r0/s", "p1/r0", "q1/r0/s1", "p1_0/r0/s1",
		"p1/r0/s1234567890123456789", "p1/r0/s99999999999999999999", "", "p/r/s", "p 1/r0/s1"}
	for _, v := range inputs {
		var pid, r, wantPid, wantR int
		var seq, wantSeq int64
		err := scanRecord(v, &pid, &r, &seq)
		_, wantErr := fmt.Sscanf(v, "p%d/r%d/s%d", &wantPid, &wantR, &wantSeq)
		if (err == nil) != (wantErr == nil) || (err == nil && (pid != wantPid || r != wantR || seq != wantSeq)) {
			t.Errorf("%q: scanRecord %d %d %d %v, Sscanf %d %d %d %v", v, pid, r, seq, err, wantPid, wantR, wantSeq, wantErr)
		}
		var useq, wantUseq uint64
		err = scanRecord(v, &pid, &r, &useq)
		_, wantErr = fmt.Sscanf(v, "p%d/r%d/s%d", &wantPid, &wantR, &wantUseq)
		if (err == nil) != (wantErr == nil) || (err == nil && (pid != wantPid || r != wantR || useq != wantUseq)) {
			t.Errorf("%q (uint64): scanRecord %d %d %d %v, Sscanf %d %d %d %v", v, pid, r, useq, err, wantPid, wantR, wantUseq, wantErr)
		}
	}
	if got, want := recordName(7, 2, 31), fmt.Sprintf("p%d/r%d/s%d", 7, 2, 31); got != want {
		t.Errorf("recordName %q, want %q", got, want)
	}
}
