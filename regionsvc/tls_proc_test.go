package regionsvc_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math"
	"math/big"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/geolog/geolog/client"
	"github.com/geolog/geolog/internal/nodeproc"
	"github.com/geolog/geolog/internal/rpcerr"
	"github.com/geolog/geolog/pki"
	geologinternalv1 "github.com/geolog/geolog/proto/geologinternalv1"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// firstStreamGroup is the Raft group of range 0 of the first stream a
// region creates (regionsvc's groupFor: the catalogue offset of its
// creation, 0, plus one, shifted by 16 bits).
const firstStreamGroup = 1 << 16

func procAddrs(procs []*nodeproc.Proc) []string {
	var out []string
	for _, p := range procs {
		out = append(out, p.Addr)
	}
	return out
}

// tlsClient is an SDK client of the certs folder dir.
func tlsClient(t *testing.T, addrs []string, dir string) *client.Client {
	t.Helper()
	c, err := client.New(strings.Join(addrs, ","), client.TLSConfig(nodeproc.ClientTLS(t, dir)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// produceTagged appends n records with values tag-0 ... and fails on any
// error.
func produceTagged(t *testing.T, ctx context.Context, c *client.Client, stream, tag string, n int) {
	t.Helper()
	p, err := c.NewProducer(stream)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for i := range n {
		if _, err := p.ProduceSync(ctx, &client.Record{Key: []byte("k"), Value: []byte(fmt.Sprintf("%s-%d", tag, i))}); err != nil {
			t.Fatalf("produce %s-%d: %v", tag, i, err)
		}
	}
}

// replicaState is what a probe must leave as it was: per node, the range's
// leader, last Raft index and committed offset. A higher term anywhere
// elects a leader, whose first entry moves the last index.
type replicaState struct {
	leader, lastIndex, committed uint64
}

func replicaStates(t *testing.T, ctx context.Context, procs []*nodeproc.Proc, dir, stream string) map[string]replicaState {
	t.Helper()
	out := map[string]replicaState{}
	for _, p := range procs {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		r, err := geologv1.NewAdminClient(nodeproc.Dial(t, p.Addr, dir)).DescribeReplicas(cctx, &geologv1.DescribeReplicasRequest{Stream: stream, Range: 0})
		cancel()
		if err == nil {
			out[p.Addr] = replicaState{r.GetLeaderId(), r.GetLastIndex(), r.GetCommittedOffset()}
		}
	}
	if len(out) != 1 {
		t.Fatalf("%d nodes answered DescribeReplicas as leader, want 1: %v", len(out), out)
	}
	return out
}

// TestTLSRegion: a region of three geologd processes with TLS on every hop
// elects leaders and serves a client with a certificate (it could not
// before: the Raft transport dialed plaintext); plaintext and a
// certificate of another CA are refused; a client principal calling a
// node-to-node service or setting the internal headers is refused; forged
// Raft streams in a region node's name, with a client's or another node's
// certificate, are refused with the region's leaders, log and terms as
// they were, and the region goes on serving.
func TestTLSRegion(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("real-process test")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	p := nodeproc.NewPKI(t)
	procs := nodeproc.TLSRegion(t, p, "us", 3, "--tick", "50ms", "--superusers", "alice")
	alice := p.ClientDir("alice")
	c := tlsClient(t, procAddrs(procs), alice)
	waitFor(t, ctx, "stream created", func() bool {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err := c.CreateStream(cctx, client.StreamConfig{Name: "t", RangeCount: 1})
		return err == nil || client.CodeOf(err) == client.CodeStreamExists
	})
	produceTagged(t, ctx, c, "t", "before", 20)
	// The committed offset a node publishes may trail its last ack by a
	// few milliseconds (the commit mark lingers for the next write).
	var before map[string]replicaState
	waitFor(t, ctx, "the 20 records' commit published", func() bool {
		before = replicaStates(t, ctx, procs, alice, "t")
		for _, st := range before {
			return st.committed == 20
		}
		return false
	})

	t.Run("plaintext", func(t *testing.T) { plaintextRefused(t, ctx, procs) })
	t.Run("other CA", func(t *testing.T) { otherCARefused(t, ctx, procs) })
	t.Run("client calls internal", func(t *testing.T) { clientInternalRefused(t, ctx, procs, alice) })
	t.Run("forged raft", func(t *testing.T) { forgedRaftRefused(t, ctx, procs, p, alice) })

	if after := replicaStates(t, ctx, procs, alice, "t"); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("the probes changed the range:\n%v\nwas\n%v", after, before)
	}
	produceTagged(t, ctx, c, "t", "after", 5)
	// A home read: a local read may reach a follower that has not applied
	// the last acks yet.
	res, err := c.Read(ctx, "t", 0, 0, client.ReadOptions{MaxRecords: 100, Consistency: client.ConsistencyHome})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Records) != 25 {
		t.Fatalf("read %d records, want 25", len(res.Records))
	}
	// The refusals are in the logs, with who was refused.
	for _, want := range []struct {
		node int
		line string
	}{
		{0, "principal=alice"},
		{0, "principal=node:eu/2"},
		{0, `error="the caller is node:us/3, not the node the stream names"`},
		{0, `error="the caller is not a node of this region (or was decommissioned)"`},
		{1, `error="the caller is node:us/3, not the node the stream names"`},
	} {
		if out := procs[want.node].Output(); !strings.Contains(out, want.line) {
			t.Errorf("node %d did not log %s:\n%s", want.node+1, want.line, out)
		}
	}
}

func plaintextRefused(t *testing.T, ctx context.Context, procs []*nodeproc.Proc) {
	conn, err := grpc.NewClient(procs[0].Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err = geologv1.NewLogClient(conn).ListStreams(cctx, &geologv1.ListStreamsRequest{})
	if code := status.Code(err); code != codes.Unavailable {
		t.Fatalf("plaintext ListStreams: %v, want Unavailable (no TLS handshake)", err)
	}
}

func otherCARefused(t *testing.T, ctx context.Context, procs []*nodeproc.Proc) {
	other := nodeproc.NewPKI(t)
	for _, dir := range []string{other.ClientDir("alice"), other.NodeDir("us", 2)} {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := geologv1.NewLogClient(nodeproc.Dial(t, procs[0].Addr, dir)).ListStreams(cctx, &geologv1.ListStreamsRequest{})
		cancel()
		if err == nil {
			t.Fatalf("%s: a certificate of another CA was accepted", filepath.Base(dir))
		}
	}
}

// clientInternalRefused calls every node-to-node service with a client
// principal's certificate.
func clientInternalRefused(t *testing.T, ctx context.Context, procs []*nodeproc.Proc, dir string) {
	conn := nodeproc.Dial(t, procs[0].Addr, dir)
	denied := func(what string, err error) {
		t.Helper()
		if status.Code(err) != codes.PermissionDenied {
			t.Errorf("%s: %v, want PermissionDenied", what, err)
		}
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	rs, err := geologinternalv1.NewRaftTransportClient(conn).Stream(cctx)
	if err == nil {
		_ = rs.Send(&geologinternalv1.RaftBatch{FromNode: 2, ToNode: 1})
		_, err = rs.Recv()
	}
	denied("Raft stream", err)
	ss, err := geologinternalv1.NewRaftTransportClient(conn).Snapshot(cctx)
	if err == nil {
		_ = ss.Send(&geologinternalv1.SnapshotChunk{})
		_, err = ss.CloseAndRecv()
	}
	denied("Raft snapshot", err)
	ms, err := geologinternalv1.NewMirrorClient(conn).Replicate(cctx)
	if err == nil {
		_ = ms.Send(mirrorOpen("t", "eu", "us", 1000, 0))
		_, err = ms.Recv()
	}
	denied("Mirror replicate", err)
	_, err = geologv1.NewAdminClient(conn).RefreshHomes(cctx, &geologv1.RefreshHomesRequest{})
	denied("RefreshHomes", err)
	lc := geologv1.NewLogClient(conn)
	for _, key := range []string{"x-geolog-forwarded", "x-geolog-propagated"} {
		hctx := metadata.AppendToOutgoingContext(cctx, key, "1")
		_, err = lc.CreateStream(hctx, &geologv1.CreateStreamRequest{Name: "forged", RangeCount: 1})
		denied("CreateStream with "+key, err)
		_, err = lc.Read(hctx, &geologv1.ReadRequest{Stream: "t", Consistency: geologv1.Consistency_CONSISTENCY_HOME})
		denied("Read with "+key, err)
	}
	// The same client may use the public API.
	if _, err := lc.ListStreams(cctx, &geologv1.ListStreamsRequest{}); err != nil {
		t.Fatalf("ListStreams: %v", err)
	}
}

// forgedRaftRefused opens Raft streams in node 2's name to node 1 (and in
// node 1's to node 2) with certificates that do not name that node: a
// client's, a node of another region's, another node of the region's, a
// node outside --peers. Each stream would carry a heartbeat at a high term
// (it deposed leaders before) and an append.
func forgedRaftRefused(t *testing.T, ctx context.Context, procs []*nodeproc.Proc, p *nodeproc.PKI, alice string) {
	u := proto.Uint64
	for _, probe := range []struct {
		name     string
		dir      string
		from, to uint64
	}{
		{"client principal", alice, 2, 1},
		{"node of another region", p.OtherNodeDir("eu", 2), 2, 1},
		{"another node of the region", p.OtherNodeDir("us", 3), 2, 1},
		{"another node of the region, to node 2", p.OtherNodeDir("us", 3), 1, 2},
		{"a node outside --peers", p.OtherNodeDir("us", 9), 9, 1},
	} {
		conn := nodeproc.Dial(t, procs[probe.to-1].Addr, probe.dir)
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		s, err := geologinternalv1.NewRaftTransportClient(conn).Stream(cctx)
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		hb, _ := proto.Marshal(&raftpb.Message{Type: raftpb.MsgHeartbeat.Enum(), From: u(probe.from), To: u(probe.to), Term: u(1000)})
		app, _ := proto.Marshal(&raftpb.Message{Type: raftpb.MsgApp.Enum(), From: u(probe.from), To: u(probe.to), Term: u(1000),
			Index: u(0), LogTerm: u(0), Commit: u(0)})
		_ = s.Send(&geologinternalv1.RaftBatch{FromNode: probe.from, ToNode: probe.to})
		_ = s.Send(&geologinternalv1.RaftBatch{FromNode: probe.from, ToNode: probe.to, Messages: []*geologinternalv1.GroupMessage{
			{GroupId: firstStreamGroup, Message: hb}, {GroupId: firstStreamGroup, Message: app}}})
		_, err = s.Recv()
		cancel()
		if status.Code(err) != codes.PermissionDenied {
			t.Errorf("%s: stream ended with %v, want PermissionDenied", probe.name, err)
		}
	}
}

// mirrorOpen is the first request of a Mirror stream.
func mirrorOpen(stream, dst, src string, epoch, leader uint64) *geologinternalv1.ReplicateRequest {
	return &geologinternalv1.ReplicateRequest{
		Open: &geologinternalv1.ReplicateOpen{Stream: stream, Range: 0, SourceRegion: src, DestinationRegion: dst, HomeEpoch: epoch},
		Heartbeat: &geologinternalv1.HomeHeartbeat{HomeEpoch: epoch, CommittedEndOffset: 1 << 40,
			HomeTimeUnixNanos: time.Now().UnixNano(), LeaderNodeId: leader},
	}
}

// twoRegions starts a region of one node each in us and eu, with TLS,
// each knowing the other.
func twoRegions(t *testing.T, p *nodeproc.PKI) (us, eu *nodeproc.Proc) {
	usAddr, euAddr := nodeproc.FreeAddr(t), nodeproc.FreeAddr(t)
	start := func(region, addr, other, otherAddr string) *nodeproc.Proc {
		return nodeproc.Start(t, t.TempDir(), addr, "--region", region, "--node-id", "1", "--peers", "1="+addr,
			"--region-addrs", other+"="+otherAddr, "--tick", "50ms", "--certs-dir", p.NodeDir(region, 1), "--superusers", "alice")
	}
	return start("us", usAddr, "eu", euAddr), start("eu", euAddr, "us", usAddr)
}

// tailAt is the tail of range 0 of stream as the node at addr reports it.
func tailAt(t *testing.T, ctx context.Context, c *client.Client, stream string) (tail, epoch uint64) {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	d, err := c.DescribeStream(cctx, stream)
	if err != nil || len(d.Ranges) == 0 {
		return 0, 0
	}
	return d.Ranges[0].TailOffset, d.Ranges[0].Epoch
}

// TestTLSMirrorOnlyFromHome: two regions with TLS replicate; forged Mirror
// streams to the mirror in eu are refused: from a client principal, from
// a node certificate that does not name the region the stream claims,
// from a node of a region that is not the range's home, and from the
// home leader's own identity at an epoch above the current one (a
// compromised or confused node of the home region). The mirror's epoch
// and log stay the home's, and replication from the real home goes on.
func TestTLSMirrorOnlyFromHome(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("real-process test")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	p := nodeproc.NewPKI(t)
	us, eu := twoRegions(t, p)
	alice := p.ClientDir("alice")
	uc, ec := tlsClient(t, []string{us.Addr}, alice), tlsClient(t, []string{eu.Addr}, alice)
	waitFor(t, ctx, "stream created", func() bool {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err := uc.CreateStream(cctx, client.StreamConfig{Name: "m", RangeCount: 1, Regions: []string{"us", "eu"}, HomeRegion: "us"})
		return err == nil || client.CodeOf(err) == client.CodeStreamExists
	})
	produceTagged(t, ctx, uc, "m", "a", 10)
	waitFor(t, ctx, "eu has the home's 10 records", func() bool { tail, _ := tailAt(t, ctx, ec, "m"); return tail == 10 })
	_, epoch := tailAt(t, ctx, ec, "m")

	for _, probe := range []struct {
		name, dir, src string
		leader         uint64
		want           codes.Code
	}{
		{"client principal", alice, "us", 1, codes.PermissionDenied},
		{"a node of ap claiming us", p.OtherNodeDir("ap", 1), "us", 1, codes.PermissionDenied},
		{"eu's own node claiming us", p.OtherNodeDir("eu", 1), "us", 1, codes.PermissionDenied},
		{"us node 2 claiming leader 1", p.OtherNodeDir("us", 2), "us", 1, codes.PermissionDenied},
		{"a node of ap, not the home", p.OtherNodeDir("ap", 1), "ap", 1, codes.Unavailable},
		{"us node 1, the home leader, at epoch 1000", p.OtherNodeDir("us", 1), "us", 1, codes.Unavailable}, // NOT_HOME
	} {
		code := forgeMirror(t, ctx, eu.Addr, probe.dir, probe.src, probe.leader)
		if code != probe.want {
			t.Errorf("%s: refused with %v, want %v", probe.name, code, probe.want)
		}
	}
	produceTagged(t, ctx, uc, "m", "b", 5)
	waitFor(t, ctx, "eu has the home's 15 records", func() bool { tail, _ := tailAt(t, ctx, ec, "m"); return tail == 15 })
	if _, e := tailAt(t, ctx, ec, "m"); e != epoch {
		t.Fatalf("eu's epoch moved from %d to %d", epoch, e)
	}
	res, err := ec.Read(ctx, "m", 0, 0, client.ReadOptions{MaxRecords: 100})
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res.Records {
		if !strings.HasPrefix(string(r.Value), "a-") && !strings.HasPrefix(string(r.Value), "b-") {
			t.Fatalf("record %d in eu is %q, not the home's", i, r.Value)
		}
	}
}

// forgeMirror opens a Mirror stream to addr at a high epoch with the certs
// folder dir, claiming source region src, and returns how it was refused:
// the stream's status, or the code of the refusal it answered with (OK if
// it was accepted).
func forgeMirror(t *testing.T, ctx context.Context, addr, dir, src string, leader uint64) codes.Code {
	t.Helper()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	s, err := geologinternalv1.NewMirrorClient(nodeproc.Dial(t, addr, dir)).Replicate(cctx)
	if err != nil {
		t.Fatal(err)
	}
	_ = s.Send(mirrorOpen("m", "eu", src, 1000, leader))
	resp, err := s.Recv()
	if err != nil {
		return status.Code(err)
	}
	if e := resp.GetError(); e != nil {
		return status.Code(rpcerr.ToStatus(rpcerr.FromDetail(e)))
	}
	return codes.OK
}

// leafExpiry reads when the certificate in file expires.
func leafExpiry(t *testing.T, file string) time.Time {
	t.Helper()
	f, err := pki.OpenFiles(pki.FilesConfig{CAFile: filepath.Join(filepath.Dir(file), pki.CACertFile), CertFile: file,
		KeyFile: filepath.Join(filepath.Dir(file), pki.NodeKeyFile)})
	if err != nil {
		t.Fatal(err)
	}
	return f.Leaf().NotAfter
}

// scrapeGauge reads the value of the first series of addr's /metrics
// named name that carries every one of labels (each `key="value"`).
func scrapeGauge(t *testing.T, addr, name string, labels ...string) (float64, bool) {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, false
	}
lines:
	for _, line := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(line, name+"{") {
			continue
		}
		// Labels come sorted by name, among others (geolog_region and
		// geolog_node_id are on every series): each wanted one, anywhere.
		for _, l := range labels {
			if !strings.Contains(line[:strings.LastIndexByte(line, ' ')], l) {
				continue lines
			}
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		return v, err == nil
	}
	return 0, false
}

// serialOf reads the serial number of the certificate in file.
func serialOf(t *testing.T, file string) *big.Int {
	t.Helper()
	f, err := pki.OpenFiles(pki.FilesConfig{CAFile: filepath.Join(filepath.Dir(file), pki.CACertFile), CertFile: file,
		KeyFile: filepath.Join(filepath.Dir(file), pki.NodeKeyFile)})
	if err != nil {
		t.Fatal(err)
	}
	return f.Leaf().SerialNumber
}

// presented is the serial of the certificate a node presents to a new
// connection.
func presented(addr string, cfg *tls.Config) (*big.Int, error) {
	c, err := tls.Dial("tcp", addr, cfg)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0].SerialNumber, nil
}

// TestTLSCertificateRotation: every node of a TLS region gets a new
// certificate while producers run: the nodes pick the files up (polled),
// new connections see the new certificates, the connections already open
// (Raft between the nodes, the producers' own) carry on, and no append
// fails.
func TestTLSCertificateRotation(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("real-process test")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	p := nodeproc.NewPKI(t)
	procs := nodeproc.TLSRegion(t, p, "us", 3, "--tick", "50ms", "--tls-reload-interval", "200ms", "--superusers", "alice")
	alice := p.ClientDir("alice")
	c := tlsClient(t, procAddrs(procs), alice)
	waitFor(t, ctx, "stream created", func() bool {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err := c.CreateStream(cctx, client.StreamConfig{Name: "r", RangeCount: 2})
		return err == nil || client.CodeOf(err) == client.CodeStreamExists
	})
	var acked, failed atomic.Int64
	var firstErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pr, err := c.NewProducer("r")
			if err != nil {
				failed.Add(1)
				firstErr.CompareAndSwap(nil, err)
				return
			}
			defer pr.Close()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				key := []byte(fmt.Sprintf("w%d-k%d", w, i%16))
				if _, err := pr.ProduceSync(ctx, &client.Record{Key: key, Value: []byte(fmt.Sprintf("w%d-%d", w, i))}); err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err)
					return
				}
				acked.Add(1)
			}
		}()
	}
	waitFor(t, ctx, "appends before the rotation", func() bool { return acked.Load() >= 50 })
	cfg := nodeproc.ClientTLS(t, alice)
	for i, pr := range procs {
		dir := p.NodeDir("us", uint64(i+1)) // a new key and serial
		want := serialOf(t, filepath.Join(dir, pki.NodeCertFile))
		waitFor(t, ctx, fmt.Sprintf("node %d presents its new certificate", i+1), func() bool {
			got, err := presented(pr.Addr, cfg)
			return err == nil && got.Cmp(want) == 0
		})
		// Let the node dial its peers anew with it, under load.
		n := acked.Load()
		waitFor(t, ctx, "appends after the rotation", func() bool { return acked.Load() >= n+20 })
	}
	close(stop)
	wg.Wait()
	if failed.Load() != 0 {
		t.Fatalf("%d producers failed during the rotation: %v", failed.Load(), firstErr.Load())
	}
	var read int
	for r := uint32(0); r < 2; r++ {
		res, err := c.Read(ctx, "r", r, 0, client.ReadOptions{MaxRecords: 100000, Consistency: client.ConsistencyHome}) // a follower may be behind the last acks
		if err != nil {
			t.Fatal(err)
		}
		read += len(res.Records)
	}
	if int64(read) < acked.Load() {
		t.Fatalf("read %d records, %d were acked", read, acked.Load())
	}
	t.Logf("%d appends acked across the rotation of 3 node certificates, none failed", acked.Load())
}

