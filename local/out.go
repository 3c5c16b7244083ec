package local

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// NewOutFolder creates a job folder that did not exist: base, else base-2,
// base-3, … (two jobs started in the same second, whose default folders
// share a name, get one each), and returns its name. The folder is made
// with mkdir, which fails on an existing one, so no two callers get the
// same folder even at the same instant.
func NewOutFolder(base string) (string, error) {
	if err := os.MkdirAll(filepath.Dir(base), 0o755); err != nil {
		return "", err
	}
	for i := 1; i <= 1000; i++ {
		name := base
		if i > 1 {
			name = fmt.Sprintf("%s-%d", base, i)
		}
		err := os.Mkdir(name, 0o755)
		if err == nil {
			return name, nil
		}
		if !errors.Is(err, fs.ErrExist) {
			return "", err
		}
	}
	return "", fmt.Errorf("%s-2 to -1000 exist already: no new folder for the job", base)
}

// ErrOutInUse is the class of an output folder that is not new: a job
// starts in a folder that does not exist or is empty.
var ErrOutInUse = errors.New("output folder in use")

// claimOut makes dir the job's folder, for this job alone: it creates dir
// if it does not exist and refuses one that holds anything. A reused
// folder would give the new job the old one's master state (the old job's
// stopped rounds and store, replayed), token and documents (the old root
// cause, shown as the new job's); rather than deleting what a person
// pointed --out at, the job refuses to start. The claim itself is the
// token file, created exclusively: of two jobs started on the same empty
// folder at once, one starts and the other is refused.
func claimOut(dir, token string) (tokenPath string, err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	refused := func(what string) error {
		return fmt.Errorf("%w: --out %s %s; kfelastic local starts each job in a new or empty folder, so that no job "+
			"reloads another's master state, token or error documents: give another --out, or none (a new folder under ./out)",
			ErrOutInUse, dir, what)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", err
	}
	if len(entries) > 0 {
		what := "is not empty"
		if _, err := os.Lstat(filepath.Join(dir, "state")); err == nil {
			what = "holds an earlier job (state/)"
		}
		return "", refused(what)
	}
	tokenPath = filepath.Join(dir, "token")
	f, err := os.OpenFile(tokenPath, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return "", refused("was just taken by another job")
	}
	if err != nil {
		return "", err
	}
	if _, err := f.WriteString(token + "\n"); err != nil {
		f.Close()
		return "", err
	}
	return tokenPath, f.Close()
}
