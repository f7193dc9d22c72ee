package vfs

import (
	"io"
	"io/fs"
	"maps"
	"math/rand/v2"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

const (
	// PageBytes is the unit in which Mem's crashes keep or lose unsynced
	// writes: each page-aligned PageBytes of a file survives in one of the
	// versions it went through since the last Datasync.
	PageBytes = 4096

	// pendingOpsMax bounds the unsynced writes Mem remembers per file, and
	// the unsynced entry changes per directory. Past it, the oldest half
	// is written back (made durable), as a kernel flushes dirty pages on
	// its own: a legitimate outcome, and it keeps memory bounded under
	// code that never syncs.
	pendingOpsMax = 1024
)

// Op names an operation, for Mem's hook.
type Op uint8

// The operations a hook sees. File operations carry the file's name.
const (
	OpOpen Op = iota
	OpRead
	OpWrite
	OpTruncate
	OpDatasync
	OpRemove
	OpRename
	OpReadDir
	OpStat
	OpMkdir
	OpSyncDir
	OpLock
)

var opNames = [...]string{"open", "read", "write", "truncate", "datasync", "remove", "rename", "readdir", "stat", "mkdir", "syncdir", "lock"}

// String returns the operation's lowercase name.
func (o Op) String() string {
	if int(o) < len(opNames) {
		return opNames[o]
	}
	return "op(" + strconv.Itoa(int(o)) + ")"
}

// Mem is the in-memory twin of OS for tests and the simulator. It models
// durability honestly: per file it keeps the durable content and the writes
// made since the last Datasync, and per directory the durable entries and
// the changes made since the last SyncDir. Crash returns what a power loss
// would leave. Mem is safe for concurrent use and, given the seed of its
// rand and the same sequence of calls, deterministic.
type Mem struct {
	mu            sync.Mutex
	rng           *rand.Rand
	root          *memNode
	locked        map[string]bool
	syncFailures  int
	writeFailures int
	hook          func(op Op, name string) error
	// spaceBytes bounds the bytes of file data (0: no bound); see
	// SetSpaceBytes.
	spaceBytes int64
	// boot counts the crashes this Mem descends from (BootID).
	boot uint64
}

// NewMem returns an empty in-memory file system (just the root directory,
// durable). rng decides every fault and every crash outcome; Mem owns it
// from now on.
func NewMem(rng *rand.Rand) *Mem {
	return &Mem{rng: rng, root: newDirNode(), locked: map[string]bool{}}
}

// BootID names the boot: a Crash's result is a new one.
func (m *Mem) BootID() string { return "mem-boot-" + strconv.FormatUint(m.boot, 10) }

// SetHook installs fn (nil removes it), called before every operation,
// outside Mem's lock, with the operation and the path it concerns. A
// non-nil error fails the operation, which then changes nothing. Use it to
// add latency (sleep, or block on a simulated clock) or to inject errors.
func (m *Mem) SetHook(fn func(op Op, name string) error) {
	m.mu.Lock()
	m.hook = fn
	m.mu.Unlock()
}

// FailDatasyncs makes the next n Datasync calls fail with EIO. Like Linux
// after a write-back error, a failed Datasync decides at once (by the seed)
// which of the writes it covered reached the disk; reads keep seeing all
// of them, and no later Datasync makes the lost ones durable.
func (m *Mem) FailDatasyncs(n int) {
	m.mu.Lock()
	m.syncFailures = n
	m.mu.Unlock()
}

// FailWrites makes the next n WriteAt or Truncate calls fail with EIO. A
// failed WriteAt may have written a prefix of its data (by the seed) and
// reports how much; a failed Truncate changes nothing.
func (m *Mem) FailWrites(n int) {
	m.mu.Lock()
	m.writeFailures = n
	m.mu.Unlock()
}

// SetSpaceBytes bounds the file data the Mem holds to n bytes (0 removes
// the bound), a device that fills up: a WriteAt that would take the data
// of all files in the tree past n writes the part that fits and fails
// with ENOSPC, and creating a file fails with ENOSPC while no byte is
// free. Shrinking or removing files frees space at once. (Files removed
// while open stop counting when removed, unlike on a real disk.)
func (m *Mem) SetSpaceBytes(n int64) {
	m.mu.Lock()
	m.spaceBytes = max(n, 0)
	m.mu.Unlock()
}

// UsedBytes returns the bytes of file data in the tree.
func (m *Mem) UsedBytes() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.usedLocked()
}

