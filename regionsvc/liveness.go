package regionsvc

// appendRefusal is the error an append gets from a range that failed
// (failure f): for a Raft member whose replica stopped while other
// replicas go on (replica.StoppedAppendError: a failed fsync hands the
// range to them), a retriable NOT_LEADER naming the leader's client
// address when known, so that producers move there; otherwise f.
func (d *rangeDriver) appendRefusal(f error) error {
	if d.rep == nil || d.rep.Failure() == nil {
		return f
	}
	return d.hintAddress(d.rep.StoppedAppendError())
}
