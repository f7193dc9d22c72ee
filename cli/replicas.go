package cli

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/geolog/geolog/client"
	"github.com/geolog/geolog/internal/replicamove"
	"github.com/geolog/geolog/internal/rpcerr"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

const replicasUsage = `usage:
  replicas describe <stream> <range>
  replicas add-learner|promote|remove <stream> <range> <node-id>
  replicas replace <stream> <range> <old-node-id> <new-node-id>   (learner, catch-up, promote, remove)`

// replicas runs the membership commands. They go to the range leader: the
// command tries each address of --addr (comma-separated) and follows
// NOT_LEADER hints.
func (e *env) replicas(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return usagef("%s", replicasUsage)
	}
	sub, args := args[0], args[1:]
	fs := e.flagSet("replicas " + sub)
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	want := map[string]int{"describe": 2, "add-learner": 3, "promote": 3, "remove": 3, "replace": 4}[sub]
	if want == 0 || len(pos) != want {
		return usagef("%s", replicasUsage)
	}
	rng, err := strconv.ParseUint(pos[1], 10, 32)
	if err != nil {
		return usagef("range %q is not a number", pos[1])
	}
	ids := make([]uint64, 0, 2)
	for _, p := range pos[2:] {
		id, err := strconv.ParseUint(p, 10, 64)
		if err != nil || id == 0 {
			return usagef("node id %q is not a positive number", p)
		}
		ids = append(ids, id)
	}
	a, err := e.adminDialer()
	if err != nil {
		return err
	}
	defer a.close()
	stream, r := pos[0], uint32(rng)
	change := func(c geologv1.ReplicaChange, node uint64) error {
		resp, err := rangeAdmin{a: a, timeout: e.timeout, stream: stream, r: r}.Change(ctx, c, node, nil)
		if err == nil {
			fmt.Fprintf(e.stdout, "%s %d: voters %v learners %v\n", strings.ToLower(strings.TrimPrefix(c.String(), "REPLICA_CHANGE_")), node, resp.Voters, resp.Learners)
		}
		return err
	}
	switch sub {
	case "describe":
		d, err := a.describe(ctx, e.timeout, stream, r)
		if err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "stream %s range %d: leader %d, last index %d, committed offset %d\n\n", stream, r, d.LeaderId, d.LastIndex, d.CommittedOffset)
		tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "NODE\tADDRESS\tROLE\tMATCH\tBEHIND")
		for _, rs := range d.Replicas {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%d\n", rs.NodeId, rs.Address, rs.Role, rs.MatchIndex, d.LastIndex-min(d.LastIndex, rs.MatchIndex))
		}
		return tw.Flush()
	case "add-learner":
		return change(geologv1.ReplicaChange_REPLICA_CHANGE_ADD_LEARNER, ids[0])
	case "promote":
		return change(geologv1.ReplicaChange_REPLICA_CHANGE_PROMOTE, ids[0])
	case "remove":
		return change(geologv1.ReplicaChange_REPLICA_CHANGE_REMOVE, ids[0])
	}
	// replace old new: the steps internal/replicamove shares with the
	// region's rebalancer.
	ra := rangeAdmin{a: a, timeout: e.timeout, stream: stream, r: r}
	return replicamove.Replace(ctx, ra, ids[0], ids[1], replicamove.Config{
		OnChange: func(c geologv1.ReplicaChange, node uint64, resp *geologv1.ChangeReplicasResponse) {
			fmt.Fprintf(e.stdout, "%s %d: voters %v learners %v\n", strings.ToLower(strings.TrimPrefix(c.String(), "REPLICA_CHANGE_")), node, resp.Voters, resp.Learners)
		},
		OnCaughtUp: func(node uint64, took time.Duration) {
			fmt.Fprintf(e.stdout, "node %d caught up in %v\n", node, took.Round(time.Millisecond))
		},
	})
}

// rangeAdmin is replicamove.Admin over the dialer: each call goes to the
// range leader (adminDialer.call follows NOT_LEADER hints).
type rangeAdmin struct {
	a       *adminDialer
	timeout time.Duration
	stream  string
	r       uint32
}