func (m *Mem) usedLocked() int64 {
	var used int64
	var walk func(n *memNode)
	walk = func(n *memNode) {
		if !n.isDir {
			used += int64(len(n.data))
			return
		}
		for _, c := range n.live {
			walk(c)
		}
	}
	walk(m.root)
	return used
}

// freeLocked returns the bytes a write may still add, or -1 without a
// bound.
func (m *Mem) freeLocked() int64 {
	if m.spaceBytes == 0 {
		return -1
	}
	return max(m.spaceBytes-m.usedLocked(), 0)
}

// Crash returns a new Mem holding what a power loss right now would leave
// on disk, drawn from the seed:
//
//   - per file, everything written before its last successful Datasync;
//     of the writes and truncations since, none, all, an in-order prefix,
//     or page by page (PageBytes) any version each page went through, in
//     any combination, with the size of any of those versions (bytes past
//     the written ones read as zero);
//   - per directory, the entries as of its last SyncDir plus a prefix
//     (possibly empty or complete) of the creates, removes and renames
//     since; a rename within one directory is all or nothing.
//
// No locks are held in the result and its files are closed. m itself is
// unchanged and keeps working; open files still refer to m.
func (m *Mem) Crash() *Mem {
	m.mu.Lock()
	defer m.mu.Unlock()
	c := NewMem(rand.New(rand.NewPCG(m.rng.Uint64(), m.rng.Uint64())))
	c.root = m.crashDir(m.root, map[*memNode]*memNode{}, map[*memNode]bool{})
	c.boot = m.boot + 1
	return c
}

// memNode is a file or a directory.
type memNode struct {
	isDir bool

	// Directory: live entries (what lookups see), durable entries, and the
	// changes since the last SyncDir, oldest first.
	live    map[string]*memNode
	durable map[string]*memNode
	dirOps  []dirOp

	// File: live content, durable content, and the writes since the last
	// Datasync, oldest first.
	data   []byte
	synced []byte
	ops    []fileOp
}

func newDirNode() *memNode {
	return &memNode{isDir: true, live: map[string]*memNode{}, durable: map[string]*memNode{}}
}

// dirChange sets name to node in a directory, or removes it if node is nil.
type dirChange struct {
	name string
	node *memNode
}

// dirOp is one atomic change of a directory's entries.
type dirOp []dirChange

func (op dirOp) apply(entries map[string]*memNode) {
	for _, c := range op {
		if c.node == nil {
			delete(entries, c.name)
		} else {
			entries[c.name] = c.node
		}
	}
}

// fileOp is one unsynced change of a file: a write of data at off, or (if
// truncate) a truncation to size.
type fileOp struct {
	truncate bool
	off      int64
	data     []byte
	size     int64
}

// sizeAfter returns the file size after op, given the size before.
func (op fileOp) sizeAfter(size int64) int64 {
	if op.truncate {
		return op.size
	}
	return max(size, op.off+int64(len(op.data)))
}

// apply applies op to b and returns the result.
func (op fileOp) apply(b []byte) []byte {
	if op.truncate {
		return resize(b, op.size)
	}
	end := op.off + int64(len(op.data))
	if end > int64(len(b)) {
		b = resize(b, end)
	}
	copy(b[op.off:], op.data)
	return b
}

// applyToPage applies op to page, the file bytes from start on.
func (op fileOp) applyToPage(page []byte, start int64) {
	end := start + int64(len(page))
	if op.truncate {
		if op.size < end {
			clear(page[max(0, op.size-start):])
		}
		return
	}
	lo, hi := max(op.off, start), min(op.off+int64(len(op.data)), end)
	if lo < hi {
		copy(page[lo-start:hi-start], op.data[lo-op.off:hi-op.off])
	}
}

