package testenv_test

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/kfelastic/kfelastic/internal/test/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func TestMinIOGivesFreshBuckets(t *testing.T) {
	a, b := testenv.MinIO(t), testenv.MinIO(t)
	if a.Bucket == b.Bucket || a.Endpoint != b.Endpoint {
		t.Fatalf("buckets %s %s on %s %s", a.Bucket, b.Bucket, a.Endpoint, b.Endpoint)
	}
	ctx := context.Background()
	out, err := a.S3Client().ListBuckets(ctx, nil)
	if err != nil || len(out.Buckets) < 2 {
		t.Fatalf("list buckets: %v %v", out, err)
	}
}

// TestStopLeavesNoProcess starts a second, private server and checks Stop
// ends its whole process group, twice without harm.
func TestStopLeavesNoProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("MinIO: skipped under -short")
	}
	testenv.MinIO(t) // fails with a hint when the binary is missing
	p, err := testenv.StartMinIO(context.Background(), testenv.MinIOBinary())
	if err != nil {
		t.Fatal(err)
	}
	pid := p.PID()
	p.Stop()
	p.Stop()
	deadline := time.Now().Add(5 * time.Second)
	for syscall.Kill(-pid, 0) == nil {
		if time.Now().After(deadline) {
			t.Fatalf("process group %d still alive after Stop", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
