package wan

import (
	"sync"
	"time"
)

// blockBytes is the size of the buffers a direction reads into. A read
// takes at most the free tail of one block, so it is also the largest read.
const blockBytes = 64 << 10

// mergeWindow: consecutive reads whose due times fall within mergeWindow of
// the first one share one mark, so a direction holds at most about
// (latency + jitter) / mergeWindow marks whatever the read rate, and bytes
// are released late by less than mergeWindow (never early).
const mergeWindow = time.Millisecond

// takeBytesMax bounds the bytes handed to one write, so that a burst's first
// blocks are freed for the reader before the whole burst is written.
const takeBytesMax = 2 << 20

type block [blockBytes]byte

// blockPool recycles blocks across connections and links.
var blockPool = sync.Pool{New: func() any { return new(block) }}

// mark says that the bytes of the stream before position end are due at
// due.
type mark struct {
	end      int64
	firstDue time.Time
	due      time.Time
}

// delayQueue is one direction of one connection: the bytes read from the
// source and not yet written to the destination, and when each may be
// written. It is the package's deterministic core: no goroutines, no clock
// (the caller passes now), no locks (the driver holds one around every
// call).
//
// The reader fills the free tail of the last block (space), outside the
// driver's lock, then publishes what it read (push). The writer asks for the
// due bytes (take), writes them outside the lock, then frees them
// (release). Between take and release the taken slices stay valid: blocks
// are freed only by release and by free.
type delayQueue struct {
	blocks   []*block // blocks[0] holds the oldest unreleased byte
	headOff  int      // offset of the oldest unreleased byte in blocks[0]
	tailLen  int      // bytes pushed into the last block
	marks    []mark   // pending marks, oldest first, from marksHead
	marksOff int
	pushed   int64 // bytes pushed since the start
	released int64 // bytes released since the start
	lastDue  time.Time

	ended  bool      // finish was called: nothing follows pushed
	endErr error     // nil for EOF
	endDue time.Time // when the end is due
}

// space returns the free tail of the last block, adding a block when the
// last one is full. The caller reads into it and pushes what it read.
func (q *delayQueue) space() []byte {
	if len(q.blocks) == 0 || q.tailLen == blockBytes {
		q.blocks = append(q.blocks, blockPool.Get().(*block))
		q.tailLen = 0
	}
	return q.blocks[len(q.blocks)-1][q.tailLen:]
}

// push publishes n bytes read into the last space; they are due at due or
// at the last push's due time, whichever is later, so that bytes never
// overtake earlier ones. It returns the due time used.
func (q *delayQueue) push(n int, due time.Time) time.Time {
	if n <= 0 || q.ended || len(q.blocks) == 0 || n > blockBytes-q.tailLen {
		panic("wan: push without space, after the end, or beyond the space")
	}
	if due.Before(q.lastDue) {
		due = q.lastDue
	}
	q.lastDue = due
	q.tailLen += n
	q.pushed += int64(n)
	if last := len(q.marks) - 1; last >= q.marksOff && due.Sub(q.marks[last].firstDue) < mergeWindow {
		q.marks[last].end = q.pushed
		q.marks[last].due = due
		return due
	}
	// Reuse the marks slice: drop released marks once they are half of it,
	// so that a steady stream neither grows nor often copies it.
	if q.marksOff > 0 && (q.marksOff == len(q.marks) || q.marksOff >= 64 && 2*q.marksOff >= len(q.marks)) {
		k := copy(q.marks, q.marks[q.marksOff:])
		q.marks, q.marksOff = q.marks[:k], 0
	}
	q.marks = append(q.marks, mark{end: q.pushed, firstDue: due, due: due})
	return due
}

// finish records the end of the stream (err nil for EOF), due no earlier
// than the last bytes.
func (q *delayQueue) finish(err error, due time.Time) {
	if q.ended {
		return
	}
	if due.Before(q.lastDue) {
		due = q.lastDue
	}
	q.ended, q.endErr, q.endDue = true, err, due
}

// take returns the unreleased bytes due at now, at most takeBytesMax of
// them, as slices of blocks (valid until the matching release). With none
// due it returns when the next bytes, or the end, are due (zero when
// nothing is pending). end is true once the stream's end is due and every
// byte is released.
func (q *delayQueue) take(now time.Time) (bufs [][]byte, next time.Time, end bool) {
	dueEnd := q.released
	for i := q.marksOff; i < len(q.marks); i++ {
		if q.marks[i].due.After(now) {
			next = q.marks[i].due
			break
		}
		dueEnd = q.marks[i].end
	}
	if dueEnd > q.released+takeBytesMax {
		dueEnd = q.released + takeBytesMax
	}
	if want := dueEnd - q.released; want > 0 {
		off := q.headOff
		for _, b := range q.blocks {
			stop := blockBytes
			if b == q.blocks[len(q.blocks)-1] {
				stop = q.tailLen
			}
			chunk := int64(stop - off)
			if chunk > want {
				chunk = want
			}
			bufs = append(bufs, b[off:off+int(chunk)])
			want -= chunk
			off = 0
			if want == 0 {
				break
			}
		}
		return bufs, next, false
	}
	if q.ended && q.released == q.pushed {
		if !q.endDue.After(now) {
			return nil, time.Time{}, true
		}
		if next.IsZero() {
			next = q.endDue
		}
	}
	return nil, next, false
}

// release frees n taken bytes, oldest first.
func (q *delayQueue) release(n int) {
	if n < 0 || int64(n) > q.pushed-q.released {
		panic("wan: release of more bytes than are queued")
	}
	q.released += int64(n)
	for q.marksOff < len(q.marks) && q.marks[q.marksOff].end <= q.released {
		q.marksOff++
	}
	q.headOff += n
	// Free fully released blocks, but never the last one: the reader may be
	// reading into its free tail.
	for len(q.blocks) > 1 && q.headOff >= blockBytes {
		blockPool.Put(q.blocks[0])
		q.blocks[0] = nil
		q.blocks = q.blocks[1:]
		q.headOff -= blockBytes
	}
}

// queuedBytes returns the bytes pushed and not yet released.
func (q *delayQueue) queuedBytes() int64 { return q.pushed - q.released }

// free returns every block to the pool. Only once neither the reader nor
// the writer will touch the queue again.
func (q *delayQueue) free() {
	for i, b := range q.blocks {
		blockPool.Put(b)
		q.blocks[i] = nil
	}
	q.blocks = nil
	q.headOff, q.tailLen = 0, 0
}