func (ra rangeAdmin) Change(ctx context.Context, c geologv1.ReplicaChange, node uint64, expectVoters []uint64) (*geologv1.ChangeReplicasResponse, error) {
	var resp *geologv1.ChangeReplicasResponse
	err := ra.a.call(ctx, ra.timeout, func(ctx context.Context, ac geologv1.AdminClient) error {
		var err error
		resp, err = ac.ChangeReplicas(ctx, &geologv1.ChangeReplicasRequest{Stream: ra.stream, Range: ra.r, Change: c, NodeId: node, ExpectedVoters: expectVoters})
		return err
	})
	return resp, err
}

func (ra rangeAdmin) Describe(ctx context.Context) (*geologv1.DescribeReplicasResponse, error) {
	return ra.a.describe(ctx, ra.timeout, ra.stream, ra.r)
}

// adminDialer keeps one connection per node address and finds the leader.
type adminDialer struct {
	addrs []string
	opts  []grpc.DialOption
	conns map[string]*grpc.ClientConn
}

func (e *env) adminDialer() (*adminDialer, error) {
	creds := insecure.NewCredentials()
	tlsCfg, err := e.tlsConfig()
	if err != nil {
		return nil, err
	}
	if tlsCfg != nil {
		creds = credentials.NewTLS(tlsCfg)
	}
	a := &adminDialer{opts: []grpc.DialOption{grpc.WithTransportCredentials(creds)}, conns: map[string]*grpc.ClientConn{}}
	if e.token != "" {
		if tlsCfg == nil {
			return nil, usagef("--token (GEOLOG_TOKEN) is sent over TLS only: give --certs-dir or --tls-ca")
		}
		a.opts = append(a.opts, grpc.WithPerRPCCredentials(client.TokenCredentials(e.token)))
	}
	for _, s := range strings.Split(e.addr, ",") {
		if s = strings.TrimSpace(s); s != "" {
			a.addrs = append(a.addrs, s)
		}
	}
	return a, nil
}

func (a *adminDialer) conn(addr string) (geologv1.AdminClient, error) {
	c, err := a.grpcConn(addr)
	if err != nil {
		return nil, err
	}
	return geologv1.NewAdminClient(c), nil
}

func (a *adminDialer) grpcConn(addr string) (*grpc.ClientConn, error) {
	c, ok := a.conns[addr]
	if !ok {
		var err error
		if c, err = grpc.NewClient(addr, a.opts...); err != nil {
			return nil, err
		}
		a.conns[addr] = c
	}
	return c, nil
}

// call tries the addresses in turn, jumping to a leader hint when one comes,
// for up to 10 attempts.
func (a *adminDialer) call(ctx context.Context, timeout time.Duration, fn func(context.Context, geologv1.AdminClient) error) error {
	return a.callConn(ctx, timeout, func(ctx context.Context, c *grpc.ClientConn) error { return fn(ctx, geologv1.NewAdminClient(c)) })
}

// callConn is call for any service on the node's connection.
func (a *adminDialer) callConn(ctx context.Context, timeout time.Duration, fn func(context.Context, *grpc.ClientConn) error) error {
	var last error
	next := 0
	hint := ""
	for attempt := 0; attempt < 10; attempt++ {
		addr := hint
		if addr == "" {
			addr = a.addrs[next%len(a.addrs)]
			next++
		}
		hint = ""
		c, err := a.grpcConn(addr)
		if err != nil {
			return err
		}
		cctx, cancel := context.WithTimeout(ctx, timeout)
		last = fn(cctx, c)
		cancel()
		if last == nil {
			return nil
		}
		e := rpcerr.FromError(last)
		if !e.Retriable {
			return e
		}
		hint = e.LeaderHint
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Duration(attempt*50) * time.Millisecond):
		}
	}
	return last
}

func (a *adminDialer) describe(ctx context.Context, timeout time.Duration, stream string, r uint32) (*geologv1.DescribeReplicasResponse, error) {
	var d *geologv1.DescribeReplicasResponse
	err := a.call(ctx, timeout, func(ctx context.Context, ac geologv1.AdminClient) error {
		var err error
		d, err = ac.DescribeReplicas(ctx, &geologv1.DescribeReplicasRequest{Stream: stream, Range: r})
		return err
	})
	return d, err
}

func (a *adminDialer) close() {
	for _, c := range a.conns {
		c.Close()
	}
}
