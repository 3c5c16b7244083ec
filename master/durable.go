package master

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"gocloud.dev/blob"
	"gocloud.dev/gcerrors"
	"google.golang.org/protobuf/proto"

	"github.com/kfelastic/kfelastic/api/masterpb"
)

// The master's durable state lives under --state as a log of batches and
// an occasional snapshot (docs/DESIGN.md §5.8):
//
//	log/<20-digit gen>.seg  file:// states: one log segment per master,
//	                        a batch per frame (segment.go)
//	log/<20-digit seq>.pb   other stores: one batch of changed records,
//	                        written once (IfNotExist): a second master
//	                        writing the same seq fails, so two masters
//	                        never both go on
//	snap/<20-digit seq>.pb  every record as of seq; logs up to seq and
//	                        older snapshots are deleted after it is written
//
// A record is last-writer-wins by identity (a node by rank, the latest
// round, a decision by seq, a replacement's claim by rank, a key, a store
// client), so loading is: the
// newest snapshot, then the batches after it in order. Each batch is one
// write however many requests it acknowledges (group commit); heartbeats
// change nothing durable and write nothing.
const (
	stateFormat  = 1
	logDir       = "log/"
	snapDir      = "snap/"
	seqDigits    = 20
	maxStateFile = 1 << 30
	// A snapshot is written after this many batches or bytes of log.
	snapshotEveryBatches = 1000
	snapshotEveryBytes   = 64 << 20
)

// ErrFenced means another master wrote the state this one was about to: this
// master must stop serving.
var ErrFenced = errors.New("another master wrote the same state sequence number (fenced off)")

// ErrStateIO means the state may not be durable and cannot be made so by
// retrying (an fsync failed after a log was put in place): this master
// must stop; a restarted one reloads what is there.
var ErrStateIO = errors.New("master state not durable")

// ErrBadState is a state that cannot be loaded: corrupt, of another job, or
// of an unknown format. Nothing is changed; the message names the object.
var ErrBadState = errors.New("unusable master state")

// durableLog is the writer of the state log.
type durableLog struct {
	bucket *blob.Bucket
	// dir is the state's folder when it is a file:// URL: batches then go
	// into a log segment (fileblob's IfNotExist checks, then renames: two
	// processes can both pass the check, so it cannot fence), and
	// snapshots are written without fileblob's temporary file in /tmp.
	dir string
	// private: no other master can write the bucket (mem://), so the
	// checks for another master's writes (held, noNewerSnapshot) are
	// skipped; listing a memblob sorts every key, per batch.
	private   bool
	job       string
	seq       uint64 // last written
	batches   int    // since the last snapshot
	bytes     int64
	snapshots []uint64 // existing snapshot seqs
	logs      []uint64 // existing per-batch log seqs after the last snapshot
	// fingerprint is the job token's (tokenFingerprint), written with the
	// state and checked against what is read.
	fingerprint []byte
	// seg is the log segment this master appends to (file:// states);
	// segments are the generations there are, seg's included.
	seg            *segment
	segments       []uint64
	segmentBatches int64 // batches read from segments at load
	// snapshotDelay is the batches still to wait after a failed snapshot
	// before the next try, so that a store that refuses snapshots is not
	// sent the whole state again with every batch.
	snapshotDelay int
	// beforeAppend, when set, runs before each batch is written (tests:
	// Options.stateWriteHook).
	beforeAppend func(context.Context) error
}

func seqKey(dir string, seq uint64) string {
	return dir + fmt.Sprintf("%0*d", seqDigits, seq) + ".pb"
}

func parseSeqKey(dir, key string) (uint64, bool) {
	name, ok := strings.CutPrefix(key, dir)
	if !ok {
		return 0, false
	}
	name, ok = strings.CutSuffix(name, ".pb")
	if !ok || len(name) != seqDigits {
		return 0, false
	}
	n, err := strconv.ParseUint(name, 10, 64)
	return n, err == nil
}

// stateSpec says where a master's state is and whose it is.
type stateSpec struct {
	bucket *blob.Bucket
	// dir is the state's folder when bucket is a file:// URL: batches then
	// go into log segments (segment.go).
	dir string
	// private: no other master can write the bucket (mem://).
	private bool
	job     string
	// token is the job's token; its fingerprint is written with the state,
	// and a state written under another token is refused.
	token string
}

// tokenFingerprint identifies a token without revealing it (nil: none).
func tokenFingerprint(token string) []byte {
	if token == "" {
		return nil
	}
	sum := sha256.Sum256([]byte("kfelastic master state token\x00" + token))
	return sum[:16]
}

