package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
)

// installName is the file install writes in its folder; kfoperator's
// AgentBinary is AgentBinDir + "/" + installName.
const installName = "kfelastic"

func init() { rootCmd.AddCommand(newInstallCmd()) }

func newInstallCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "install DIR",
		Short: "Copy this binary to DIR/kfelastic (the elastic pods' init container)",
		Long: `install copies the running binary to DIR/kfelastic, mode 0755. The plugin's
init container runs "/kfelastic install /kfelastic-bin" in the agent image to put the
agent into the training container through a shared volume; the binary copies itself,
so the image needs nothing else (FROM scratch, no cp).

The copy is atomic: a temporary file in DIR, synced, renamed over DIR/kfelastic, so a
reader never sees half a binary. Running it again replaces the file with the same
content. DIR must exist.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			self, err := os.Executable()
			if err != nil {
				return fmt.Errorf("install: cannot find this binary: %w", err)
			}
			dst, n, err := installBinary(self, args[0])
			if err != nil {
				return err
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "installed %s (%d bytes)\n", dst, n)
			return err
		},
	}
}

// installBinary copies src to dir/kfelastic through a temporary file in dir
// (same filesystem, so the rename is atomic), mode 0755, synced before the
// rename. It returns the destination and the bytes written; on error
// nothing is left behind but what was there before.
func installBinary(src, dir string) (dst string, n int64, err error) {
	st, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "", 0, fmt.Errorf("install: folder %s does not exist (the init container mounts the shared volume there)", dir)
	case err != nil:
		return "", 0, fmt.Errorf("install: %w", err)
	case !st.IsDir():
		return "", 0, fmt.Errorf("install: %s is not a folder", dir)
	}
	in, err := os.Open(src)
	if err != nil {
		return "", 0, fmt.Errorf("install: open this binary: %w", err)
	}
	defer in.Close()
	dst = filepath.Join(dir, installName)
	tmp, err := os.CreateTemp(dir, "."+installName+"-install-*")
	if err != nil {
		return "", 0, fmt.Errorf("install: cannot write in %s: %w", dir, err)
	}
	defer func() {
		if err != nil {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()
	if n, err = io.Copy(tmp, in); err != nil {
		return "", 0, fmt.Errorf("install: copy %s to %s: %w", src, tmp.Name(), err)
	}
	// Chmod, not the create mode: the umask must not take the x bits.
	if err = tmp.Chmod(0o755); err != nil {
		return "", 0, fmt.Errorf("install: %w", err)
	}
	if err = tmp.Sync(); err != nil {
		return "", 0, fmt.Errorf("install: sync %s: %w", tmp.Name(), err)
	}
	if err = tmp.Close(); err != nil {
		return "", 0, fmt.Errorf("install: %w", err)
	}
	if err = os.Rename(tmp.Name(), dst); err != nil {
		return "", 0, fmt.Errorf("install: %w", err)
	}
	// The rename is durable once the folder is synced; some filesystems
	// refuse to sync a folder, and the file itself already is.
	if d, e := os.Open(dir); e == nil {
		_ = d.Sync()
		_ = d.Close()
	}
	return dst, n, nil
}
