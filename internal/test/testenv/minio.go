package testenv

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// Credentials and region of every server started here. They are also put in
// the process environment (AWS_ACCESS_KEY_ID, …) so that gocloud.dev's s3blob
// and any other AWS SDK client find them.
const (
	MinIOAccessKey = "kfelastic"
	MinIOSecretKey = "kfelastic-secret"
	MinIORegion    = "us-east-1"
)

// CacheDir is $KFELASTIC_CACHE, default ~/.cache/kfelastic.
func CacheDir() string {
	if d := os.Getenv("KFELASTIC_CACHE"); d != "" {
		return d
	}
	home, err := os.UserHomeDir()
	if err != nil {
		home = "/root"
	}
	return filepath.Join(home, ".cache", "kfelastic")
}

// MinIOBinary is where scripts/deps.sh puts the minio server.
func MinIOBinary() string { return filepath.Join(CacheDir(), "bin", "minio") }

// MinIOProcess is one running MinIO server on a loopback port with its data
// in a temporary directory.
type MinIOProcess struct {
	// Endpoint is the server's base URL, http://127.0.0.1:<port>.
	Endpoint string
	cmd      *exec.Cmd
	dir      string
	log      *syncWriter
	stopOnce sync.Once
	exited   chan struct{}
}

// StartMinIO starts binary on a free loopback port and waits until it is
// ready. It is the non-test entry point (the benchmark uses it); tests use
// MinIO. The server runs in its own process group and gets SIGKILL if this
// process dies; Stop ends it.
func StartMinIO(ctx context.Context, binary string) (*MinIOProcess, error) {
	return StartMinIOOn(ctx, binary, "127.0.0.1")
}

// StartMinIOOn is StartMinIO on host's address (the one-node cluster's pods
// reach the host at ClusterNodeIP, not on loopback).
func StartMinIOOn(ctx context.Context, binary, host string) (*MinIOProcess, error) {
	return StartMinIOAt(ctx, binary, host, "")
}

// StartMinIOAt is StartMinIOOn with its data in dir, made empty first ("":
// a new temporary folder); Stop removes it.
func StartMinIOAt(ctx context.Context, binary, host, dir string) (*MinIOProcess, error) {
	if _, err := os.Stat(binary); err != nil {
		return nil, fmt.Errorf("minio server %s: %w (run scripts/deps.sh minio)", binary, err)
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	console, err := freePort()
	if err != nil {
		return nil, err
	}
	if dir == "" {
		if dir, err = os.MkdirTemp("", "kfelastic-minio-"); err != nil {
			return nil, err
		}
	} else if err := os.RemoveAll(dir); err != nil {
		return nil, err
	} else if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	addr := net.JoinHostPort(host, strconv.Itoa(port))
	p := &MinIOProcess{Endpoint: "http://" + addr, dir: dir, log: &syncWriter{w: &bytes.Buffer{}}, exited: make(chan struct{})}
	cmd := exec.Command(binary, "server", "--quiet", "--address", addr,
		"--console-address", net.JoinHostPort(host, strconv.Itoa(console)), filepath.Join(dir, "data"))
	cmd.Env = append(os.Environ(),
		"MINIO_ROOT_USER="+MinIOAccessKey,
		"MINIO_ROOT_PASSWORD="+MinIOSecretKey,
		"MINIO_BROWSER=off",
		"MINIO_UPDATE=off",
	)
	cmd.Stdout, cmd.Stderr = p.log, p.log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("start minio: %w", err)
	}
	p.cmd = cmd
	go func() { _ = cmd.Wait(); close(p.exited) }()
	if err := p.waitReady(ctx, 30*time.Second); err != nil {
		p.Stop()
		return nil, err
	}
	return p, nil
}

func (p *MinIOProcess) waitReady(ctx context.Context, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	client := &http.Client{Timeout: time.Second}
	for {
		resp, err := client.Get(p.Endpoint + "/minio/health/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-p.exited:
			return fmt.Errorf("minio exited before it was ready: %s", p.log.String())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("minio not ready after %v: %s", limit, p.log.String())
		}
	}
}

