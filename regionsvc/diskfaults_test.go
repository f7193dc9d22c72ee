package regionsvc

import (
	"strings"
	"testing"

	"github.com/geolog/geolog/apierr"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"github.com/geolog/geolog/vfs"
)

// TestFsyncFailureKeepsReads: a failed fsync (EIO) stops the range's
// appends for good (the data's fate is unknown until a restart recovers
// the log), but the committed prefix, durable before the failure, is
// still read; describe says why appends stop.
func TestFsyncFailureKeepsReads(t *testing.T) {
	var faults vfs.Faults
	_, c := testNode(t, t.TempDir(), func(cfg *Config) { cfg.FS = vfs.WithFaults(vfs.OS(), &faults) })
	createStream(t, c, "s", 1)
	ctx := ctxT(t)
	for i := 0; i < 3; i++ {
		if _, err := c.Append(ctx, &geologv1.AppendRequest{Stream: "s", Records: recs("v", 10)}); err != nil {
			t.Fatal(err)
		}
	}
	faults.SetSyncFail(true)
	_, err := c.Append(ctx, &geologv1.AppendRequest{Stream: "s", Records: recs("lost", 1)})
	wantCode(t, err, apierr.Unavailable)
	faults.SetSyncFail(false)
	_, err = c.Append(ctx, &geologv1.AppendRequest{Stream: "s", Records: recs("after", 1)})
	wantCode(t, err, apierr.Unavailable)

	rr, err := c.Read(ctx, &geologv1.ReadRequest{Stream: "s"})
	if err != nil || len(rr.Records) != 30 {
		t.Fatalf("read of the committed prefix after an fsync failure: %d records, %v", len(rr.GetRecords()), err)
	}
	d, err := c.DescribeStream(ctx, &geologv1.DescribeStreamRequest{Name: "s"})
	if err != nil || !strings.Contains(d.Ranges[0].Status, "fsync") {
		t.Fatalf("describe after an fsync failure: %v %v", d, err)
	}
}