// loadState reads the newest snapshot and the batches after it: the
// records, merged last-writer-wins, in a stable order (snapshot order,
// then new identities as they appear). Unless the state is private it then
// claims the state: on file:// a new log segment (segment.go), elsewhere
// the next batch's name, written empty. A master that held the state
// before is fenced from then on. The state is read again after the claim
// (what the other master acknowledged before it is all there then); the
// first read is only so that a state this master refuses is not claimed.
func loadState(ctx context.Context, st stateSpec) (*durableLog, []*masterpb.StateRecord, error) {
	d, recs, err := readState(ctx, st)
	if err != nil || st.private {
		return d, recs, err
	}
	if st.dir != "" {
		if err := d.prepareDir(); err != nil {
			return nil, nil, err
		}
	}
	for range 10 {
		if st.dir == "" {
			// The claim is the next batch, empty: written only if nobody
			// wrote it first.
			if err := d.append(ctx, nil); errors.Is(err, ErrFenced) {
				if d, recs, err = readState(ctx, st); err != nil {
					return nil, nil, err
				}
				continue
			} else if err != nil {
				return nil, nil, fmt.Errorf("claim the state: %w", err)
			}
			return d, recs, nil
		}
		gens, err := d.listSegments()
		if err != nil {
			return nil, nil, err
		}
		var gen uint64 = 1
		if n := len(gens); n > 0 {
			gen = gens[n-1] + 1
		}
		seg, err := claimSegment(st.dir, gen)
		if errors.Is(err, errClaimed) {
			continue // another master is starting too: claim after it
		}
		if err != nil {
			return nil, nil, fmt.Errorf("claim the state: %w", err)
		}
		d2, recs, err := d.startSegment(ctx, st, seg)
		if err != nil {
			seg.close()
			_ = os.Remove(filepath.Join(st.dir, filepath.FromSlash(segKey(gen))))
			return nil, nil, err
		}
		return d2, recs, nil
	}
	return nil, nil, fmt.Errorf("claim the state: other masters kept claiming %s first", st.dir)
}

// startSegment reads the state again now that seg is claimed, makes what
// it read durable (the previous owner may not have synced its last frame
// yet), and starts seg after it.
func (d *durableLog) startSegment(ctx context.Context, st stateSpec, seg *segment) (*durableLog, []*masterpb.StateRecord, error) {
	d, recs, err := readState(ctx, st)
	if err != nil {
		return nil, nil, err
	}
	for _, g := range d.segments {
		if g < seg.gen {
			// What this master read of it may be only in the page cache,
			// and it is about to build on it.
			if err := syncPath(filepath.Join(st.dir, filepath.FromSlash(segKey(g)))); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return nil, nil, fmt.Errorf("sync %s: %w", segKey(g), err)
			}
		}
	}
	if err := seg.start(d.job, d.fingerprint, d.seq); err != nil {
		return nil, nil, fmt.Errorf("claim the state: %w", err)
	}
	d.seg = seg
	if !slices.Contains(d.segments, seg.gen) {
		d.segments = append(d.segments, seg.gen)
	}
	return d, recs, nil
}

// readState reads the state as it is, claiming nothing.
func readState(ctx context.Context, st stateSpec) (*durableLog, []*masterpb.StateRecord, error) {
	d := &durableLog{bucket: st.bucket, job: st.job, dir: st.dir, private: st.private, fingerprint: tokenFingerprint(st.token)}
	snaps, err := d.list(ctx, snapDir)
	if err != nil {
		return nil, nil, err
	}
	logs, err := d.list(ctx, logDir)
	if err != nil {
		return nil, nil, err
	}
	var gens []uint64
	if d.dir != "" {
		if gens, err = d.listSegments(); err != nil {
			return nil, nil, err
		}
	}
	m := newMerger()
	var base uint64
	if len(snaps) > 0 {
		base = snaps[len(snaps)-1]
		f, err := d.read(ctx, seqKey(snapDir, base), base, true)
		if err != nil {
			if errors.Is(err, errCorrupt) {
				err = fmt.Errorf("%w; the logs it replaced were deleted when it was written, so the state cannot be rebuilt without it: restore it from a copy, or start the job with a fresh --state", err)
			}
			return nil, nil, err
		}
		m.add(f.Records)
	}
	d.snapshots = snaps
	prev := base
	for i, s := range logs {
		if s <= base {
			continue // compacted into the snapshot; deleted after it
		}
		if s != prev+1 {
			return nil, nil, fmt.Errorf("%w: state log has a gap: %s follows %d (%s is missing): put it back, or move %s and every later log away to start from the state before the gap (what they acknowledged is lost)",
				ErrBadState, seqKey(logDir, s), prev, seqKey(logDir, prev+1), seqKey(logDir, s))
		}
		f, err := d.read(ctx, seqKey(logDir, s), s, false)
		if err != nil {
			if errors.Is(err, errCorrupt) {
				err = fmt.Errorf("%w; %s", err, corruptLogAdvice(logs[i:]))
			}
			return nil, nil, err
		}
		m.add(f.Records)
		d.logs = append(d.logs, s)
		prev = s
	}
	if prev, err = d.readSegments(gens, prev, m); err != nil {
		return nil, nil, err
	}
	d.seq = prev
	d.segments = gens
	d.batches = len(d.logs) + int(d.segmentBatches)
	return d, m.records(), nil
}

