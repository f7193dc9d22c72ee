package regionsvc

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// readyReasonsMax bounds the reasons Ready lists; past it one more line
// says how many were left out, so that a node of a million ranges answers
// /readyz in bounded memory.
const readyReasonsMax = 20

// Ready reports whether the node serves everything it should: it is
// started and not closing; in a replicated region the catalogue range has
// a leader and has applied all it committed; every range of every stream
// it holds is open and not stopped (corruption, I/O error), has a known
// Raft leader when this node is one of the range's initial voters (passive
// replicas, outside a range's group until Admin.ChangeReplicas brings them
// in, have none to know), and, with a lease store, a known home. When not
// ready, reasons says why, one short line each (at most readyReasonsMax
// lines and a count of the rest). Safe from any goroutine; it reads only
// published state (atomics and the stream map under its read lock).
func (n *Node) Ready() (bool, []string) {
	var r reasons
	select {
	case <-n.closing:
		r.add("the node is shutting down")
		return false, r.list()
	default:
	}
	if !n.serving.Load() {
		r.add("the node has not started serving")
		return false, r.list()
	}
	if n.replicated() {
		meta := n.region.meta
		switch {
		case meta.failure.Load() != nil:
			r.add(fmt.Sprintf("the catalogue range is not served: %v", meta.failure.Load()))
		case meta.rep.LeaderID() == 0:
			r.add("the catalogue range has no leader yet")
		case meta.rep.Relearning():
			r.add("the catalogue range is relearning its commit index after a machine restart")
		case n.region.metaApplied.Load() < meta.committed.Load():
			r.add(fmt.Sprintf("the catalogue has applied %d of %d committed records", n.region.metaApplied.Load(), meta.committed.Load()))
		}
	}
	n.mu.RLock()
	names := make([]string, 0, len(n.streams))
	for name := range n.streams {
		names = append(names, name)
	}
	slices.Sort(names) // the same reasons first on every call
	for _, name := range names {
		st := n.streams[name]
		for i, d := range st.ranges {
			if why := n.rangeUnready(d); why != "" {
				r.add(fmt.Sprintf("stream %s range %d: %s", name, i, why))
			}
		}
	}
	n.mu.RUnlock()
	return r.count == 0, r.list()
}

// rangeUnready says why this node does not serve d, or "".
func (n *Node) rangeUnready(d *rangeDriver) string {
	if f := d.failure.Load(); f != nil {
		return "not served: " + f.Message
	}
	if d.rep != nil && slices.Contains(d.cfg.repl.peers, n.cfg.NodeID) && d.rep.LeaderID() == 0 {
		return "no Raft leader yet"
	}
	if d.rep != nil && d.rep.Relearning() {
		return "relearning the commit index after a machine restart (reads go to other replicas)"
	}
	if n.cfg.LeaseStore != nil && d.role().region == "" {
		return "its home region is not known yet"
	}
	return ""
}

// reasons collects at most readyReasonsMax lines and counts the rest.
type reasons struct {
	lines []string
	count int
}

func (r *reasons) add(line string) {
	if r.count++; len(r.lines) < readyReasonsMax {
		r.lines = append(r.lines, line)
	}
}

func (r *reasons) list() []string {
	if left := r.count - len(r.lines); left > 0 {
		return append(r.lines, fmt.Sprintf("and %d more", left))
	}
	return r.lines
}

// healthServices are the service names the gRPC health service answers
// for: "" (the node as a whole) and each public service. All of them
// report Ready; any other name is NOT_FOUND, as grpc.health.v1 says.
var healthServices = []string{"", "geolog.v1.Log", "geolog.v1.Admin", "geolog.v1.Consumer"}

// healthWatchInterval is how often a Watch call re-reads readiness.
const healthWatchInterval = time.Second

// healthServer is grpc.health.v1.Health over Node.Ready: SERVING when
// ready, NOT_SERVING otherwise. Check and Watch need no rights (any caller
// the transport admits may ask; see peerauth.go).
type healthServer struct {
	healthpb.UnimplementedHealthServer
	node *Node
}

func (h *healthServer) status(service string) (healthpb.HealthCheckResponse_ServingStatus, error) {
	if !slices.Contains(healthServices, service) {
		return 0, status.Errorf(codes.NotFound, "unknown service %q", service)
	}
	if ok, _ := h.node.Ready(); ok {
		return healthpb.HealthCheckResponse_SERVING, nil
	}
	return healthpb.HealthCheckResponse_NOT_SERVING, nil
}

func (h *healthServer) Check(_ context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	s, err := h.status(req.GetService())
	if err != nil {
		return nil, err
	}
	return &healthpb.HealthCheckResponse{Status: s}, nil
}

// Watch sends the status now and whenever it changes (read every
// healthWatchInterval), until the caller leaves or the node closes. An
// unknown service gets SERVICE_UNKNOWN, as the protocol says.
func (h *healthServer) Watch(req *healthpb.HealthCheckRequest, stream healthpb.Health_WatchServer) error {
	last := healthpb.HealthCheckResponse_ServingStatus(-1)
	t := time.NewTicker(healthWatchInterval)
	defer t.Stop()
	for {
		s, err := h.status(req.GetService())
		if err != nil {
			s = healthpb.HealthCheckResponse_SERVICE_UNKNOWN
		}
		if s != last {
			if err := stream.Send(&healthpb.HealthCheckResponse{Status: s}); err != nil {
				return err
			}
			last = s
		}
		select {
		case <-t.C:
		case <-stream.Context().Done():
			return status.FromContextError(stream.Context().Err()).Err()
		case <-h.node.closing:
			return status.Error(codes.Unavailable, "node is shutting down")
		}
	}
}

// isHealthMethod reports whether fullMethod belongs to grpc.health.v1.
func isHealthMethod(fullMethod string) bool {
	return strings.HasPrefix(fullMethod, "/"+healthpb.Health_ServiceDesc.ServiceName+"/")
}
