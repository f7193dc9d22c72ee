// Command cursorframes prints how many records and data frames a node's
// copy of the _cursors stream holds: scripts/bench_groups.sh runs it
// before and after the cursor commits to tell the positions per append
// (one data frame is one append of a coordinator). A frame still being
// written ends the count of its segment.
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/geolog/geolog/batch"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: cursorframes DATA_DIR")
		os.Exit(2)
	}
	files, err := filepath.Glob(filepath.Join(os.Args[1], "streams", "_cursors", "*", "*.log"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	var frames, records int
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		for len(b) > 0 {
			n, err := batch.FrameSize(b)
			if err != nil || n <= 0 || n > len(b) {
				break
			}
			h, recs, err := batch.Decode(b[:n])
			b = b[n:]
			if err == nil && h.Type == batch.TypeData {
				frames++
				records += len(recs)
			}
		}
	}
	fmt.Println(records, frames)
}