// readSegments adds the batches after prev of a file:// state's segments
// (gens, in order) to m, each segment's up to the next one's header, and
// returns the last seq added.
func (d *durableLog) readSegments(gens []uint64, prev uint64, m *merger) (uint64, error) {
	var segs []*segmentRead
	for _, g := range gens {
		r, err := readSegment(d.dir, g, d.check)
		if err != nil {
			return 0, err
		}
		if r.header {
			segs = append(segs, r)
		}
	}
	for i, r := range segs {
		limit := uint64(math.MaxUint64)
		if i+1 < len(segs) {
			limit = segs[i+1].base
		}
		if r.base > prev {
			return 0, fmt.Errorf("%w: state log has a gap: %s starts after seq %d, the state before it ends at %d: put back what is missing, or move %s and every later segment away to start from the state before the gap (what they acknowledged is lost)",
				ErrBadState, segKey(r.gen), r.base, prev, segKey(r.gen))
		}
		for _, f := range r.frames {
			if f.GetSeq() > limit {
				break // written after the next master claimed the state: never answered
			}
			if f.GetSeq() <= prev {
				continue // in the snapshot, or read already
			}
			m.add(f.Records)
			prev = f.GetSeq()
			d.segmentBatches++
			d.bytes += int64(proto.Size(f))
		}
		if r.torn && i+1 < len(segs) && prev < limit {
			return 0, fmt.Errorf("%w: %s is %w after seq %d, and the next segment builds on seq %d: move %s and every later segment away to start from the state before it (what they acknowledged is lost), or start the job with a fresh --state",
				ErrBadState, segKey(r.gen), errCorrupt, prev, limit, segKey(r.gen))
		}
	}
	return prev, nil
}

// check refuses a state file that is not this job's: another format,
// another --rdzv-id, or another token.
func (d *durableLog) check(key string, f *masterpb.StateFile) error {
	switch {
	case f.GetFormat() != stateFormat:
		return fmt.Errorf("%w: %s has format %d, this master reads %d", ErrBadState, key, f.GetFormat(), stateFormat)
	case f.GetJob() != d.job:
		return fmt.Errorf("%w: %s belongs to job %q, not %q (another job's --state?)", ErrBadState, key, f.GetJob(), d.job)
	case len(f.GetTokenFingerprint()) > 0 && d.fingerprint != nil && !bytes.Equal(f.GetTokenFingerprint(), d.fingerprint):
		return fmt.Errorf("%w: %s was written by a job %q with another token (another job's --state with the same --rdzv-id?): give this job a --state of its own", ErrBadState, key, d.job)
	}
	return nil
}

// listSegments returns the generations of a file:// state's segments,
// sorted; an entry named like one that is not a regular file is refused.
func (d *durableLog) listSegments() ([]uint64, error) {
	return listFolder(d.dir, logDir, parseSegName)
}

// listFolder returns the numbers that parse finds in the names under
// prefix in a file:// state's folder dir, sorted. An entry named like a
// state file that is not a regular file (a folder, a link) is refused
// rather than skipped, since skipping it would load a state without it and
// then fail every write of its number as if fenced.
func listFolder(dir, prefix string, parse func(name string) (uint64, bool)) ([]uint64, error) {
	entries, err := os.ReadDir(filepath.Join(dir, filepath.FromSlash(prefix)))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", prefix, err)
	}
	var ns []uint64
	for _, e := range entries {
		n, ok := parse(e.Name())
		if !ok {
			continue
		}
		if !e.Type().IsRegular() {
			return nil, fmt.Errorf("%w: %s is not a regular file (%v): move it away", ErrBadState, prefix+e.Name(), e.Type())
		}
		ns = append(ns, n)
	}
	slices.Sort(ns)
	return ns, nil
}

// errCorrupt marks a state file that does not decode; loadState says what
// to do about it, which depends on where it is.
var errCorrupt = errors.New("corrupt")

// corruptLogAdvice says what gets a master going when logs[0] is corrupt
// and logs[1:] follow it. The logs after a corrupt one cannot be applied
// without it (a log holds only what changed), and moving the corrupt one
// alone leaves a gap the master refuses; so the way back is to move it and
// every later log away, which loses what they acknowledged.
func corruptLogAdvice(logs []uint64) string {
	if len(logs) == 1 {
		return "it is the last log: move it away to start from the state before it (what it acknowledged is lost)"
	}
	return fmt.Sprintf("%d later logs (to %s) build on it: move it and every later log away to start from the state before it (what they acknowledged is lost), or start the job with a fresh --state",
		len(logs)-1, seqKey(logDir, logs[len(logs)-1]))
}