// TestTLSReloadOnSIGHUP: a node that does not poll (an hour's interval)
// takes a new certificate on SIGHUP, and on SIGHUP with unchanged files
// keeps serving; its /metrics says how long the certificate in use has
// left.
func TestTLSReloadOnSIGHUP(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("real-process test")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p := nodeproc.NewPKI(t)
	dir := p.NodeDir("local", 1)
	debug := nodeproc.FreeAddr(t)
	node := nodeproc.Start(t, t.TempDir(), nodeproc.FreeAddr(t), "--certs-dir", dir, "--tls-reload-interval", "1h", "--debug-addr", debug, "--superusers", "alice")
	cfg := nodeproc.ClientTLS(t, p.ClientDir("alice"))
	first := serialOf(t, filepath.Join(dir, pki.NodeCertFile))
	waitFor(t, ctx, "the node serves", func() bool {
		got, err := presented(node.Addr, cfg)
		return err == nil && got.Cmp(first) == 0
	})
	node.Signal(syscall.SIGHUP)
	second := serialOf(t, filepath.Join(p.NodeDir("local", 1), pki.NodeCertFile))
	node.Signal(syscall.SIGHUP)
	waitFor(t, ctx, "the new certificate after SIGHUP", func() bool {
		got, err := presented(node.Addr, cfg)
		return err == nil && got.Cmp(second) == 0
	})
	leaf := leafExpiry(t, filepath.Join(dir, pki.NodeCertFile))
	var left float64
	waitFor(t, ctx, "the certificate's expiry on /metrics", func() bool {
		var ok bool
		left, ok = scrapeGauge(t, debug, "geolog_tls_certificate_expiry_seconds", `certificate="leaf"`, `identity="node:local/1"`)
		return ok
	})
	if want := time.Until(leaf).Seconds(); math.Abs(left-want) > 600 {
		t.Errorf("/metrics: the certificate has %.0f s left, want about %.0f", left, want)
	}
	if out := node.Output(); strings.Contains(out, "panic") {
		t.Fatalf("node output:\n%s", out)
	}
}

