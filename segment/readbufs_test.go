package segment

import (
	"runtime"
	"runtime/debug"
	"testing"
)

// TestReadBuffersNotKeptPerStore: a store that has read from disk (seeks
// past index entries, as the Raft log's term lookups do after a restart)
// keeps no read buffer of its own. Many idle stores that each read once
// must not hold a buffer each (notes/restartmem.md: 3,000 restarted
// ranges held ~190 MB of them after a collection).
func TestReadBuffersNotKeptPerStore(t *testing.T) {
	const n = 64
	// Collections only where the test runs them: a pooled buffer lives
	// until the second collection after its last use, and an idle node
	// (GOGC 400, a large heap) collects seldom.
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	before := liveHeap()
	stores := make([]*Store, n)
	models := make([]*model, n)
	for i := range stores {
		stores[i] = mustOpen(t, smallConfig(t, osEnv(t)))
		models[i] = &model{}
		appendBatches(t, stores[i], models[i], 30, 1)
	}
	defer func() {
		for _, s := range stores {
			s.Close()
		}
	}()
	for i, s := range stores {
		m := models[i]
		for off := m.heads[0].BaseOffset; off < m.next(); off++ {
			if _, err := s.ReadFrames(off, 0, m.next()); err != nil {
				t.Fatalf("ReadFrames(%d): %v", off, err)
			}
		}
	}
	after := liveHeap()
	runtime.KeepAlive(stores)
	// A buffer per store would be readChunkBytes (64 KiB) each; the
	// shared pool keeps a few in all.
	if per := (after - before) / n; per > readChunkBytes/2 {
		t.Fatalf("%d stores that read hold %d bytes of live heap each, want under %d (no read buffer kept per store)",
			n, per, readChunkBytes/2)
	}
}

// liveHeap is the heap in use after a collection.
func liveHeap() int64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}
