// Package rangecore holds the range driver's decisions as deterministic,
// synchronous cores: what a range's copy may serve (the timeline fence,
// Timeline) and when a new home's leader may append at its epoch (the
// epoch start gate, StartGate, and the node's comparison with the lease
// store's record, CheckStart). They take inputs (the role the lease store
// gives, the log's epoch, the replica's leadership, answers of ReadIndex
// and of the lease store) and return what to do next; they read no clock,
// start no goroutine and send nothing.
//
// regionsvc's range driver (regionsvc/replicated.go, timeline.go,
// epochstart.go) drives them on its goroutine with the real replica,
// transport and lease store; the simulator (package sim) drives the same
// cores on its virtual network, disks and clock, so that what it checks is
// the product's logic, not a restatement of it. Driver is the driver
// loop's body: the Ready cycles and the acks they hold, quiescence, the
// campaign after a leader found down, the start-up election, a full
// disk's hand-off and leader balance (balance.go), taking
// events and returning effects; regionsvc's loop only selects on its
// channels and feeds it, and the simulator feeds it from its event heap
// (notes/simdriver2.md).
package rangecore