// TestGeologdWantsTLSOrInsecure: geologd without TLS files and without
// --insecure refuses to start with one line; with a certificate that
// names another node than its flags it refuses too; with --insecure it
// starts and says so in its log.
func TestGeologdWantsTLSOrInsecure(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("real-process test")
	}
	bin := nodeproc.Binary(t)
	p := nodeproc.NewPKI(t)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"nothing", nil, "geologd: no TLS: give --certs-dir (or --tls-ca, --tls-cert and --tls-key), or --insecure for development without TLS"},
		{"both", []string{"--insecure", "--certs-dir", p.NodeDir("local", 1)}, "geologd: --insecure and TLS files exclude each other"},
		{"another region", []string{"--certs-dir", p.NodeDir("eu", 1)}, "names node:eu/1, a node of region eu, but --region is local"},
		{"another node", []string{"--certs-dir", p.NodeDir("local", 2), "--node-id", "1", "--peers", "1=127.0.0.1:1"}, "names node:local/2, but --node-id is 1"},
		{"a client certificate", []string{"--tls-ca", filepath.Join(p.ClientDir("alice"), "ca.crt"),
			"--tls-cert", filepath.Join(p.ClientDir("alice"), "client.crt"), "--tls-key", filepath.Join(p.ClientDir("alice"), "client.key")}, "names alice, not a node"},
	} {
		cmd := exec.Command(bin, append([]string{"--data-dir", t.TempDir(), "--listen", "127.0.0.1:0"}, tc.args...)...)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		err := cmd.Run()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 2 {
			t.Errorf("%s: %v, want exit status 2", tc.name, err)
		}
		lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
		if last := lines[len(lines)-1]; !strings.Contains(last, tc.want) {
			t.Errorf("%s: said %q, want %q", tc.name, stderr.String(), tc.want)
		}
		if tc.name == "nothing" && len(lines) != 1 {
			t.Errorf("refusal in %d lines: %q", len(lines), stderr.String())
		}
	}
	node := nodeproc.Start(t, t.TempDir(), nodeproc.FreeAddr(t), "--insecure")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	waitFor(t, ctx, "the insecure warning", func() bool { return strings.Contains(node.Output(), "INSECURE MODE") })
}
