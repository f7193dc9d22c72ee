package client_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/client"
	"github.com/geolog/geolog/client/clienttest"
	"github.com/geolog/geolog/internal/portlock"
)

func produceN(t *testing.T, p *client.Producer, from, n int) {
	t.Helper()
	var recs []*client.Record
	for i := from; i < from+n; i++ {
		recs = append(recs, &client.Record{Key: []byte("k"), Value: []byte(strconv.Itoa(i))})
	}
	if _, err := p.ProduceSync(testCtx(t), recs...); err != nil {
		t.Fatal(err)
	}
}

func TestRead(t *testing.T) {
	fake := startFake(t, clienttest.Config{})
	fake.MustCreateStream("s", 1)
	c := newClient(t, fake.Addr())
	produceN(t, newProducer(t, c, "s"), 0, 250)
	ctx := testCtx(t)

	r, err := c.Read(ctx, "s", 0, 10, client.ReadOptions{MaxRecords: 100})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Records) != 100 || r.Records[0].Offset != 10 || string(r.Records[0].Value) != "10" ||
		r.NextOffset != 110 || r.TailOffset != 250 || r.Records[0].AppendTime.IsZero() {
		t.Fatalf("read %d records from %d, next %d, tail %d", len(r.Records), r.Records[0].Offset, r.NextOffset, r.TailOffset)
	}
	_, err = c.Read(ctx, "s", 0, 300, client.ReadOptions{})
	var e *client.Error
	if !errors.As(err, &e) || e.Code != client.CodeOffsetOutOfRange || e.TailOffset != 250 {
		t.Fatalf("read past the tail: %v", err)
	}
}

func TestSubscribeResumesAfterDroppedStream(t *testing.T) {
	fake := startFake(t, clienttest.Config{SubscribeRecordsMax: 30})
	fake.MustCreateStream("s", 1)
	c := newClient(t, fake.Addr())
	p := newProducer(t, c, "s")
	produceN(t, p, 0, 200)

	// Drop the stream before every third reply, and fail one with a
	// retriable error.
	fake.SetSubscribeFault(func(n int64) clienttest.Fault {
		switch {
		case n == 4:
			return clienttest.Fault{Err: apierr.New(apierr.Unavailable, "injected")}
		case n%3 == 0:
			return clienttest.Fault{DropStream: true}
		}
		return clienttest.Fault{}
	})
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	var next uint64 = 5
	var endErr error
	produced := make(chan error, 1)
	for rec, err := range c.Subscribe(ctx, "s", 0, client.StartAt{Offset: 5}) {
		if err != nil {
			endErr = err
			break
		}
		if rec.Offset != next || string(rec.Value) != strconv.FormatUint(next, 10) {
			t.Fatalf("got offset %d (%q), want %d", rec.Offset, rec.Value, next)
		}
		next++
		if next == 200 {
			// Caught up: the rest must come from following the tail.
			go func() {
				var recs []*client.Record
				for i := 200; i < 250; i++ {
					recs = append(recs, &client.Record{Key: []byte("k"), Value: []byte(strconv.Itoa(i))})
				}
				_, err := p.ProduceSync(ctx, recs...)
				produced <- err
			}()
		}
		if next == 250 {
			cancel()
		}
	}
	if next != 250 || !errors.Is(endErr, context.Canceled) {
		t.Fatalf("stopped at %d with %v", next, endErr)
	}
	if err := <-produced; err != nil {
		t.Fatal(err)
	}
	if s := fake.Stats(); s.Subscriptions < 3 {
		t.Fatalf("only %d subscriptions: faults did not fire", s.Subscriptions)
	}
}

func TestSubscribeFromTimeAndFinalError(t *testing.T) {
	fake := startFake(t, clienttest.Config{})
	fake.MustCreateStream("s", 1)
	c := newClient(t, fake.Addr())
	p := newProducer(t, c, "s")
	produceN(t, p, 0, 10)
	waitFor(t, "the clock to move", func() bool {
		return time.Now().UnixNano() > fake.Records("s", 0)[9].GetAppendTimeUnixNanos()
	})
	mid := time.Now()
	produceN(t, p, 10, 10)
	ctx := testCtx(t)

	for rec, err := range c.Subscribe(ctx, "s", 0, client.StartAt{Time: mid}) {
		if err != nil {
			t.Fatal(err)
		}
		if rec.Offset != 10 {
			t.Fatalf("first record after %v is at %d, want 10", mid, rec.Offset)
		}
		break
	}
	off, err := c.OffsetForTime(ctx, "s", 0, mid)
	if err != nil || off != 10 {
		t.Fatalf("OffsetForTime = %d, %v; want 10", off, err)
	}
	if off, _ := c.OffsetForTime(ctx, "s", 0, time.Time{}); off != 0 {
		t.Fatalf("OffsetForTime(zero) = %d", off)
	}
	if off, _ := c.OffsetForTime(ctx, "s", 0, time.Now().Add(time.Hour)); off != 20 {
		t.Fatalf("OffsetForTime(future) = %d", off)
	}

	n := 0
	for _, err := range c.Subscribe(ctx, "nope", 0, client.StartAt{}) {
		n++
		if client.CodeOf(err) != client.CodeStreamNotFound || client.IsRetriable(err) {
			t.Fatalf("got %v, want a final STREAM_NOT_FOUND", err)
		}
	}
	if n != 1 {
		t.Fatalf("%d yields for a failed subscription, want 1", n)
	}
}

