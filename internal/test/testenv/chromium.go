package testenv

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
)

// ChromiumBinary is Debian's chromium (scripts/deps.sh installs it), or
// $KFELASTIC_CHROMIUM.
func ChromiumBinary() string {
	if b := os.Getenv("KFELASTIC_CHROMIUM"); b != "" {
		return b
	}
	if b, err := exec.LookPath("chromium"); err == nil {
		return b
	}
	return "/usr/bin/chromium"
}

// chromiumFlags keep a headless Chromium to itself: no sandbox (tests run as
// root), no GPU, and nothing that reaches the network on its own.
var chromiumFlags = []string{
	"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
	"--disable-background-networking", "--disable-component-update", "--disable-sync",
	"--disable-dev-shm-usage", "--hide-scrollbars", "--mute-audio",
	"--remote-debugging-pipe",
}

// Browser is a headless Chromium driven through the DevTools protocol over
// a pipe (--remote-debugging-pipe: JSON messages ending in NUL on fds 3 and
// 4), so that no port is opened and no websocket library is needed.
type Browser struct {
	cmd    *exec.Cmd
	send   *os.File
	log    *syncWriter
	exited chan struct{}

	mu      sync.Mutex
	nextID  int
	pending map[int]chan cdpReply
	waiters []*cdpWaiter
	readErr error
	closed  sync.Once
}

type cdpReply struct {
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

type cdpMessage struct {
	ID        int             `json:"id"`
	Method    string          `json:"method"`
	SessionID string          `json:"sessionId"`
	Params    json.RawMessage `json:"params"`
	cdpReply
}

type cdpWaiter struct {
	session, method string
	ch              chan struct{}
}

// Chromium starts a fresh headless Chromium (its own --user-data-dir) for
// the test and stops it at the end. Under -short it skips the test with a
// note; without the binary it fails with a hint.
func Chromium(t testing.TB) *Browser {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: the browser test needs headless Chromium (scripts/deps.sh apt installs it)")
	}
	bin := ChromiumBinary()
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("chromium %s: %v (run scripts/deps.sh apt)", bin, err)
	}
	b, err := StartChromium(bin, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	return b
}

// StartChromium starts binary with its profile in dir.
func StartChromium(binary, dir string) (*Browser, error) {
	toBrowser, send, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	recv, fromBrowser, err := os.Pipe()
	if err != nil {
		toBrowser.Close()
		send.Close()
		return nil, err
	}
	args := append(append([]string{}, chromiumFlags...), "--user-data-dir="+filepath.Join(dir, "profile"), "about:blank")
	cmd := exec.Command(binary, args...)
	cmd.ExtraFiles = []*os.File{toBrowser, fromBrowser} // fds 3 and 4
	b := &Browser{cmd: cmd, send: send, log: &syncWriter{w: &bytes.Buffer{}}, exited: make(chan struct{}), pending: map[int]chan cdpReply{}}
	cmd.Stdout, cmd.Stderr = b.log, b.log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	err = cmd.Start()
	toBrowser.Close()
	fromBrowser.Close()
	if err != nil {
		send.Close()
		recv.Close()
		return nil, fmt.Errorf("start chromium: %w", err)
	}
	go func() { _ = cmd.Wait(); close(b.exited) }()
	go b.read(recv)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := b.Call(ctx, "", "Browser.getVersion", nil, nil); err != nil {
		b.Close()
		return nil, fmt.Errorf("chromium did not answer: %w\n%s", err, b.log.String())
	}
	return b, nil
}

func (b *Browser) read(r io.ReadCloser) {
	defer r.Close()
	br := bufio.NewReaderSize(r, 1<<20)
	var err error
	for {
		var line []byte
		line, err = br.ReadBytes(0)
		if err != nil {
			break
		}
		var m cdpMessage
		if json.Unmarshal(line[:len(line)-1], &m) != nil {
			continue
		}
		b.mu.Lock()
		if m.ID != 0 {
			if ch, ok := b.pending[m.ID]; ok {
				delete(b.pending, m.ID)
				ch <- m.cdpReply
			}
		} else {
			kept := b.waiters[:0]
			for _, w := range b.waiters {
				if w.method == m.Method && w.session == m.SessionID {
					close(w.ch)
				} else {
					kept = append(kept, w)
				}
			}
			b.waiters = kept
		}
		b.mu.Unlock()
	}
	b.mu.Lock()
	b.readErr = fmt.Errorf("chromium closed the pipe: %v", err)
	for id, ch := range b.pending {
		delete(b.pending, id)
		close(ch)
	}
	b.mu.Unlock()
}

