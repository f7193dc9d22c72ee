package chaos

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"time"

	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// ErrUnsupported is returned by a Cluster for an action it cannot take (a
// cluster attached through an env file without pid files cannot kill).
var ErrUnsupported = errors.New("chaos: not supported by this cluster")

// NodeRef names one node: its region and Raft id.
type NodeRef struct {
	Region string `json:"region"`
	ID     int    `json:"id"`
}

// String is the node's selector and link-endpoint name, "us:n2".
func (n NodeRef) String() string { return fmt.Sprintf("%s:n%d", n.Region, n.ID) }

// Node is one node of a cluster as the harness reaches it.
type Node struct {
	NodeRef
	// Addr is the node's own gRPC address; the harness's admin calls
	// (who leads?) go there directly.
	Addr string
	// ClientAddr is where SDK clients dial it: a client link of the WAN
	// emulator, or Addr. It is the address the node advertises (geologd
	// --advertise-addr), which every leader and home hint names.
	ClientAddr string
	// DebugAddr serves /metrics and, with failpoints, /debug/failpoints;
	// empty when unknown.
	DebugAddr string
}

// Caps says which faults a cluster can inject.
type Caps struct {
	// Processes: Kill, Restart, Pause and Resume work.
	Processes bool
	// WAN: a geolog-wan control API carries the links between regions.
	WAN bool
	// IntraRegionLinks: Raft traffic between a region's nodes goes through
	// the WAN emulator too (links "us:n1->us:n2"), so nodes of one region
	// can be partitioned.
	IntraRegionLinks bool
	// ClientLinks: SDK clients reach nodes through links "client->us:n1".
	ClientLinks bool
	// Failpoints: nodes run with --debug-failpoints (disk, clock skew).
	Failpoints bool
	// LeaseStore: the cluster runs a lease store it can stop and start
	// (lease-store-outage in "stop" mode).
	LeaseStore bool
	// LeaseTTL is the nodes' --lease-ttl when they run with a lease store
	// (homing on), 0 when homing is off. A "cut" lease-store outage needs
	// it and WAN links "<region>->pg".
	LeaseTTL time.Duration
}

// Cluster is a running geolog cluster the harness injects faults into.
// Methods are safe for concurrent use.
type Cluster interface {
	// Regions lists the regions, Nodes every node (in region, id order).
	Regions() []string
	Nodes() []Node
	Caps() Caps
	// WANControl is the address of geolog-wan's control API, "" if none.
	WANControl() string
	// Kill SIGKILLs a node and waits for it to be gone; Restart starts it
	// again with the same flags and data; Pause and Resume send SIGSTOP
	// and SIGCONT. ErrUnsupported without Caps.Processes.
	Kill(NodeRef) error
	Restart(NodeRef) error
	Pause(NodeRef) error
	Resume(NodeRef) error
	// StopLeaseStore and StartLeaseStore stop and start the lease store's
	// server; ErrUnsupported without Caps.LeaseStore.
	StopLeaseStore() error
	StartLeaseStore() error
	// ClientTLS is the TLS configuration clients dial the nodes with (a
	// client certificate of the cluster's CA), nil when the nodes run
	// --insecure.
	ClientTLS() *tls.Config
	// Close stops what the cluster started; an attached cluster stays up.
	Close() error
}

// ClusterFactory provides the cluster a scenario runs on: a fresh one of
// the given shape, or an attached one that must have the shape's regions.
type ClusterFactory func(ctx context.Context, name string, shape Shape) (Cluster, error)

// regionNodes returns the nodes of region in id order.
func regionNodes(c Cluster, region string) []Node {
	var out []Node
	for _, n := range c.Nodes() {
		if n.Region == region {
			out = append(out, n)
		}
	}
	return out
}

// clientAddrs is a region's client addresses, comma-separated.
func clientAddrs(c Cluster, region string) string {
	var out []string
	for _, n := range regionNodes(c, region) {
		out = append(out, n.ClientAddr)
	}
	return strings.Join(out, ",")
}

// transportCreds are the credentials of a client dialing with cfg (nil:
// plaintext).
func transportCreds(cfg *tls.Config) credentials.TransportCredentials {
	if cfg == nil {
		return insecure.NewCredentials()
	}
	return credentials.NewTLS(cfg)
}

// answers reports whether the node at addr serves the API to a client
// dialing with cfg. A refusal (PERMISSION_DENIED: the harness's principal
// may not list every stream) is an answer: the node authenticated the
// client and decided.
func answers(ctx context.Context, addr string, cfg *tls.Config) bool {
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(transportCreds(cfg)))
	if err != nil {
		return false
	}
	defer conn.Close()
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, err = geologv1.NewLogClient(conn).ListStreams(cctx, &geologv1.ListStreamsRequest{})
	return err == nil || status.Code(err) == codes.PermissionDenied
}