func TestAdmin(t *testing.T) {
	fake := startFake(t, clienttest.Config{})
	c := newClient(t, fake.Addr())
	ctx := testCtx(t)
	info, err := c.CreateStream(ctx, client.StreamConfig{
		Name: "chat", RangeCount: 3, Regions: []string{"eu", "us"},
		RetentionAge: 168 * time.Hour, RetentionBytes: 1 << 30,
	})
	if err != nil {
		t.Fatal(err)
	}
	if info.RangeCount != 3 || info.RetentionAge != 168*time.Hour || info.RetentionBytes != 1<<30 || len(info.Regions) != 2 {
		t.Fatalf("created %+v", info)
	}
	// The same create again (a retry) is answered with the stream, even
	// with the regions left to the server's default.
	again, err := c.CreateStream(ctx, client.StreamConfig{Name: "chat", RangeCount: 3, RetentionAge: 168 * time.Hour, RetentionBytes: 1 << 30})
	if err != nil || again.RangeCount != 3 || len(again.Regions) != 2 {
		t.Fatalf("the same create again: %+v %v", again, err)
	}
	_, err = c.CreateStream(ctx, client.StreamConfig{Name: "chat", RangeCount: 1})
	if client.CodeOf(err) != client.CodeStreamExists {
		t.Fatalf("second create: %v", err)
	}
	if _, err := c.CreateStream(ctx, client.StreamConfig{Name: "x"}); client.CodeOf(err) != client.CodeInvalidArgument {
		t.Fatalf("create with no ranges: %v", err)
	}
	list, err := c.ListStreams(ctx)
	if err != nil || len(list) != 1 || list[0].Name != "chat" {
		t.Fatalf("list %+v, %v", list, err)
	}
	d, err := c.DescribeStream(ctx, "chat")
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Ranges) != 3 || d.Ranges[0].HashStart != 0 || d.Ranges[2].HashEnd != ^uint64(0) || d.Ranges[1].Status != "ok" {
		t.Fatalf("described %+v", d)
	}
	if _, err := c.DescribeStream(ctx, "nope"); client.CodeOf(err) != client.CodeStreamNotFound {
		t.Fatalf("describe missing: %v", err)
	}
}

func TestOptionValidation(t *testing.T) {
	bad := [][]client.Opt{
		{client.MessageBytesMax(10)},
		{client.WindowBytes(1024, 1<<20)},
		{client.WindowBytes(1<<20, 1<<10)},
		{client.Keepalive(time.Second, time.Second)},
		{client.RetriesMax(-1)},
		{client.RetryBackoff(0, time.Second)},
		{client.RetryBackoff(time.Second, time.Millisecond)},
		{client.RequestTimeout(-1)},
		{client.Logger(nil)},
	}
	for i, opts := range bad {
		if _, err := client.New("127.0.0.1:1", opts...); err == nil {
			t.Errorf("option set %d accepted", i)
		}
	}
	if _, err := client.New(""); err == nil {
		t.Error("empty address accepted")
	}
	c, err := client.New("127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	badP := [][]client.ProducerOpt{
		{client.Linger(-1)},
		{client.BatchBytesMax(0)},
		{client.BatchBytesMax(64 << 20)}, // does not fit a message
		{client.BufferedBytesMax(10)},
		{client.DeliveryTimeout(-1)},
		{client.ProducerRetryBackoff(0, 0)},
	}
	for i, opts := range badP {
		if _, err := c.NewProducer("s", opts...); err == nil {
			t.Errorf("producer option set %d accepted", i)
		}
	}
	if _, err := c.NewProducer(""); err == nil {
		t.Error("empty stream accepted")
	}
	c.Close()
	if _, err := c.NewProducer("s"); !errors.Is(err, client.ErrClosed) {
		t.Errorf("NewProducer on a closed client: %v", err)
	}
	if _, err := c.ListStreams(context.Background()); !errors.Is(err, client.ErrClosed) {
		t.Errorf("ListStreams on a closed client: %v", err)
	}
}

func TestUnreachableServerIsRetriable(t *testing.T) {
	addr := portlock.Addr(t) // held, and nothing listens on it
	c := newClient(t, addr, client.RetriesMax(1))
	_, err := c.ListStreams(testCtx(t))
	if !client.IsRetriable(err) || client.CodeOf(err) != client.CodeUnavailable {
		t.Fatalf("got %v, want a retriable UNAVAILABLE", err)
	}
}

func TestMutualTLS(t *testing.T) {
	cert, pool := selfSigned(t)
	fake := startFake(t, clienttest.Config{TLS: &tls.Config{
		Certificates: []tls.Certificate{cert},
		ClientCAs:    pool,
		ClientAuth:   tls.RequireAndVerifyClientCert,
	}})
	fake.MustCreateStream("s", 1)
	c := newClient(t, fake.Addr(), client.TLSConfig(&tls.Config{
		Certificates: []tls.Certificate{cert},
		RootCAs:      pool,
		ServerName:   "localhost",
	}))
	if _, err := c.ListStreams(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	produceN(t, newProducer(t, c, "s"), 0, 3)

	plain := newClient(t, fake.Addr(), client.RetriesMax(0))
	if _, err := plain.ListStreams(testCtx(t)); err == nil {
		t.Fatal("plaintext client reached a TLS server")
	}
}

// selfSigned returns a certificate valid for localhost as server and client,
// and a pool trusting it.
func selfSigned(t *testing.T) (tls.Certificate, *x509.CertPool) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "localhost"},
		DNSNames:              []string{"localhost"},
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1")},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, pool
}