// Call sends one command (in session, "" for the browser) and decodes its
// result into result (may be nil).
func (b *Browser) Call(ctx context.Context, session, method string, params, result any) error {
	b.mu.Lock()
	if b.readErr != nil {
		b.mu.Unlock()
		return b.readErr
	}
	b.nextID++
	id := b.nextID
	ch := make(chan cdpReply, 1)
	b.pending[id] = ch
	b.mu.Unlock()
	msg := map[string]any{"id": id, "method": method}
	if params != nil {
		msg["params"] = params
	}
	if session != "" {
		msg["sessionId"] = session
	}
	data, err := json.Marshal(msg)
	if err != nil {
		return err
	}
	if _, err := b.send.Write(append(data, 0)); err != nil {
		return fmt.Errorf("%s: %w", method, err)
	}
	select {
	case r, ok := <-ch:
		switch {
		case !ok:
			return fmt.Errorf("%s: chromium went away\n%s", method, b.log.String())
		case r.Error != nil:
			return fmt.Errorf("%s: %s (%d)", method, r.Error.Message, r.Error.Code)
		case result != nil:
			return json.Unmarshal(r.Result, result)
		}
		return nil
	case <-ctx.Done():
		b.mu.Lock()
		delete(b.pending, id)
		b.mu.Unlock()
		return fmt.Errorf("%s: %w", method, ctx.Err())
	}
}

// expect registers interest in the next event method of session; the
// returned channel closes when it arrives.
func (b *Browser) expect(session, method string) <-chan struct{} {
	w := &cdpWaiter{session: session, method: method, ch: make(chan struct{})}
	b.mu.Lock()
	b.waiters = append(b.waiters, w)
	b.mu.Unlock()
	return w.ch
}

// Page is one tab.
type Page struct {
	b       *Browser
	session string
}

// Open loads url in a new tab of width×height CSS pixels and waits for its
// load event.
func (b *Browser) Open(ctx context.Context, url string, width, height int) (*Page, error) {
	var target struct {
		TargetID string `json:"targetId"`
	}
	if err := b.Call(ctx, "", "Target.createTarget", map[string]any{"url": "about:blank"}, &target); err != nil {
		return nil, err
	}
	var attached struct {
		SessionID string `json:"sessionId"`
	}
	if err := b.Call(ctx, "", "Target.attachToTarget", map[string]any{"targetId": target.TargetID, "flatten": true}, &attached); err != nil {
		return nil, err
	}
	p := &Page{b: b, session: attached.SessionID}
	if err := b.Call(ctx, p.session, "Page.enable", nil, nil); err != nil {
		return nil, err
	}
	if err := b.Call(ctx, p.session, "Emulation.setDeviceMetricsOverride",
		map[string]any{"width": width, "height": height, "deviceScaleFactor": 1, "mobile": false}, nil); err != nil {
		return nil, err
	}
	loaded := b.expect(p.session, "Page.loadEventFired")
	var nav struct {
		ErrorText string `json:"errorText"`
	}
	if err := b.Call(ctx, p.session, "Page.navigate", map[string]any{"url": url}, &nav); err != nil {
		return nil, err
	}
	if nav.ErrorText != "" {
		return nil, fmt.Errorf("navigate %s: %s", url, nav.ErrorText)
	}
	select {
	case <-loaded:
		return p, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("load %s: %w", url, ctx.Err())
	}
}

// Eval evaluates a JavaScript expression in the page (DevTools' own
// evaluation: the page's Content-Security-Policy does not apply) and
// decodes its JSON value into out.
func (p *Page) Eval(ctx context.Context, expr string, out any) error {
	var r struct {
		Result struct {
			Value json.RawMessage `json:"value"`
		} `json:"result"`
		ExceptionDetails *struct {
			Text      string `json:"text"`
			Exception struct {
				Description string `json:"description"`
			} `json:"exception"`
		} `json:"exceptionDetails"`
	}
	if err := p.b.Call(ctx, p.session, "Runtime.evaluate", map[string]any{"expression": expr, "returnByValue": true}, &r); err != nil {
		return err
	}
	if e := r.ExceptionDetails; e != nil {
		return fmt.Errorf("evaluate: %s %s", e.Text, e.Exception.Description)
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(r.Result.Value, out)
}

// Screenshot is a PNG of the viewport, or of the whole page when full.
func (p *Page) Screenshot(ctx context.Context, full bool) ([]byte, error) {
	var r struct {
		Data string `json:"data"`
	}
	if err := p.b.Call(ctx, p.session, "Page.captureScreenshot", map[string]any{"format": "png", "captureBeyondViewport": full}, &r); err != nil {
		return nil, err
	}
	return base64.StdEncoding.DecodeString(r.Data)
}

// Close ends the browser (politely, then its process group with SIGKILL).
// It is idempotent.
func (b *Browser) Close() {
	b.closed.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		_ = b.Call(ctx, "", "Browser.close", nil, nil)
		cancel()
		select {
		case <-b.exited:
		case <-time.After(5 * time.Second):
		}
		_ = syscall.Kill(-b.cmd.Process.Pid, syscall.SIGKILL)
		<-b.exited
		b.send.Close()
	})
}
