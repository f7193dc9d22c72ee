package keyspace

import (
	"bufio"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// protoPath is the public API definition whose "Keys and ranges" comment
// gives reference vectors for clients in other languages.
const protoPath = "../proto/geolog/v1/log.proto"

var (
	// vectorHeadRE is the table's header: the range counts of its columns.
	vectorHeadRE = regexp.MustCompile(`^//\s+key\s+XXH64\s+range for N =((?:\s+\d+)+)\s*$`)
	// vectorRowRE is one row: a Go-quoted key, its hash, its ranges.
	vectorRowRE = regexp.MustCompile(`^//\s+("(?:[^"\\]|\\.)*")\s+(0x[0-9a-f]{16})((?:\s+\d+)+)\s*$`)
	// sliceRE is one hash slice: N, range, hash_start, hash_end.
	sliceRE = regexp.MustCompile(`^//\s+N=(\d+) range (\d+) \[(0x[0-9a-f]{16}), (0x[0-9a-f]{16})\]\s*$`)
)

// TestProtoReferenceVectors holds the reference vectors written in the
// public API's comment to this package, so that the contract a client in
// another language implements from cannot drift from the code.
func TestProtoReferenceVectors(t *testing.T) {
	f, err := os.Open(protoPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var counts []uint32
	rows, slices := 0, 0
	sc := bufio.NewScanner(f)
	for line := 1; sc.Scan(); line++ {
		text := sc.Text()
		if m := vectorHeadRE.FindStringSubmatch(text); m != nil {
			counts = parseUints32(t, line, m[1])
			continue
		}
		if m := vectorRowRE.FindStringSubmatch(text); m != nil && counts != nil {
			checkVectorRow(t, line, m[1], m[2], parseUints32(t, line, m[3]), counts)
			rows++
			continue
		}
		if m := sliceRE.FindStringSubmatch(text); m != nil {
			checkSlice(t, line, m[1:])
			slices++
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	// The comment must keep its examples: a reformatted table that this
	// test no longer recognises would otherwise pass unchecked.
	if len(counts) < 4 || rows < 8 || slices < 3 {
		t.Fatalf("%s: found %d range counts, %d key rows and %d slices; the reference vectors are missing or no longer parse", protoPath, len(counts), rows, slices)
	}
}

func checkVectorRow(t *testing.T, line int, quoted, hashHex string, ranges, counts []uint32) {
	t.Helper()
	key, err := strconv.Unquote(quoted)
	if err != nil {
		t.Fatalf("line %d: key %s: %v", line, quoted, err)
	}
	want, err := strconv.ParseUint(hashHex, 0, 64)
	if err != nil {
		t.Fatalf("line %d: %v", line, err)
	}
	if got := Hash([]byte(key)); got != want {
		t.Errorf("line %d: XXH64(%q) = %#016x, the API says %#016x", line, key, got, want)
	}
	if len(ranges) != len(counts) {
		t.Fatalf("line %d: %d ranges for %d range counts", line, len(ranges), len(counts))
	}
	for i, n := range counts {
		if got := RangeForKey([]byte(key), n); got != ranges[i] {
			t.Errorf("line %d: key %q with N=%d maps to range %d, the API says %d", line, key, n, got, ranges[i])
		}
	}
}

func checkSlice(t *testing.T, line int, m []string) {
	t.Helper()
	n, err1 := strconv.ParseUint(m[0], 10, 32)
	r, err2 := strconv.ParseUint(m[1], 10, 32)
	start, err3 := strconv.ParseUint(m[2], 0, 64)
	end, err4 := strconv.ParseUint(m[3], 0, 64)
	for _, err := range []error{err1, err2, err3, err4} {
		if err != nil {
			t.Fatalf("line %d: %v", line, err)
		}
	}
	if gs, ge := HashStart(uint32(r), uint32(n)), HashEnd(uint32(r), uint32(n)); gs != start || ge != end {
		t.Errorf("line %d: N=%d range %d owns [%#016x, %#016x], the API says [%#016x, %#016x]", line, n, r, gs, ge, start, end)
	}
}

func parseUints32(t *testing.T, line int, s string) []uint32 {
	t.Helper()
	var out []uint32
	for _, f := range strings.Fields(s) {
		v, err := strconv.ParseUint(f, 10, 32)
		if err != nil {
			t.Fatalf("line %d: %v", line, err)
		}
		out = append(out, uint32(v))
	}
	return out
}
