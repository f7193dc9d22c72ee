// Package console is geologd's web console: a read-only page, served by
// the node on its HTTP address under /console/, that shows the cluster's
// regions and nodes, its streams and their ranges (home, epoch, leader,
// tail, each region's applied offset and lag), the consumer groups of
// each stream and their lag, the orphan logs left by failovers, and a
// live chart of throughput and replication lag (docs/console.md).
//
// The page (static/, embedded) is plain HTML, CSS and a small script with
// no library and no build step; it polls /console/api/overview once a
// second and draws the chart itself (SVG). Everything works offline.
//
// Where the data comes from. The console is a client of the cluster, not
// a part of the node's state: it asks the nodes through the public API,
// with the Go SDK (DescribeStream, ListStreams, ListGroups, DescribeGroup)
// and the Admin service's ListOrphans, as `geolog ranges`, `geolog groups`
// and `geolog orphans list` do. A node reports a range's replication only
// when it leads the range, so the console asks every node it is given
// (Config.Nodes: its own region's peers and the other regions' nodes) and
// merges their answers (merge.go), knowing which region each answer comes
// from. Going through the API rather than regionsvc's internals keeps the
// console's view the one every client gets, costs nothing in the node's
// code, and lets the console run against any node.
//
// The driver contract:
//
//  1. One collector builds a snapshot of the whole cluster, at most once
//     per Config.RefreshInterval however many viewers poll (concurrent
//     requests wait for the one collection in progress); orphan logs,
//     whose listing fans out to every node, at most once per
//     Config.OrphansRefreshInterval.
//  2. The snapshot is built with the node's own credentials and holds
//     everything; each viewer is then shown only what the policy grants
//     their principal (Config.Allows): a stream and its ranges with
//     describe on it, a group's positions and lag with the group
//     permission on it too, a stream's orphan logs with admin on it.
//     The console never forwards a call on a viewer's behalf and never
//     calls a method that changes anything: it is read-only whatever the
//     viewer may do elsewhere.
//  3. With TLS on, the viewer is the principal of the client certificate
//     the HTTP listener verified (r.TLS); a request without one is
//     refused with 401. With TLS off there is no identity and no policy:
//     everything is shown, as the gRPC side serves everything.
//  4. Every figure is bounded: at most StreamsMax streams, GroupsMax
//     groups a stream, and each call under CallTimeout.
package console