// Stop terminates the server's process group (SIGTERM, then SIGKILL after
// 5s) and removes its data. It is idempotent.
func (p *MinIOProcess) Stop() {
	p.stopOnce.Do(func() {
		if p.cmd != nil && p.cmd.Process != nil {
			_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
			select {
			case <-p.exited:
			case <-time.After(5 * time.Second):
				_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
				<-p.exited
			}
		}
		os.RemoveAll(p.dir)
	})
}

// S3Client is an AWS SDK client for the server.
func (p *MinIOProcess) S3Client() *s3.Client {
	return s3.New(s3.Options{
		Region:       MinIORegion,
		BaseEndpoint: aws.String(p.Endpoint),
		UsePathStyle: true,
		Credentials:  credentials.NewStaticCredentialsProvider(MinIOAccessKey, MinIOSecretKey, ""),
	})
}

// CreateBucket makes a new bucket named name.
func (p *MinIOProcess) CreateBucket(ctx context.Context, name string) error {
	_, err := p.S3Client().CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(name)})
	if err != nil {
		return fmt.Errorf("create bucket %s: %w", name, err)
	}
	return nil
}

// URL is the gocloud.dev URL of prefix (may be "") in bucket on this server.
func (p *MinIOProcess) URL(bucket, prefix string) string {
	q := url.Values{}
	q.Set("endpoint", p.Endpoint)
	q.Set("region", MinIORegion)
	q.Set("use_path_style", "true")
	q.Set("disable_https", "true")
	u := url.URL{Scheme: "s3", Host: bucket, Path: "/" + prefix, RawQuery: q.Encode()}
	if prefix == "" {
		u.Path = ""
	}
	return u.String()
}

// SetCredentialEnv puts the server's credentials into the process environment
// for the AWS SDKs (gocloud.dev's s3blob reads them from there).
func SetCredentialEnv() {
	os.Setenv("AWS_ACCESS_KEY_ID", MinIOAccessKey)
	os.Setenv("AWS_SECRET_ACCESS_KEY", MinIOSecretKey)
	os.Setenv("AWS_REGION", MinIORegion)
	os.Setenv("AWS_EC2_METADATA_DISABLED", "true")
}

// MinIOServer is what a test gets from MinIO: the shared server and a bucket
// of its own.
type MinIOServer struct {
	*MinIOProcess
	// Bucket is fresh for each MinIO call.
	Bucket string
	// URL opens the bucket with gocloud.dev: s3://<bucket>?endpoint=…&region=us-east-1&use_path_style=true&disable_https=true
	URL string
	// AccessKey and SecretKey are also in the environment (AWS_ACCESS_KEY_ID, …).
	AccessKey, SecretKey, Region string
}

var shared struct {
	once sync.Once
	p    *MinIOProcess
	err  error
}

// MinIO returns the test process's MinIO server, started on first use, and a
// fresh bucket on it. It skips under -short and fails with a hint when the
// binary is missing. Use Main in TestMain so the server stops at the end.
func MinIO(t testing.TB) *MinIOServer {
	t.Helper()
	if testing.Short() {
		t.Skip("MinIO: skipped under -short")
	}
	bin := MinIOBinary()
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("MinIO server binary missing at %s: run scripts/deps.sh minio (or make deps)", bin)
	}
	shared.once.Do(func() {
		SetCredentialEnv()
		shared.p, shared.err = StartMinIO(context.Background(), bin)
	})
	if shared.err != nil {
		t.Fatalf("MinIO: %v", shared.err)
	}
	var r [6]byte
	_, _ = rand.Read(r[:])
	bucket := "test-" + hex.EncodeToString(r[:])
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := shared.p.CreateBucket(ctx, bucket); err != nil {
		t.Fatalf("MinIO: %v", err)
	}
	return &MinIOServer{
		MinIOProcess: shared.p, Bucket: bucket, URL: shared.p.URL(bucket, ""),
		AccessKey: MinIOAccessKey, SecretKey: MinIOSecretKey, Region: MinIORegion,
	}
}

// freePort asks the kernel for a free loopback port.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// syncWriter serializes the server's stdout and stderr into one buffer.
type syncWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (s *syncWriter) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.String()
}

func (s *syncWriter) Write(b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.w.Len() > 64<<10 {
		return len(b), nil // keep the start; minio is quiet unless failing
	}
	return s.w.Write(b)
}

// PID is the server's process id, which is also its process group id.
func (p *MinIOProcess) PID() int { return p.cmd.Process.Pid }