// list returns the seqs of the state files under prefix (logDir or
// snapDir), sorted. On a file:// state it reads the folder itself
// (listFolder).
func (d *durableLog) list(ctx context.Context, prefix string) ([]uint64, error) {
	if d.dir != "" {
		return listFolder(d.dir, prefix, func(name string) (uint64, bool) { return parseSeqKey(prefix, prefix+name) })
	}
	var seqs []uint64
	it := d.bucket.List(&blob.ListOptions{Prefix: prefix})
	for {
		obj, err := it.Next(ctx)
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("list %s: %w", prefix, err)
		}
		if s, ok := parseSeqKey(prefix, obj.Key); ok {
			seqs = append(seqs, s)
		}
	}
	slices.Sort(seqs)
	return seqs, nil
}

// prepareDir makes a loaded file:// state ready for writing: its log and
// snapshot folders exist and are durable (the state folder synced), and
// the temporary files of writes a killed master left behind are removed.
// A temporary file is never a state file: a write links or renames it into
// place only once complete and synced.
func (d *durableLog) prepareDir() error {
	for _, sub := range []string{logDir, snapDir} {
		p := filepath.Join(d.dir, filepath.FromSlash(sub))
		if err := os.MkdirAll(p, 0o755); err != nil {
			return err
		}
		tmps, _ := filepath.Glob(filepath.Join(p, ".tmp-*"))
		for _, t := range tmps {
			_ = os.Remove(t)
		}
	}
	if err := syncPath(d.dir); err != nil {
		return err
	}
	// The state folder's own name, in case it was just created; a parent
	// this process may not open (no read permission) is left as it is.
	if err := syncPath(filepath.Dir(d.dir)); err != nil && !errors.Is(err, fs.ErrPermission) {
		return err
	}
	return nil
}

func (d *durableLog) read(ctx context.Context, key string, seq uint64, snapshot bool) (*masterpb.StateFile, error) {
	attrs, err := d.bucket.Attributes(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("state %s: %w", key, err)
	}
	if attrs.Size > maxStateFile {
		return nil, fmt.Errorf("%w: %s has %d bytes, more than %d", ErrBadState, key, attrs.Size, maxStateFile)
	}
	data, err := d.bucket.ReadAll(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("state %s: %w", key, err)
	}
	var f masterpb.StateFile
	if err := proto.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("%w: %s is %w (%v)", ErrBadState, key, errCorrupt, err)
	}
	if err := d.check(key, &f); err != nil {
		return nil, err
	}
	if f.GetSeq() != seq || f.GetSnapshot() != snapshot || f.GetSegment() != 0 {
		return nil, fmt.Errorf("%w: %s says it is seq %d (snapshot %v, segment %d)", ErrBadState, key, f.GetSeq(), f.GetSnapshot(), f.GetSegment())
	}
	return &f, nil
}

// append writes one batch; it is durable when append returns nil: on a
// file:// state the file and its folder are fsynced first.
func (d *durableLog) append(ctx context.Context, records []*masterpb.StateRecord) error {
	if d.beforeAppend != nil {
		if err := d.beforeAppend(ctx); err != nil {
			return err
		}
	}
	seq := d.seq + 1
	if d.seg != nil {
		off := d.seg.off
		if err := d.seg.write(&masterpb.StateFile{Format: stateFormat, Job: d.job, Seq: seq, Records: records}); err != nil {
			return err
		}
		d.seq = seq
		d.batches++
		d.bytes += d.seg.off - off
		// Written and durable; answered only if no newer master claimed the
		// state meanwhile. (If this check fails otherwise, the batch is
		// written again as the next seq: records are last-writer-wins.)
		return d.seg.held()
	}
	data, err := proto.Marshal(&masterpb.StateFile{Format: stateFormat, Job: d.job, Seq: seq, Records: records, TokenFingerprint: d.fingerprint})
	if err != nil {
		return err
	}
	err = d.bucket.WriteAll(ctx, seqKey(logDir, seq), data, &blob.WriterOptions{IfNotExist: true, ContentType: "application/x-protobuf"})
	if gcerrors.Code(err) == gcerrors.FailedPrecondition {
		return fmt.Errorf("%w: %s exists", ErrFenced, seqKey(logDir, seq))
	}
	if err != nil {
		return err
	}
	d.seq = seq
	d.logs = append(d.logs, seq)
	d.batches++
	d.bytes += int64(len(data))
	// Another master that went on from here and compacted its logs into a
	// snapshot deleted the log this one just wrote: the write succeeded, but
	// the state is theirs. (If this check fails otherwise, the batch is
	// written again as the next seq, and checked again: records are
	// last-writer-wins, so writing them twice changes nothing.)
	return d.noNewerSnapshot(ctx, seq-1)
}

// held fails with ErrFenced when another master has written past this one's
// last batch (its next log exists, or a snapshot after it): this master's
// state is then stale, and nothing may be answered from it. A batch that
// writes nothing (reads, held heartbeats) checks it before its answers go
// out; one that writes is fenced by its write.
func (d *durableLog) held(ctx context.Context) error {
	if d.private {
		return nil
	}
	if d.seg != nil {
		return d.seg.held()
	}
	next := seqKey(logDir, d.seq+1)
	exists, err := d.bucket.Exists(ctx, next)
	if err != nil {
		return err
	}
	if exists {
		return fmt.Errorf("%w: %s exists", ErrFenced, next)
	}
	return d.noNewerSnapshot(ctx, d.seq)
}

