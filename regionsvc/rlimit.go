package regionsvc

import (
	"syscall"
)

// RaiseFileLimit raises the process's soft RLIMIT_NOFILE to its hard limit
// (geologd does at start: a node holds a file per segment and a descriptor
// per connection) and returns the soft limit now in force.
func RaiseFileLimit() (uint64, error) {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return 0, err
	}
	if r.Cur < r.Max {
		r.Cur = r.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
			return 0, err
		}
	}
	return r.Cur, nil
}

// fileLimit is the soft RLIMIT_NOFILE, or 4096 if it cannot be read.
func fileLimit() int {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil || r.Cur == 0 {
		return 4096
	}
	return int(min(r.Cur, 1<<30))
}
