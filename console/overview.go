package console

// The JSON the page polls (GET /console/api/overview). Figures a node did
// not report are absent (Known false), never guessed.

// Overview is the cluster as one viewer may see it.
type Overview struct {
	TimeUnixMs int64  `json:"time_unix_ms"`
	Region     string `json:"region"`
	// Node is the gRPC address of the node serving the console.
	Node string `json:"node"`
	// Viewer is the viewer's principal ("" with TLS off).
	Viewer  string   `json:"viewer"`
	Regions []Region `json:"regions"`
	Streams []Stream `json:"streams"`
	// StreamsLeftOut counts the streams past Config.StreamsMax.
	StreamsLeftOut int `json:"streams_left_out,omitempty"`
	// LagByRegion sums, over the streams shown, each mirror region's
	// offset lag (records behind the home's tail).
	LagByRegion map[string]uint64 `json:"lag_by_region"`
	// Errors are what went wrong collecting this snapshot.
	Errors []string `json:"errors,omitempty"`
}

// Region is one region and its nodes.
type Region struct {
	Name  string `json:"name"`
	Nodes []Node `json:"nodes"`
}

// Node is one node as the console reached it.
type Node struct {
	Addr string `json:"addr"`
	// Up says the node answered the last DescribeStream calls; Error is
	// the last failure otherwise.
	Up    bool   `json:"up"`
	Error string `json:"error,omitempty"`
}

// Stream is one stream and its ranges.
type Stream struct {
	Name       string   `json:"name"`
	Regions    []string `json:"regions"`
	RangeCount uint32   `json:"range_count"`
	// Error is why the stream could not be described, if it could not.
	Error  string  `json:"error,omitempty"`
	Ranges []Range `json:"ranges"`
	// RangesLeftOut counts the ranges past Config.RangesMax.
	RangesLeftOut uint32   `json:"ranges_left_out,omitempty"`
	Groups        []Group  `json:"groups"`
	Orphans       *Orphans `json:"orphans"`
}

// Range is one range merged from every node's report.
type Range struct {
	Range uint32 `json:"range"`
	Home  string `json:"home"`
	// Known says the home region answered: Epoch, Tail and Leader are
	// its.
	Known  bool   `json:"known"`
	Epoch  uint64 `json:"epoch"`
	Tail   uint64 `json:"tail"`
	Leader string `json:"leader"`
	Status string `json:"status,omitempty"`
	// Regions holds each region's copy: the home's applied end is the tail.
	Regions map[string]RegionCopy `json:"regions"`
}

// RegionCopy is one region's copy of a range.
type RegionCopy struct {
	Home  bool `json:"home,omitempty"`
	Known bool `json:"known"`
	// AppliedEnd is the offset the copy has applied up to (exclusive).
	AppliedEnd uint64 `json:"applied_end"`
	OffsetLag  uint64 `json:"offset_lag"`
	TimeLagMs  int64  `json:"time_lag_ms"`
	State      string `json:"state,omitempty"`
	LastError  string `json:"last_error,omitempty"`
}

// Group is one consumer group of a stream.
type Group struct {
	Group   string `json:"group"`
	State   string `json:"state"`
	Members int    `json:"members"`
	// LagRecords sums the ranges' lag; Ranges has each range's position.
	LagRecords uint64     `json:"lag_records"`
	Ranges     []GroupLag `json:"ranges,omitempty"`
	// Error is why the group could not be described.
	Error string `json:"error,omitempty"`
	// Hidden says why the positions are not shown to this viewer.
	Hidden string `json:"hidden,omitempty"`
}

// GroupLag is a group's position in one range.
type GroupLag struct {
	Range       uint32 `json:"range"`
	HasPosition bool   `json:"has_position"`
	Committed   uint64 `json:"committed"`
	Tail        uint64 `json:"tail"`
	LagRecords  uint64 `json:"lag_records"`
	LagMs       int64  `json:"lag_ms"`
	Owner       string `json:"owner,omitempty"`
}

// Orphans are a stream's orphan logs, cluster-wide.
type Orphans struct {
	Forks []Fork `json:"forks"`
	// Unanswered names the nodes that did not answer (forks only they
	// hold are missing).
	Unanswered []string `json:"unanswered,omitempty"`
	// AgeMs is how old the listing is (it is refreshed less often).
	AgeMs int64  `json:"age_ms"`
	Error string `json:"error,omitempty"`
	// Hidden says why this viewer is not shown them.
	Hidden string `json:"hidden,omitempty"`
}

// Fork is one orphan log: the records a region acked past the offset
// where a failover forked the range.
type Fork struct {
	Region     string `json:"region"`
	Range      uint32 `json:"range"`
	ForkIndex  uint64 `json:"fork_index"`
	ForkOffset uint64 `json:"fork_offset"`
	Epoch      uint64 `json:"epoch"`
	Records    uint64 `json:"records"`
	Bytes      uint64 `json:"bytes"`
	Node       string `json:"node"`
}
