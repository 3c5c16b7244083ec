package master

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/kfelastic/kfelastic/api/masterpb"
)

// A file:// state's batches go into log segments, one per master
// (docs/DESIGN.md §5.8): log/<20-digit generation>.seg, a preallocated
// file of frames, each a StateFile behind its length and CRC-32C. A batch
// is one frame written in place and fdatasynced: no new file, no folder
// to sync, which made a durable batch 2.5 times cheaper than a file per
// batch on the machine it was measured on (bench-master).
//
// Fencing is by generation. A master claims generation max+1 with
// O_EXCL before it loads (so whatever the previous owner acknowledged is
// in what it reads), then writes its header frame: the last seq it read.
// The previous owner checks after each fdatasync, before it answers, that
// the generation after its own does not exist and its own still does (a
// newer owner deletes the older segments once it has a snapshot). So the
// newest master wins, and an answer goes out only from a master that is
// still the newest. A loader takes from each segment the batches up to the
// next segment's header: anything after it was written by an owner
// already fenced, and never answered.
const (
	segSuffix = ".seg"
	// segChunk is the most a segment is grown by at a time: a batch
	// written into allocated space changes no file size, so fdatasync has
	// no size to write.
	segChunk = 4 << 20
	// segFirstChunk is a new segment's first chunk; the chunks double from
	// it to segChunk, so that a master restarted again and again without
	// writing much leaves small segments behind.
	segFirstChunk  = 64 << 10
	frameHeaderLen = 8
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func segKey(gen uint64) string { return logDir + fmt.Sprintf("%0*d", seqDigits, gen) + segSuffix }

func parseSegName(name string) (uint64, bool) {
	name, ok := strings.CutSuffix(name, segSuffix)
	if !ok || len(name) != seqDigits {
		return 0, false
	}
	n, err := strconv.ParseUint(name, 10, 64)
	return n, err == nil
}

// putFrameHeader fills in the header of frame, whose payload follows
// frameHeaderLen bytes kept for it: the payload's length and CRC-32C.
func putFrameHeader(frame []byte) {
	payload := frame[frameHeaderLen:]
	binary.LittleEndian.PutUint32(frame, uint32(len(payload)))
	binary.LittleEndian.PutUint32(frame[4:], crc32.Checksum(payload, castagnoli))
}

// nextFrame reads the frame at the start of b: its payload and the bytes
// after it. end: b holds no more frames (zeros, the preallocated rest, or
// nothing). torn: the frame is incomplete or fails its checksum, which at
// a segment's tail is a write its master never finished, so never
// answered.
func nextFrame(b []byte) (payload, rest []byte, end, torn bool) {
	if len(b) < frameHeaderLen {
		return nil, nil, allZero(b), !allZero(b)
	}
	n, sum := binary.LittleEndian.Uint32(b), binary.LittleEndian.Uint32(b[4:])
	if n == 0 && sum == 0 {
		return nil, nil, true, false
	}
	if uint64(n) > uint64(len(b)-frameHeaderLen) {
		return nil, nil, false, true
	}
	payload = b[frameHeaderLen : frameHeaderLen+int(n)]
	if crc32.Checksum(payload, castagnoli) != sum {
		return nil, nil, false, true
	}
	return payload, b[frameHeaderLen+int(n):], false, false
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// segmentRead is what a loader found in one segment.
type segmentRead struct {
	gen uint64
	// header is false for a segment whose master never wrote its header
	// (killed between the claim and the header): it answered nothing,
	// and the segment is skipped.
	header bool
	base   uint64 // the header's seq: the batches start at base+1
	frames []*masterpb.StateFile
	// torn: the segment ends in a frame that is incomplete or fails its
	// checksum, after frames.
	torn bool
}

// readSegment reads log/<gen>.seg of a file:// state, checking each frame
// against the job and its token (check). A frame that decodes but is not
// what it should be (another job's, another format, out of order) is an
// ErrBadState: only a torn tail is expected.
func readSegment(dir string, gen uint64, check func(key string, f *masterpb.StateFile) error) (*segmentRead, error) {
	key := segKey(gen)
	data, err := readStateFile(filepath.Join(dir, filepath.FromSlash(key)), key)
	if err != nil {
		return nil, err
	}
	r := &segmentRead{gen: gen}
	for i := 0; ; i++ {
		payload, rest, end, torn := nextFrame(data)
		if end {
			return r, nil
		}
		if torn {
			r.torn = true
			return r, nil
		}
		data = rest
		var f masterpb.StateFile
		if err := proto.Unmarshal(payload, &f); err != nil {
			return nil, fmt.Errorf("%w: %s frame %d is %w (%v)", ErrBadState, key, i, errCorrupt, err)
		}
		if err := check(key, &f); err != nil {
			return nil, err
		}
		switch {
		case i == 0:
			if f.GetSegment() != gen || len(f.GetRecords()) != 0 {
				return nil, fmt.Errorf("%w: %s starts with a frame that is not its header (segment %d)", ErrBadState, key, f.GetSegment())
			}
			r.header, r.base = true, f.GetSeq()
		case f.GetSeq() != r.base+uint64(i) || f.GetSegment() != 0 || f.GetSnapshot():
			return nil, fmt.Errorf("%w: %s frame %d says it is seq %d, want %d", ErrBadState, key, i, f.GetSeq(), r.base+uint64(i))
		default:
			r.frames = append(r.frames, &f)
		}
	}
}

// readStateFile reads a state file of at most maxStateFile bytes, opened
// without following a link.
func readStateFile(path, key string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, fmt.Errorf("state %s: %w", key, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("state %s: %w", key, err)
	}
	if fi.Size() > maxStateFile {
		return nil, fmt.Errorf("%w: %s has %d bytes, more than %d", ErrBadState, key, fi.Size(), maxStateFile)
	}
	data, err := io.ReadAll(io.LimitReader(f, maxStateFile+1))
	if err != nil {
		return nil, fmt.Errorf("state %s: %w", key, err)
	}
	return data, nil
}

// segment is the log segment this master appends to.
type segment struct {
	dir   string // the state's folder
	gen   uint64
	f     *os.File
	off   int64 // where the next frame goes
	alloc int64 // bytes allocated
	// noAlloc: the file system cannot allocate ahead (no fallocate); the
	// file grows with each frame instead.
	noAlloc bool
	buf     []byte
}

// errClaimed: the generation was claimed by another master first.
var errClaimed = errors.New("segment generation already claimed")

// claimSegment creates log/<gen>.seg, exclusively, and makes its name
// durable. It fails with errClaimed when the name exists.
func claimSegment(dir string, gen uint64) (*segment, error) {
	path := filepath.Join(dir, filepath.FromSlash(segKey(gen)))
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("%w: %s", errClaimed, segKey(gen))
	}
	if err != nil {
		return nil, err
	}
	s := &segment{dir: dir, gen: gen, f: f}
	if err := syncPath(filepath.Dir(path)); err != nil {
		s.close()
		return nil, err
	}
	return s, nil
}

// start writes the segment's header: the job, the token's fingerprint, and
// base, the last seq before its first batch.
func (s *segment) start(job string, fingerprint []byte, base uint64) error {
	return s.write(&masterpb.StateFile{Format: stateFormat, Job: job, Seq: base, Segment: s.gen, TokenFingerprint: fingerprint})
}

// write appends one frame and fdatasyncs it. Its error is ErrStateIO when
// the frame may be on disk, not durable: Linux forgets a failed write-back,
// so a retried fdatasync would say nothing.
func (s *segment) write(f *masterpb.StateFile) error {
	frame, err := proto.MarshalOptions{}.MarshalAppend(append(s.buf[:0], make([]byte, frameHeaderLen)...), f)
	if err != nil {
		return err
	}
	s.buf = frame
	putFrameHeader(frame)
	end := s.off + int64(len(frame))
	if !s.noAlloc && end > s.alloc {
		// Grow by a chunk; the new size is made durable by this batch's
		// fdatasync (it must be: the frame lies in it).
		size := max(end, s.alloc+min(max(s.alloc, segFirstChunk), segChunk))
		err := unix.Fallocate(int(s.f.Fd()), 0, 0, size)
		if errors.Is(err, unix.ENOSPC) && size > end {
			size = end // a chunk is more than there is room for: this frame only
			err = unix.Fallocate(int(s.f.Fd()), 0, 0, size)
		}
		switch {
		case err == nil:
			s.alloc = size
		case errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOSYS):
			s.noAlloc = true
		default:
			return fmt.Errorf("allocate %s: %w", segKey(s.gen), err)
		}
	}
	if _, err := s.f.WriteAt(frame, s.off); err != nil {
		// Nothing after s.off is read as a batch until a frame there is
		// whole: the next try writes over it.
		return fmt.Errorf("write %s: %w", segKey(s.gen), err)
	}
	if err := unix.Fdatasync(int(s.f.Fd())); err != nil {
		return fmt.Errorf("%w: fdatasync %s: %v", ErrStateIO, segKey(s.gen), err)
	}
	s.off = end
	return nil
}

// held fails with ErrFenced when a newer master has claimed the state:
// the next generation exists, or this one is gone (a newer master deleted
// it after its snapshot). The next is looked at first: a newer master
// deletes the older segments in order, this one before the next, so if
// the next is gone, so is this one.
func (s *segment) held() error {
	for _, g := range []uint64{s.gen + 1, s.gen} {
		_, err := os.Lstat(filepath.Join(s.dir, filepath.FromSlash(segKey(g))))
		switch {
		case g != s.gen && err == nil:
			return fmt.Errorf("%w: %s exists", ErrFenced, segKey(g))
		case g == s.gen && errors.Is(err, fs.ErrNotExist):
			return fmt.Errorf("%w: this master's %s was deleted", ErrFenced, segKey(g))
		case err != nil && !errors.Is(err, fs.ErrNotExist):
			return err
		}
	}
	return nil
}

func (s *segment) close() {
	if s.f != nil {
		s.f.Close()
		s.f = nil
	}
}