// resize returns b with length n; bytes it exposes are zero.
func resize(b []byte, n int64) []byte {
	switch {
	case n <= int64(len(b)):
		return b[:n]
	case n <= int64(cap(b)):
		old := len(b)
		b = b[:n]
		clear(b[old:])
		return b
	default:
		nb := make([]byte, n, max(n, 2*int64(cap(b))))
		copy(nb, b)
		return nb
	}
}

func applyOps(b []byte, ops []fileOp) []byte {
	for _, op := range ops {
		b = op.apply(b)
	}
	return b
}

// pickPrefix draws how many of n pending changes a crash keeps.
func (m *Mem) pickPrefix(n int) int {
	if n == 0 {
		return 0
	}
	switch m.rng.IntN(3) {
	case 0:
		return 0
	case 1:
		return n
	default:
		return m.rng.IntN(n + 1)
	}
}

// crashContent draws what survives of a file with durable content synced
// and unsynced ops (see Crash).
func (m *Mem) crashContent(synced []byte, ops []fileOp) []byte {
	base := slices.Clone(synced)
	if len(ops) == 0 {
		return base
	}
	switch m.rng.IntN(4) {
	case 0:
		return base
	case 1:
		return applyOps(base, ops)
	case 2:
		return applyOps(base, ops[:m.rng.IntN(len(ops)+1)])
	}
	sizes := make([]int64, len(ops)+1)
	sizes[0] = int64(len(synced))
	for i, op := range ops {
		sizes[i+1] = op.sizeAfter(sizes[i])
	}
	size := sizes[m.rng.IntN(len(sizes))]
	out := make([]byte, size)
	for start := int64(0); start < size; start += PageBytes {
		page := out[start:min(start+PageBytes, size)]
		if start < int64(len(synced)) {
			copy(page, synced[start:])
		}
		for _, op := range ops[:m.rng.IntN(len(ops)+1)] {
			op.applyToPage(page, start)
		}
	}
	return out
}

// crashDir builds the directory d leaves after a crash. files maps each
// crashed file to its result, so that a file reachable twice (a rename
// across directories half done) is crashed once.
func (m *Mem) crashDir(d *memNode, files map[*memNode]*memNode, dirs map[*memNode]bool) *memNode {
	entries := maps.Clone(d.durable)
	for _, op := range d.dirOps[:m.pickPrefix(len(d.dirOps))] {
		op.apply(entries)
	}
	out := newDirNode()
	for _, name := range slices.Sorted(maps.Keys(entries)) {
		n := entries[name]
		var c *memNode
		switch {
		case n.isDir && dirs[n]:
			continue // a directory lives in one place
		case n.isDir:
			dirs[n] = true
			c = m.crashDir(n, files, dirs)
		default:
			if c = files[n]; c == nil {
				data := m.crashContent(n.synced, n.ops)
				c = &memNode{data: data, synced: slices.Clone(data)}
				files[n] = c
			}
		}
		out.live[name], out.durable[name] = c, c
	}
	return out
}

// cleanPath makes name an absolute slash path.
func cleanPath(name string) string { return path.Clean("/" + filepath.ToSlash(name)) }

func pathErr(op, name string, err error) error { return &fs.PathError{Op: op, Path: name, Err: err} }

// before runs the hook for op on name.
func (m *Mem) before(op Op, name string) error {
	m.mu.Lock()
	h := m.hook
	m.mu.Unlock()
	if h == nil {
		return nil
	}
	if err := h(op, name); err != nil {
		return pathErr(op.String(), name, err)
	}
	return nil
}

// lookupLocked returns the node at the clean path p.
func (m *Mem) lookupLocked(p string) (*memNode, error) {
	n := m.root
	if p == "/" {
		return n, nil
	}
	for _, part := range strings.Split(p[1:], "/") {
		if !n.isDir {
			return nil, syscall.ENOTDIR
		}
		if n = n.live[part]; n == nil {
			return nil, fs.ErrNotExist
		}
	}
	return n, nil
}

