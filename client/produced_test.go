package client_test

import (
	"bytes"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/geolog/geolog/client"
	"github.com/geolog/geolog/client/clienttest"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

// formRecords returns n records of one key with headers, producer times
// and tombstones among them.
func formRecords(n int) []*client.Record {
	out := make([]*client.Record, n)
	for i := range out {
		out[i] = &client.Record{
			Key:          []byte("k"),
			Value:        fmt.Appendf(nil, "v%d", i),
			Headers:      []client.Header{{Key: "i", Value: []byte{byte(i)}}, {Key: "e"}},
			ProducerTime: time.Unix(0, int64(1000+i)),
		}
		if i%4 == 3 {
			out[i].Value, out[i].Tombstone = nil, true
		}
	}
	return out
}

// TestNodeBothForms: records a producer sends in the batch form (the
// default) and in the records form (WithRecordsForm) read back from a
// real node the same as they were produced, at the offsets acknowledged.
func TestNodeBothForms(t *testing.T) {
	n := startNode(t, t.TempDir(), "127.0.0.1:0")
	c := newClient(t, n.Addr())
	ctx := testCtx(t)
	if _, err := c.CreateStream(ctx, client.StreamConfig{Name: "s", RangeCount: 1}); err != nil {
		t.Fatal(err)
	}
	in := formRecords(40)
	var res []client.ProduceResult
	for _, opts := range [][]client.ProducerOpt{nil, {client.WithRecordsForm()}} {
		p := newProducer(t, c, "s", opts...)
		r, err := p.ProduceSync(ctx, in...)
		if err != nil {
			t.Fatal(err)
		}
		res = append(res, r...)
	}
	got := readAll(t, c, "s", 0)
	if len(got) != 2*len(in) {
		t.Fatalf("read %d records, produced %d", len(got), 2*len(in))
	}
	for i, g := range got {
		w := in[i%len(in)]
		if g.Offset != res[i].Offset || !bytes.Equal(g.Key, w.Key) || !bytes.Equal(g.Value, w.Value) || g.Tombstone != w.Tombstone ||
			!g.ProducerTime.Equal(w.ProducerTime) || len(g.Headers) != 2 || !bytes.Equal(g.Headers[0].Value, w.Headers[0].Value) ||
			g.Headers[1].Key != "e" || len(g.Headers[1].Value) != 0 {
			t.Fatalf("offset %d: read %+v, produced %+v at %d", g.Offset, g, w, res[i].Offset)
		}
	}
}

// TestProducerSendsBatchForm: the producer sends frames by default and
// records with WithRecordsForm, never both.
func TestProducerSendsBatchForm(t *testing.T) {
	for _, recordsForm := range []bool{false, true} {
		fake := startFake(t, clienttest.Config{})
		fake.MustCreateStream("s", 1)
		sent := recordForms(fake)
		var opts []client.ProducerOpt
		want := "batch"
		if recordsForm {
			opts, want = append(opts, client.WithRecordsForm()), "records"
		}
		p := newProducer(t, newClient(t, fake.Addr()), "s", opts...)
		if _, err := p.ProduceSync(testCtx(t), formRecords(10)...); err != nil {
			t.Fatal(err)
		}
		forms := sent()
		for _, f := range forms {
			if f != want {
				t.Fatalf("WithRecordsForm %v: sent %v", recordsForm, forms)
			}
		}
		if len(fake.Records("s", 0)) != 10 {
			t.Fatalf("fake holds %d records", len(fake.Records("s", 0)))
		}
	}
}

// TestProducerFallsBackToRecordsForm: against a server that predates the
// batch form (it ignores AppendRequest.batch and answers EMPTY_BATCH), the
// producer resends in the records form and keeps to it; every record lands
// once, in order, and nothing fails.
func TestProducerFallsBackToRecordsForm(t *testing.T) {
	fake := startFake(t, clienttest.Config{RecordsFormOnly: true})
	fake.MustCreateStream("s", 1)
	sent := recordForms(fake)
	p := newProducer(t, newClient(t, fake.Addr()), "s")
	ctx := testCtx(t)
	for round := 0; round < 3; round++ {
		if _, err := p.ProduceSync(ctx, formRecords(10)...); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
	}
	got := fake.Records("s", 0)
	if len(got) != 30 {
		t.Fatalf("fake holds %d records, want 30", len(got))
	}
	forms := sent()
	if len(forms) == 0 || forms[0] != "batch" {
		t.Fatalf("the producer did not start with the batch form: %v", forms)
	}
	for i, f := range forms[1:] {
		if f != "records" {
			t.Fatalf("send %d after the fallback was in the %s form: %v", i+1, f, forms)
		}
	}
}

// recordForms makes fake note the form of every append it gets ("batch",
// "records", or "both or neither"); the returned func gives them in order.
func recordForms(fake *clienttest.Server) func() []string {
	var mu sync.Mutex
	var forms []string
	fake.SetAppendFault(func(_ int64, req *geologv1.AppendRequest) clienttest.Fault {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case len(req.GetBatch()) > 0 && len(req.GetRecords()) == 0:
			forms = append(forms, "batch")
		case len(req.GetBatch()) == 0 && len(req.GetRecords()) > 0:
			forms = append(forms, "records")
		default:
			forms = append(forms, "both or neither")
		}
		return clienttest.Fault{}
	})
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), forms...)
	}
}
