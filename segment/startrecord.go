package segment

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"
)

// The start record: where the log starts as far as the store knows,
// written before retention (or an install) makes the first segment go, so
// that Open tells a segment deleted by retention from one lost any other
// way (an operator's rm, a restore that missed a file): the first present
// segment starting past the recorded start is data loss, reported as a
// *CorruptionError wrapping *MissingError, never taken for retention.
//
// The file holds two slots of startSlotBytes; a save writes the slot its
// sequence number picks, in place, and fdatasyncs it, so that a torn save
// leaves the other slot (the previous record) valid and a save needs no
// new space on a full disk. A slot is (sequence u64, start offset u64,
// magic u32, CRC-32C of the 20 bytes before u32), little-endian; the valid
// slot with the higher sequence is the record.
const (
	// StartFileName is the start record's file in a range's directory.
	StartFileName  = "_logstart"
	startSlotBytes = 24
	startMagic     = 0x54534c47 // "GLST"
)

// ErrDataLoss reports a log that lacks records it held: segments missing
// before the first present one (past the start that retention recorded)
// or between two present ones. Errors carrying it are *MissingError
// values, inside a *CorruptionError (errors.Is ErrCorrupt holds too).
var ErrDataLoss = errors.New("segment: records are missing from the log")

// MissingError names the offsets a log lacks: [FromOffset, ToOffset).
type MissingError struct {
	FromOffset, ToOffset uint64
	// Where says where they should be: "before the first segment" or
	// "between segments".
	Where string
}

func (e *MissingError) Error() string {
	if e.ToOffset <= e.FromOffset {
		return fmt.Sprintf("offsets from %d on are missing %s (retention did not delete them)", e.FromOffset, e.Where)
	}
	return fmt.Sprintf("offsets [%d, %d) are missing %s (their segment files are gone; retention did not delete them)",
		e.FromOffset, e.ToOffset, e.Where)
}

// Is makes errors.Is(err, ErrDataLoss) true.
func (e *MissingError) Is(target error) bool { return target == ErrDataLoss }

// startRecord is a decoded start record; ok is false when there is none.
type startRecord struct {
	seq, start uint64
	ok         bool
}

func encodeStartSlot(seq, start uint64) []byte {
	b := binary.LittleEndian.AppendUint64(make([]byte, 0, startSlotBytes), seq)
	b = binary.LittleEndian.AppendUint64(b, start)
	b = binary.LittleEndian.AppendUint32(b, startMagic)
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

func decodeStartSlot(b []byte) (seq, start uint64, ok bool) {
	if len(b) != startSlotBytes || binary.LittleEndian.Uint32(b[16:]) != startMagic ||
		binary.LittleEndian.Uint32(b[20:]) != crc32.Checksum(b[:20], castagnoli) {
		return 0, 0, false
	}
	return binary.LittleEndian.Uint64(b), binary.LittleEndian.Uint64(b[8:]), true
}

// decodeStartRecord decodes the file's content. A file of zeros (a crash
// during its creation, before its first fdatasync) is no record; a file
// with neither slot valid otherwise is corrupt.
func decodeStartRecord(b []byte) (startRecord, error) {
	if len(b) == 0 || bytes.Count(b, []byte{0}) == len(b) {
		return startRecord{}, nil
	}
	var rec startRecord
	for i := 0; i+startSlotBytes <= len(b) && i < 2*startSlotBytes; i += startSlotBytes {
		if seq, start, ok := decodeStartSlot(b[i : i+startSlotBytes]); ok && (!rec.ok || seq > rec.seq) {
			rec = startRecord{seq: seq, start: start, ok: true}
		}
	}
	if !rec.ok {
		return rec, &CorruptionError{Segment: StartFileName, Err: errors.New("start record has no valid slot")}
	}
	return rec, nil
}

// loadStartRecord reads the store's start record.
func (s *Store) loadStartRecord() (startRecord, error) {
	b, err := readSmallFile(s, filepath.Join(s.cfg.Dir, StartFileName), 2*startSlotBytes)
	if errors.Is(err, fs.ErrNotExist) {
		return startRecord{}, nil
	}
	if err != nil {
		return startRecord{}, fmt.Errorf("segment: read start record: %w", err)
	}
	return decodeStartRecord(b)
}

// readSmallFile reads name whole, refusing one larger than bytesMax.
func readSmallFile(s *Store, name string, bytesMax int64) ([]byte, error) {
	f, err := s.fs.OpenFile(name, os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	size, err := f.Size()
	if err != nil {
		return nil, err
	}
	if size > bytesMax {
		return nil, &CorruptionError{Segment: filepath.Base(name), Err: fmt.Errorf("file of %d bytes, at most %d expected", size, bytesMax)}
	}
	b := make([]byte, size)
	if err := readFull(f, b, 0); err != nil {
		return nil, err
	}
	return b, nil
}

// saveStartRecord records start as the log's start, durably, before the
// caller deletes what lies below it. The first save creates the file with
// both slots (so later saves write in place) and syncs the directory. A
// failed save changes nothing the store relies on: the previous record
// (a lower start) stays valid, and a start lower than the first segment is
// no loss. The caller holds wmu (or is Open).
func (s *Store) saveStartRecord(start uint64) error {
	if s.startRec.ok && s.startRec.start == start {
		return nil
	}
	name := filepath.Join(s.cfg.Dir, StartFileName)
	seq := s.startRec.seq + 1
	f, err := s.fs.OpenFile(name, os.O_RDWR, 0)
	created := false
	if errors.Is(err, fs.ErrNotExist) {
		f, err = s.fs.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
		created = true
	}
	if err != nil {
		return fmt.Errorf("segment: save start record: %w", err)
	}
	defer f.Close()
	var data []byte
	var at int64
	if created {
		data = append(encodeStartSlot(seq, start), make([]byte, startSlotBytes)...)
		if seq%2 == 1 {
			data = append(make([]byte, startSlotBytes), encodeStartSlot(seq, start)...)
		}
	} else {
		data, at = encodeStartSlot(seq, start), int64(seq%2)*startSlotBytes
	}
	if _, err := f.WriteAt(data, at); err != nil {
		return fmt.Errorf("segment: save start record: %w", err)
	}
	if err := f.Datasync(); err != nil {
		return fmt.Errorf("segment: save start record: %w", err)
	}
	if created {
		if err := s.fs.SyncDir(s.cfg.Dir); err != nil {
			return fmt.Errorf("segment: save start record: %w", err)
		}
	}
	s.startRec = startRecord{seq: seq, start: start, ok: true}
	return nil
}

// checkStart reports the data loss that the present segments (bases,
// sorted) show against the start record: a first segment past the
// recorded start, or no segment at all where a record says the log
// existed.
func checkStart(rec startRecord, bases []uint64) error {
	if !rec.ok {
		return nil
	}
	if len(bases) == 0 {
		return &CorruptionError{Segment: StartFileName, Offset: rec.start,
			Err: &MissingError{FromOffset: rec.start, ToOffset: rec.start, Where: "(every segment file is gone)"}}
	}
	if bases[0] > rec.start {
		return &CorruptionError{Segment: segmentName(bases[0], logSuffix), Offset: rec.start,
			Err: &MissingError{FromOffset: rec.start, ToOffset: bases[0], Where: "before the first segment"}}
	}
	return nil
}
