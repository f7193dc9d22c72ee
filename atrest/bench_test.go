package atrest

import (
	"fmt"
	"testing"

	"github.com/geolog/geolog/vfs"
)

// BenchmarkSealPerFrame compares one AES-GCM call per frame with one per
// write of many frames (what the segment store could do instead: seal a
// whole group-commit write), for 64 frames of 1 KiB, 4 KiB and 16 KiB.
//
//	go test -run XXX -bench SealPerFrame ./atrest/
func BenchmarkSealPerFrame(b *testing.B) {
	k := mustRing(b, vfs.NewMem(nil), "/keys", mustMemKEK(b))
	defer k.Close()
	const frames = 64
	for _, size := range []int{1 << 10, 4 << 10, 16 << 10} {
		frame := make([]byte, size)
		write := make([]byte, frames*size)
		dst := make([]byte, 0, frames*(size+Overhead))
		b.Run(fmt.Sprintf("frame=%dKiB/per-frame", size>>10), func(b *testing.B) {
			b.SetBytes(frames * int64(size))
			for b.Loop() {
				dst = dst[:0]
				for range frames {
					dst = k.Seal(dst, frame)
				}
			}
		})
		b.Run(fmt.Sprintf("frame=%dKiB/per-write", size>>10), func(b *testing.B) {
			b.SetBytes(frames * int64(size))
			for b.Loop() {
				dst = k.Seal(dst[:0], write)
			}
		})
		b.Run(fmt.Sprintf("frame=%dKiB/open-per-frame", size>>10), func(b *testing.B) {
			unit := k.Seal(nil, frame)
			buf := make([]byte, len(unit))
			b.SetBytes(frames * int64(size))
			for b.Loop() {
				for range frames {
					copy(buf, unit)
					if _, err := k.OpenInPlace(buf); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}

func mustMemKEK(b testing.TB) KEKProvider {
	kek, err := NewMemKEK("bench", make([]byte, 32))
	if err != nil {
		b.Fatal(err)
	}
	return kek
}
