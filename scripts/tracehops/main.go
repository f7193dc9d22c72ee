// Command tracehops reads Go execution traces of geologd nodes (from
// /debug/pprof/trace, scripts/bench_hops.sh) and prints, per kind of
// goroutine, how long it waited to run once woken and how long each run
// lasted, and each node's fdatasync durations: where an append's hops
// between goroutines cost time, beside the disk.
//
//	go run . [-window from,span] trace1.out trace2.out ...
//
// A goroutine's kind is the innermost geolog or gRPC transport function
// of the first stack it is seen with (its loop: the range driver, the log
// writer, a Raft peer's sender, gRPC's loopy writer). With -window (ms
// from the trace's start) it prints that stretch's transitions instead,
// one a line: the timeline of a few appends.
package main

import (
	"flag"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/exp/trace"
)

func main() {
	window := flag.String("window", "", "print the transitions of this stretch, as from,span in ms from the trace's start")
	flag.Parse()
	for _, path := range flag.Args() {
		if err := analyse(path, *window); err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", path, err)
			os.Exit(1)
		}
	}
}

// kindOf names a goroutine by the innermost function of interest on its
// stack (stacks are innermost first, so the last match is the loop).
func kindOf(st trace.Stack) string {
	kind := ""
	for fr := range st.Frames() {
		fn := fr.Func
		if strings.Contains(fn, "geolog/") || strings.Contains(fn, "transport.(*loopyWriter)") || strings.Contains(fn, "transport.(*http2") {
			kind = fn[strings.LastIndex(fn, "/")+1:]
		}
	}
	return kind
}

func topOf(st trace.Stack) string {
	for fr := range st.Frames() {
		return fr.Func[strings.LastIndex(fr.Func, "/")+1:]
	}
	return ""
}

type series map[string][]time.Duration

func analyse(path, window string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	r, err := trace.NewReader(f)
	if err != nil {
		return err
	}
	from, span := -1.0, 0.0
	if window != "" {
		a, b, _ := strings.Cut(window, ",")
		from, _ = strconv.ParseFloat(a, 64)
		span, _ = strconv.ParseFloat(b, 64)
	}
	kind := map[trace.GoID]string{}
	runnableAt, runningAt, syncAt := map[trace.GoID]trace.Time{}, map[trace.GoID]trace.Time{}, map[trace.GoID]trace.Time{}
	wait, run, fsync := series{}, series{}, series{}
	var t0 trace.Time
	for {
		ev, err := r.ReadEvent()
		if err != nil {
			break
		}
		if t0 == 0 {
			t0 = ev.Time()
		}
		if ev.Kind() != trace.EventStateTransition {
			continue
		}
		st := ev.StateTransition()
		if st.Resource.Kind != trace.ResourceGoroutine {
			continue
		}
		id := st.Resource.Goroutine()
		if kind[id] == "" {
			kind[id] = kindOf(st.Stack)
		}
		a, b := st.Goroutine()
		now := ev.Time()
		if ms := float64(now-t0) / 1e6; from >= 0 && ms >= from && ms <= from+span {
			fmt.Printf("%10.3f P%-2d g%-6d %-9s -> %-9s %-45s %s\n", ms, ev.Proc(), id, a, b, kind[id], topOf(st.Stack))
		}
		switch b {
		case trace.GoRunnable:
			runnableAt[id] = now
		case trace.GoRunning:
			if t, ok := runnableAt[id]; ok && a == trace.GoRunnable {
				wait[kind[id]] = append(wait[kind[id]], now.Sub(t))
			}
			delete(runnableAt, id)
			runningAt[id] = now
		case trace.GoSyscall:
			if strings.Contains(topOf(st.Stack), "Fdatasync") {
				syncAt[id] = now
			}
		}
		if a == trace.GoRunning {
			if t, ok := runningAt[id]; ok {
				run[kind[id]] = append(run[kind[id]], now.Sub(t))
				delete(runningAt, id)
			}
		}
		if a == trace.GoSyscall {
			if t, ok := syncAt[id]; ok {
				fsync["fdatasync"] = append(fsync["fdatasync"], now.Sub(t))
				delete(syncAt, id)
			}
		}
	}
	if from >= 0 {
		return nil
	}
	fmt.Printf("== %s\n", path)
	fmt.Println("woken -> running (scheduling wait), by goroutine:")
	print(wait)
	fmt.Println("running spans, by goroutine:")
	print(run)
	print(fsync)
	return nil
}

func print(s series) {
	type row struct {
		kind          string
		n             int
		sum, p50, p90 time.Duration
	}
	var rows []row
	for k, ds := range s {
		sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
		var sum time.Duration
		for _, d := range ds {
			sum += d
		}
		rows = append(rows, row{k, len(ds), sum, ds[len(ds)/2], ds[len(ds)*9/10]})
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].sum > rows[j].sum })
	for _, x := range rows[:min(10, len(rows))] {
		name := x.kind
		if name == "" {
			name = "(other)"
		}
		fmt.Printf("  %7d  total %9v  mean %7v  p50 %7v  p90 %7v  %s\n", x.n, x.sum.Round(time.Microsecond),
			(x.sum / time.Duration(x.n)).Round(time.Microsecond), x.p50.Round(time.Microsecond), x.p90.Round(time.Microsecond), name)
	}
}