// noNewerSnapshot fails with ErrFenced when a snapshot after seq exists:
// only another master writes one.
func (d *durableLog) noNewerSnapshot(ctx context.Context, seq uint64) error {
	if d.private {
		return nil
	}
	snaps, err := d.list(ctx, snapDir)
	if err != nil {
		return err
	}
	if n := len(snaps); n > 0 && snaps[n-1] > seq {
		return fmt.Errorf("%w: snapshot %s is past this master's seq %d", ErrFenced, seqKey(snapDir, snaps[n-1]), seq)
	}
	return nil
}

// replaceFile writes data under path, replacing what is there, durably: a
// temporary file next to it (never in /tmp: a rename across file systems
// fails), fsynced, renamed into place, and the folder fsynced.
func replaceFile(path string, data []byte) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tmp, err := writeTemp(dir, data)
	if err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := syncPath(dir); err != nil {
		return fmt.Errorf("%w: %v", errNotSynced, err)
	}
	return nil
}

// errNotSynced is a file written in place whose folder's fsync failed.
var errNotSynced = errors.New("written but its folder not synced")

// writeTemp writes data to a new fsynced .tmp-* file (0600) in dir.
func writeTemp(dir string, data []byte) (string, error) {
	f, err := os.CreateTemp(dir, ".tmp-*")
	if err != nil {
		return "", err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(f.Name())
		return "", err
	}
	return f.Name(), nil
}