// parentLocked returns the directory holding the clean path p and p's base
// name.
func (m *Mem) parentLocked(p string) (*memNode, string, error) {
	if p == "/" {
		return nil, "", syscall.EINVAL
	}
	dir, err := m.lookupLocked(path.Dir(p))
	if err != nil {
		return nil, "", err
	}
	if !dir.isDir {
		return nil, "", syscall.ENOTDIR
	}
	return dir, path.Base(p), nil
}

// changeLocked records an entry change of dir.
func changeLocked(dir *memNode, op dirOp) {
	op.apply(dir.live)
	dir.dirOps = append(dir.dirOps, op)
	if len(dir.dirOps) > pendingOpsMax {
		half := len(dir.dirOps) / 2
		for _, o := range dir.dirOps[:half] {
			o.apply(dir.durable)
		}
		dir.dirOps = slices.Clone(dir.dirOps[half:])
	}
}

// OpenFile implements FS.
func (m *Mem) OpenFile(name string, flag int, perm os.FileMode) (File, error) {
	if err := m.before(OpOpen, name); err != nil {
		return nil, err
	}
	const supported = os.O_RDONLY | os.O_WRONLY | os.O_RDWR | os.O_CREATE | os.O_EXCL | os.O_TRUNC
	if flag&^supported != 0 {
		return nil, pathErr("open", name, syscall.EINVAL)
	}
	f := &memFile{fs: m, name: name}
	switch flag & (os.O_RDONLY | os.O_WRONLY | os.O_RDWR) {
	case os.O_RDONLY:
		f.read = true
	case os.O_WRONLY:
		f.write = true
	case os.O_RDWR:
		f.read, f.write = true, true
	default:
		return nil, pathErr("open", name, syscall.EINVAL)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	dir, base, err := m.parentLocked(cleanPath(name))
	if err != nil {
		return nil, pathErr("open", name, err)
	}
	n := dir.live[base]
	switch {
	case n != nil && flag&(os.O_CREATE|os.O_EXCL) == os.O_CREATE|os.O_EXCL:
		return nil, pathErr("open", name, fs.ErrExist)
	case n != nil && n.isDir:
		return nil, pathErr("open", name, syscall.EISDIR)
	case n == nil && flag&os.O_CREATE == 0:
		return nil, pathErr("open", name, fs.ErrNotExist)
	case n == nil && m.freeLocked() == 0:
		return nil, pathErr("open", name, syscall.ENOSPC)
	case n == nil:
		n = &memNode{}
		changeLocked(dir, dirOp{{base, n}})
	}
	f.node = n
	if flag&os.O_TRUNC != 0 && f.write {
		m.changeFileLocked(n, fileOp{truncate: true})
	}
	return f, nil
}

// changeFileLocked applies op to n's live content and remembers it as
// unsynced.
func (m *Mem) changeFileLocked(n *memNode, op fileOp) {
	n.data = op.apply(n.data)
	if !op.truncate {
		op.data = slices.Clone(op.data)
	}
	n.ops = append(n.ops, op)
	if len(n.ops) > pendingOpsMax {
		half := len(n.ops) / 2
		n.synced = applyOps(n.synced, n.ops[:half])
		n.ops = slices.Clone(n.ops[half:])
	}
}

// Remove implements FS.
func (m *Mem) Remove(name string) error {
	if err := m.before(OpRemove, name); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	dir, base, err := m.parentLocked(cleanPath(name))
	if err != nil {
		return pathErr("remove", name, err)
	}
	n := dir.live[base]
	switch {
	case n == nil:
		return pathErr("remove", name, fs.ErrNotExist)
	case n.isDir && len(n.live) > 0:
		return pathErr("remove", name, syscall.ENOTEMPTY)
	}
	changeLocked(dir, dirOp{{base, nil}})
	return nil
}

// Rename implements FS. Directories may be renamed only to a new name
// outside themselves.
func (m *Mem) Rename(oldname, newname string) error {
	if err := m.before(OpRename, oldname); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	oldp, newp := cleanPath(oldname), cleanPath(newname)
	odir, obase, err := m.parentLocked(oldp)
	if err != nil {
		return pathErr("rename", oldname, err)
	}
	ndir, nbase, err := m.parentLocked(newp)
	if err != nil {
		return pathErr("rename", newname, err)
	}
	n := odir.live[obase]
	if n == nil {
		return pathErr("rename", oldname, fs.ErrNotExist)
	}
	if oldp == newp {
		return nil
	}
	if target := ndir.live[nbase]; target != nil && (target.isDir || n.isDir) {
		return pathErr("rename", newname, syscall.EEXIST)
	}
	if n.isDir && strings.HasPrefix(newp, oldp+"/") {
		return pathErr("rename", newname, syscall.EINVAL)
	}
	if odir == ndir {
		changeLocked(odir, dirOp{{obase, nil}, {nbase, n}})
		return nil
	}
	changeLocked(ndir, dirOp{{nbase, n}})
	changeLocked(odir, dirOp{{obase, nil}})
	return nil
}

// ReadDir implements FS.
func (m *Mem) ReadDir(dir string) ([]fs.DirEntry, error) {
	if err := m.before(OpReadDir, dir); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	d, err := m.lookupLocked(cleanPath(dir))
	if err != nil {
		return nil, pathErr("readdir", dir, err)
	}
	if !d.isDir {
		return nil, pathErr("readdir", dir, syscall.ENOTDIR)
	}
	out := make([]fs.DirEntry, 0, len(d.live))
	for _, name := range slices.Sorted(maps.Keys(d.live)) {
		out = append(out, fs.FileInfoToDirEntry(infoLocked(name, d.live[name])))
	}
	return out, nil
}

// Stat implements FS.
func (m *Mem) Stat(name string) (fs.FileInfo, error) {
	if err := m.before(OpStat, name); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	p := cleanPath(name)
	n, err := m.lookupLocked(p)
	if err != nil {
		return nil, pathErr("stat", name, err)
	}
	return infoLocked(path.Base(p), n), nil
}

// MkdirAll implements FS.
func (m *Mem) MkdirAll(dir string, perm os.FileMode) error {
	if err := m.before(OpMkdir, dir); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	p := cleanPath(dir)
	if p == "/" {
		return nil
	}
	n := m.root
	for _, part := range strings.Split(p[1:], "/") {
		next := n.live[part]
		switch {
		case next == nil:
			next = newDirNode()
			changeLocked(n, dirOp{{part, next}})
		case !next.isDir:
			return pathErr("mkdir", dir, syscall.ENOTDIR)
		}
		n = next
	}
	return nil
}

// SyncDir implements FS.
func (m *Mem) SyncDir(dir string) error {
	if err := m.before(OpSyncDir, dir); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	d, err := m.lookupLocked(cleanPath(dir))
	if err != nil {
		return pathErr("syncdir", dir, err)
	}
	if !d.isDir {
		return pathErr("syncdir", dir, syscall.ENOTDIR)
	}
	d.durable = maps.Clone(d.live)
	d.dirOps = nil
	return nil
}

// Lock implements FS. Mem keeps its locks in memory, without a file.
func (m *Mem) Lock(dir string) (io.Closer, error) {
	if err := m.before(OpLock, dir); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	p := cleanPath(dir)
	d, err := m.lookupLocked(p)
	if err != nil {
		return nil, pathErr("lock", dir, err)
	}
	if !d.isDir {
		return nil, pathErr("lock", dir, syscall.ENOTDIR)
	}
	if m.locked[p] {
		return nil, pathErr("lock", dir, ErrLocked)
	}
	m.locked[p] = true
	return &memLock{m: m, path: p}, nil
}

type memLock struct {
	m    *Mem
	path string
	once sync.Once
}

func (l *memLock) Close() error {
	err := fs.ErrClosed
	l.once.Do(func() {
		l.m.mu.Lock()
		delete(l.m.locked, l.path)
		l.m.mu.Unlock()
		err = nil
	})
	return err
}

// memInfo is the fs.FileInfo of a node.
type memInfo struct {
	name  string
	size  int64
	isDir bool
}

func infoLocked(name string, n *memNode) memInfo {
	return memInfo{name: name, size: int64(len(n.data)), isDir: n.isDir}
}

func (i memInfo) Name() string       { return i.name }
func (i memInfo) Size() int64        { return i.size }
func (i memInfo) ModTime() time.Time { return time.Time{} }
func (i memInfo) IsDir() bool        { return i.isDir }
func (i memInfo) Sys() any           { return nil }
func (i memInfo) Mode() fs.FileMode {
	if i.isDir {
		return fs.ModeDir | 0o755
	}
	return 0o644
}

// memFile is an open file of a Mem.
type memFile struct {
	fs          *Mem
	node        *memNode
	name        string
	read, write bool
	closed      bool // guarded by fs.mu
}

// checkLocked returns why the file may not be used for op.
func (f *memFile) checkLocked(op string, needWrite bool) error {
	switch {
	case f.closed:
		return pathErr(op, f.name, fs.ErrClosed)
	case needWrite && !f.write, op == "read" && !f.read:
		return pathErr(op, f.name, syscall.EBADF)
	}
	return nil
}

func (f *memFile) Name() string { return f.name }

func (f *memFile) ReadAt(p []byte, off int64) (int, error) {
	if err := f.fs.before(OpRead, f.name); err != nil {
		return 0, err
	}
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.checkLocked("read", false); err != nil {
		return 0, err
	}
	if off < 0 {
		return 0, pathErr("read", f.name, syscall.EINVAL)
	}
	if off >= int64(len(f.node.data)) {
		return 0, io.EOF
	}
	n := copy(p, f.node.data[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

func (f *memFile) WriteAt(p []byte, off int64) (int, error) {
	if err := f.fs.before(OpWrite, f.name); err != nil {
		return 0, err
	}
	m := f.fs
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := f.checkLocked("write", true); err != nil {
		return 0, err
	}
	if off < 0 {
		return 0, pathErr("write", f.name, syscall.EINVAL)
	}
	if m.writeFailures > 0 {
		m.writeFailures--
		n := 0
		if len(p) > 0 {
			n = m.rng.IntN(len(p))
		}
		if n > 0 {
			m.changeFileLocked(f.node, fileOp{off: off, data: p[:n]})
		}
		return n, pathErr("write", f.name, syscall.EIO)
	}
	if free := m.freeLocked(); free >= 0 {
		// Only bytes past the file's end take space.
		if grow := off + int64(len(p)) - int64(len(f.node.data)); grow > free {
			n := int(max(int64(len(f.node.data))+free-off, 0))
			if n > 0 {
				m.changeFileLocked(f.node, fileOp{off: off, data: p[:n]})
			}
			return n, pathErr("write", f.name, syscall.ENOSPC)
		}
	}
	if len(p) > 0 {
		m.changeFileLocked(f.node, fileOp{off: off, data: p})
	}
	return len(p), nil
}

func (f *memFile) Truncate(size int64) error {
	if err := f.fs.before(OpTruncate, f.name); err != nil {
		return err
	}
	m := f.fs
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := f.checkLocked("truncate", true); err != nil {
		return err
	}
	if size < 0 {
		return pathErr("truncate", f.name, syscall.EINVAL)
	}
	if m.writeFailures > 0 {
		m.writeFailures--
		return pathErr("truncate", f.name, syscall.EIO)
	}
	m.changeFileLocked(f.node, fileOp{truncate: true, size: size})
	return nil
}

func (f *memFile) Datasync() error {
	if err := f.fs.before(OpDatasync, f.name); err != nil {
		return err
	}
	m := f.fs
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := f.checkLocked("fdatasync", false); err != nil {
		return err
	}
	n := f.node
	if m.syncFailures > 0 {
		m.syncFailures--
		n.synced = m.crashContent(n.synced, n.ops)
		n.ops = nil
		return pathErr("fdatasync", f.name, syscall.EIO)
	}
	n.synced = applyOps(n.synced, n.ops)
	n.ops = nil
	return nil
}

func (f *memFile) Size() (int64, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.checkLocked("stat", false); err != nil {
		return 0, err
	}
	return int64(len(f.node.data)), nil
}

func (f *memFile) Close() error {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if f.closed {
		return pathErr("close", f.name, fs.ErrClosed)
	}
	f.closed = true
	return nil
}
