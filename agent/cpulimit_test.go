package agent

import (
	"os"
	"path/filepath"
	"testing"
)

// TestCgroupCPUs reads a container's CPU limit as the kubelet writes it,
// from cgroup trees laid out here as v1 (a cpu,cpuacct hierarchy, the
// pod's quota on the pod's folder, none on the container's), v2 (cpu.max
// on the way up) and a host with no quota.
func TestCgroupCPUs(t *testing.T) {
	root := t.TempDir()
	write := func(path, text string) {
		t.Helper()
		p := filepath.Join(root, path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("cpu,cpuacct/kubepods/pod1/cpu.cfs_quota_us", "10000\n")
	write("cpu,cpuacct/kubepods/pod1/cpu.cfs_period_us", "100000\n")
	write("cpu,cpuacct/kubepods/pod1/c1/cpu.cfs_quota_us", "-1\n")
	write("cpu,cpuacct/kubepods/pod1/c1/cpu.cfs_period_us", "100000\n")
	write("v2/kubepods/pod2/cpu.max", "150000 100000\n")
	write("v2/kubepods/pod2/c2/cpu.max", "max 100000\n")
	write("v2/kubepods/cpu.max", "max 100000\n")
	for _, tc := range []struct {
		name, root, self string
		want             float64
	}{
		{"v1", root, "4:memory:/kubepods/pod1/c1\n2:cpu,cpuacct:/kubepods/pod1/c1\n", 0.1},
		{"v2", filepath.Join(root, "v2"), "0::/kubepods/pod2/c2\n", 1.5},
		{"no quota", filepath.Join(root, "v2"), "0::/kubepods\n", 0},
		{"no cgroup file", root, "", 0},
		{"garbage", root, "x\n::\n2:cpu:../../etc\n", 0},
	} {
		if got := cgroupCPUs(tc.root, tc.self); got != tc.want {
			t.Errorf("%s: %v CPUs, want %v", tc.name, got, tc.want)
		}
	}
}