// syncPath fsyncs a file or a folder (its entries) by its path.
func syncPath(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func (d *durableLog) wantsSnapshot() bool {
	if d.snapshotDelay > 0 {
		d.snapshotDelay--
		return false
	}
	return d.batches >= snapshotEveryBatches || d.bytes >= snapshotEveryBytes
}

// snapshot writes every record as of the last batch, then deletes what it
// replaces. A crash in between leaves both, which loads the same; on a
// file:// state the snapshot is fsynced before anything is deleted, and
// this master goes on in a new segment (rollSegment).
//
// On other stores the batches it replaces are an object each, up to
// snapshotEveryBatches of them: their deletion is returned as prune, for
// the caller to run off the master's loop (a thousand deletes one after
// the other held the loop, and so every node's call, for a thousand round
// trips to the store). nil
// when there is nothing to delete. Until prune has run the old batches are
// still there, which loads the same.
func (d *durableLog) snapshot(ctx context.Context, all []*masterpb.StateRecord) (prune func(context.Context) error, err error) {
	seq := d.seq
	data, err := proto.Marshal(&masterpb.StateFile{Format: stateFormat, Job: d.job, Seq: seq, Snapshot: true, Records: all, TokenFingerprint: d.fingerprint})
	if err != nil {
		return nil, err
	}
	key := seqKey(snapDir, seq)
	if d.dir != "" {
		err = replaceFile(filepath.Join(d.dir, filepath.FromSlash(key)), data)
		if err == nil && d.seg != nil {
			err = d.rollSegment()
		}
	} else {
		err = d.bucket.WriteAll(ctx, key, data, &blob.WriterOptions{ContentType: "application/x-protobuf"})
	}
	if err != nil {
		d.snapshotDelay = snapshotEveryBatches / 10
		return nil, err
	}
	var old []string
	// Oldest first: a master fenced earlier looks for the segment after
	// its own before its own (segment.held).
	for _, g := range d.segments {
		if d.seg != nil && g < d.seg.gen {
			old = append(old, segKey(g))
		}
	}
	for _, s := range d.snapshots {
		if s < seq {
			old = append(old, seqKey(snapDir, s))
		}
	}
	// The segments and snapshots, a few, go now (a fenced master finds
	// its segment gone); the batches are prune's.
	err = deleteKeys(ctx, d.bucket, old, 1)
	var batches []string
	for _, s := range d.logs {
		if s <= seq {
			batches = append(batches, seqKey(logDir, s))
		}
	}
	if len(batches) > 0 {
		bucket := d.bucket
		prune = func(ctx context.Context) error { return deleteKeys(ctx, bucket, batches, pruneConcurrency) }
	}
	if d.seg != nil {
		d.segments = []uint64{d.seg.gen}
	}
	d.logs = slices.DeleteFunc(d.logs, func(s uint64) bool { return s <= seq })
	d.snapshots = []uint64{seq}
	d.batches, d.bytes = 0, 0
	return prune, err
}

// pruneConcurrency is how many deletes a snapshot's prune has in flight.
const pruneConcurrency = 8

// deleteKeys deletes keys, n at a time; a key already gone is no error.
// It returns the first error, having tried every key.
func deleteKeys(ctx context.Context, b *blob.Bucket, keys []string, n int) error {
	var (
		mu       sync.Mutex
		firstErr error
		wg       sync.WaitGroup
		slots    = make(chan struct{}, n)
	)
	for _, k := range keys {
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			if err := b.Delete(ctx, k); err != nil && gcerrors.Code(err) != gcerrors.NotFound {
				mu.Lock()
				if firstErr == nil {
					firstErr = err
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return firstErr
}

// rollSegment goes on in a new segment after a snapshot, so that the old
// one, all of it in the snapshot, can be deleted. The new one is claimed
// like a starting master's: if another master claimed that generation
// first, this one is fenced, and its next batch finds out.
func (d *durableLog) rollSegment() error {
	next, err := claimSegment(d.dir, d.seg.gen+1)
	if err != nil {
		return err
	}
	if err := next.start(d.job, d.fingerprint, d.seq); err != nil {
		// Not started, so not this master's to go on in; removed, or this
		// master would take it for a newer master's claim.
		next.close()
		if rerr := os.Remove(filepath.Join(d.dir, filepath.FromSlash(segKey(next.gen)))); rerr != nil {
			return fmt.Errorf("%w: a new segment could not be started (%v) nor removed (%v)", ErrStateIO, err, rerr)
		}
		return err
	}
	d.seg.close()
	d.seg = next
	d.segments = append(d.segments, next.gen)
	return nil
}

// close releases the segment's file.
func (d *durableLog) close() {
	if d != nil && d.seg != nil {
		d.seg.close()
	}
}

// merger merges records last-writer-wins by identity.
type merger struct {
	order []string
	by    map[string]*masterpb.StateRecord
}

func newMerger() *merger { return &merger{by: map[string]*masterpb.StateRecord{}} }

func recordID(r *masterpb.StateRecord) string {
	switch x := r.GetRecord().(type) {
	case *masterpb.StateRecord_Job:
		return "job"
	case *masterpb.StateRecord_Node:
		return "node/" + strconv.Itoa(int(x.Node.GetRank()))
	case *masterpb.StateRecord_Round:
		return "round"
	case *masterpb.StateRecord_Decision:
		return "decision/" + strconv.FormatInt(x.Decision.GetSeq(), 10)
	case *masterpb.StateRecord_Kv:
		return "kv/" + x.Kv.GetKey()
	case *masterpb.StateRecord_Session:
		return "session/" + x.Session.GetClient()
	case *masterpb.StateRecord_Claim:
		return "claim/" + strconv.Itoa(int(x.Claim.GetRank()))
	}
	return ""
}

func (m *merger) add(rs []*masterpb.StateRecord) {
	for _, r := range rs {
		id := recordID(r)
		if id == "" {
			continue // a record kind from a newer master: ignored, not fatal
		}
		if _, ok := m.by[id]; !ok {
			m.order = append(m.order, id)
		}
		m.by[id] = r
	}
}

func (m *merger) records() []*masterpb.StateRecord {
	out := make([]*masterpb.StateRecord, 0, len(m.order))
	for _, id := range m.order {
		out = append(out, m.by[id])
	}
	return out
}

// ---- Job ↔ records ----

func exclusionPB(e *Exclusion) *masterpb.Exclusion {
	if e == nil {
		return nil
	}
	return &masterpb.Exclusion{Code: e.Code, Message: e.Message, Relaunch: e.Relaunch}
}

func exclusionFrom(e *masterpb.Exclusion) *Exclusion {
	if e == nil {
		return nil
	}
	return &Exclusion{Code: e.GetCode(), Message: e.GetMessage(), Relaunch: e.GetRelaunch()}
}

func (j *Job) nodeRecord(n *Node) *masterpb.StateRecord {
	return &masterpb.StateRecord{Record: &masterpb.StateRecord_Node{Node: &masterpb.NodeRecord{
		Rank: int32(n.Rank), Pod: n.Pod, Incarnation: n.Incarnation, Host: n.Host, Addr: n.Addr, Port: int32(n.Port),
		LocalWorldSize: int32(n.LocalWorldSize), State: string(n.State), Round: n.Round, Relaunches: int32(n.Relaunches),
		Checked: n.Checked, Relaunching: n.Relaunching, Exclusion: exclusionPB(n.Exclusion), AfterRound: n.AfterRound,
		Fenced: slices.Clone(j.fenced[n.Rank]),
	}}}
}

// claimRecord is rank's claim, or, when it has none, the record that ends
// the one written before.
func (j *Job) claimRecord(rank int) *masterpb.StateRecord {
	cr := &masterpb.ClaimRecord{Rank: int32(rank), Ended: true}
	if c := j.claims[rank]; c != nil {
		n := c.n
		cr = &masterpb.ClaimRecord{Rank: int32(rank), Pod: n.Pod, Incarnation: n.Incarnation, Host: n.Host, Addr: n.Addr,
			Port: int32(n.Port), LocalWorldSize: int32(n.LocalWorldSize), AfterRound: c.afterRound, Expired: c.expired}
	}
	return &masterpb.StateRecord{Record: &masterpb.StateRecord_Claim{Claim: cr}}
}

// restoreClaim restores a claim as of now: a fresh heartbeat grace and pend
// timeout, as a restored node gets its grace. An ended claim restores
// nothing.
func (j *Job) restoreClaim(cr *masterpb.ClaimRecord, now time.Time) error {
	rank := int(cr.GetRank())
	if rank < 0 || rank >= j.cfg.MaxNodes {
		return fmt.Errorf("%w: claim on rank %d outside [0, %d) of this job's --nnodes", ErrBadState, rank, j.cfg.MaxNodes)
	}
	if cr.GetEnded() {
		delete(j.claims, rank)
		return nil
	}
	n := NodeInfo{Pod: cr.GetPod(), Incarnation: cr.GetIncarnation(), Rank: rank, LocalWorldSize: int(cr.GetLocalWorldSize()),
		Addr: cr.GetAddr(), Port: int(cr.GetPort()), Host: cr.GetHost()}
	err := j.validate(n)
	if err == nil && (n.LocalWorldSize < 1 || n.LocalWorldSize > MaxLocalWorkers || cr.GetAfterRound() < 0) {
		err = fmt.Errorf("local world size %d or after_round %d out of range", n.LocalWorldSize, cr.GetAfterRound())
	}
	if err != nil {
		return fmt.Errorf("%w: claim on rank %d: %v", ErrBadState, rank, err)
	}
	j.claims[rank] = &claim{n: n, afterRound: cr.GetAfterRound(), expired: cr.GetExpired(), since: now, lastSeen: now}
	return nil
}

// DecisionPB is a decision as the protocol carries it.
func DecisionPB(d Decision) *masterpb.Decision {
	kind := masterpb.Decision_NONE
	switch d.Kind {
	case StopJob:
		kind = masterpb.Decision_STOP_JOB
	default:
		kind = masterpb.Decision_Kind(d.Kind)
	}
	return &masterpb.Decision{Seq: d.Seq, Kind: kind, Rank: int32(d.Rank), Pod: d.Pod, Host: d.Host, Reason: d.Reason,
		Message: d.Message, Counted: d.Counted, TimeUnixNano: masterpb.UnixNano(d.Time)}
}

// DecisionFrom is a decision from the protocol (DecisionPB's inverse).
func DecisionFrom(p *masterpb.Decision) Decision {
	d := Decision{Seq: p.GetSeq(), Rank: int(p.GetRank()), Pod: p.GetPod(), Host: p.GetHost(), Reason: p.GetReason(),
		Message: p.GetMessage(), Counted: p.GetCounted(), Time: masterpb.Time(p.GetTimeUnixNano())}
	if p.GetKind() == masterpb.Decision_STOP_JOB {
		d.Kind = StopJob
	} else {
		d.Kind = DecisionKind(p.GetKind())
	}
	return d
}

func (j *Job) jobRecord() *masterpb.StateRecord {
	return &masterpb.StateRecord{Record: &masterpb.StateRecord_Job{Job: &masterpb.JobRecord{
		Stopped: j.stopped, StopReason: j.stopReason, CheckRounds: j.checkRounds, DecisionSeq: j.decisionSeq}}}
}

func (j *Job) roundRecord() *masterpb.StateRecord {
	r := j.latest
	rr := &masterpb.RoundRecord{Number: r.Number, MasterAddr: r.MasterAddr, MasterPort: int32(r.MasterPort),
		CompletedUnixNano: masterpb.UnixNano(r.CompletedAt)}
	for i, rank := range r.Ranks {
		rr.Ranks = append(rr.Ranks, int32(rank))
		rr.LocalWorldSizes = append(rr.LocalWorldSizes, int32(r.LocalWorldSizes[i]))
	}
	return &masterpb.StateRecord{Record: &masterpb.StateRecord_Round{Round: rr}}
}

// dirtyRecords are the records of what changed.
func (j *Job) dirtyRecords(d Dirty) []*masterpb.StateRecord {
	var out []*masterpb.StateRecord
	if d.Job {
		out = append(out, j.jobRecord())
	}
	if d.Round && j.latest != nil {
		out = append(out, j.roundRecord())
	}
	ranks := make([]int, 0, len(d.Nodes))
	for r := range d.Nodes {
		ranks = append(ranks, r)
	}
	slices.Sort(ranks)
	for _, r := range ranks {
		if n, ok := j.nodes[r]; ok {
			out = append(out, j.nodeRecord(n))
		}
	}
	for _, r := range slices.Sorted(maps.Keys(d.Claims)) {
		out = append(out, j.claimRecord(r))
	}
	for _, dec := range d.Decisions {
		out = append(out, &masterpb.StateRecord{Record: &masterpb.StateRecord_Decision{Decision: DecisionPB(dec)}})
	}
	return out
}

// maxKeptDecisions bounds the decisions kept in a snapshot (the newest).
const maxKeptDecisions = 10000

// allRecords are every record of the job, for a snapshot.
func (j *Job) allRecords() []*masterpb.StateRecord {
	out := []*masterpb.StateRecord{j.jobRecord()}
	if j.latest != nil {
		out = append(out, j.roundRecord())
	}
	for _, n := range j.sortedNodes() {
		out = append(out, j.nodeRecord(n))
	}
	for _, r := range slices.Sorted(maps.Keys(j.claims)) {
		out = append(out, j.claimRecord(r))
	}
	ds := j.decisions
	if len(ds) > maxKeptDecisions {
		ds = ds[len(ds)-maxKeptDecisions:]
	}
	for _, dec := range ds {
		out = append(out, &masterpb.StateRecord{Record: &masterpb.StateRecord_Decision{Decision: DecisionPB(dec)}})
	}
	return out
}

// RestoreJob rebuilds a job from its records, as a restarted master does.
// Every live node, and every replacement waiting for its rank (a claim),
// gets a fresh heartbeat grace from now (the master was away, not them),
// and a claim its pend timeout again; a health check in progress starts
// over; waiting nodes are answered when they call again.
func RestoreJob(cfg Config, records []*masterpb.StateRecord, now time.Time) (*Job, error) {
	j, err := NewJob(cfg)
	if err != nil {
		return nil, err
	}
	for _, r := range records {
		switch x := r.GetRecord().(type) {
		case *masterpb.StateRecord_Job:
			j.stopped, j.stopReason = x.Job.GetStopped(), x.Job.GetStopReason()
			j.checkRounds, j.decisionSeq = x.Job.GetCheckRounds(), x.Job.GetDecisionSeq()
		case *masterpb.StateRecord_Round:
			rr := x.Round
			if len(rr.GetRanks()) != len(rr.GetLocalWorldSizes()) || len(rr.GetRanks()) == 0 {
				return nil, fmt.Errorf("%w: round %d has %d ranks and %d sizes", ErrBadState, rr.GetNumber(), len(rr.GetRanks()), len(rr.GetLocalWorldSizes()))
			}
			round := &Round{Number: rr.GetNumber(), MasterAddr: rr.GetMasterAddr(), MasterPort: int(rr.GetMasterPort()),
				CompletedAt: masterpb.Time(rr.GetCompletedUnixNano())}
			for i, rank := range rr.GetRanks() {
				round.Ranks = append(round.Ranks, int(rank))
				round.LocalWorldSizes = append(round.LocalWorldSizes, int(rr.GetLocalWorldSizes()[i]))
			}
			round.build()
			j.latest = round
		case *masterpb.StateRecord_Node:
			nr := x.Node
			n := &Node{NodeInfo: NodeInfo{Pod: nr.GetPod(), Incarnation: nr.GetIncarnation(), Rank: int(nr.GetRank()),
				LocalWorldSize: int(nr.GetLocalWorldSize()), Addr: nr.GetAddr(), Port: int(nr.GetPort()), Host: nr.GetHost()},
				State: NodeState(nr.GetState()), Round: nr.GetRound(), AfterRound: nr.GetAfterRound(), Checked: nr.GetChecked(),
				Relaunches: int(nr.GetRelaunches()), Relaunching: nr.GetRelaunching(), Exclusion: exclusionFrom(nr.GetExclusion()),
				JoinedAt: now, LastSeen: now}
			switch n.State {
			case Joining, Running, Succeeded, Failed:
			default:
				return nil, fmt.Errorf("%w: node %d has unknown state %q", ErrBadState, n.Rank, n.State)
			}
			if n.Rank < 0 || n.Rank >= j.cfg.MaxNodes {
				return nil, fmt.Errorf("%w: node rank %d outside [0, %d) of this job's --nnodes", ErrBadState, n.Rank, j.cfg.MaxNodes)
			}
			j.nodes[n.Rank] = n
			j.byPod[n.Pod] = n.Rank
			if f := nr.GetFenced(); len(f) > 0 {
				j.fenced[n.Rank] = slices.Clone(f[max(0, len(f)-maxFenced):])
			} else {
				delete(j.fenced, n.Rank)
			}
		case *masterpb.StateRecord_Decision:
			j.decisions = append(j.decisions, DecisionFrom(x.Decision))
		case *masterpb.StateRecord_Claim:
			if err := j.restoreClaim(x.Claim, now); err != nil {
				return nil, err
			}
		}
	}
	slices.SortFunc(j.decisions, func(a, b Decision) int { return int(a.Seq - b.Seq) })
	if n := len(j.decisions); n > 0 && j.decisions[n-1].Seq > j.decisionSeq {
		j.decisionSeq = j.decisions[n-1].Seq
	}
	j.lastJoin = now
	j.lastSweep = now
	j.recount()
	j.outdated = j.roundOutdated()
	return j, nil
}
