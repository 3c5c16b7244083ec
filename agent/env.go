package agent

import (
	"context"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kfelastic/kfelastic/agent/guardian"
)

// RoleName is torchrun's default role, the only one the agent runs.
const RoleName = "default"

// ProgressFileEnv names the file a worker may touch to tell the hang
// watchdog it is alive (besides printing output).
const ProgressFileEnv = "KFELASTIC_PROGRESS_FILE"

// workerSpec is what varies per worker in its environment.
type workerSpec struct {
	group        StartGroup
	localRank    int
	localWorkers int
	maxRestarts  int
	pod          string
	errorFile    string
	progressFile string
	// storePort, when not 0, is global rank 0's MASTER_PORT: the private
	// port its store binds behind the agent's store proxy (agent/storeproxy).
	storePort int
	// mark is the attempt's KFELASTIC_AGENT value (agent/guardian).
	mark string
	// torch2: the workers' torch is 2.x (torchVersion), whose torchrun
	// gives its workers other variables than 1.13's.
	torch2 bool
}

// WorkerEnv is base (the agent's own environment) plus torchrun's worker
// variables (torch 1.13 LocalElasticAgent._start_workers and
// start_processes), plus the Flyte and kfelastic ones:
//
//   - LOCAL_RANK RANK GROUP_RANK ROLE_RANK ROLE_NAME LOCAL_WORLD_SIZE
//     WORLD_SIZE GROUP_WORLD_SIZE ROLE_WORLD_SIZE MASTER_ADDR MASTER_PORT
//     TORCHELASTIC_RESTART_COUNT TORCHELASTIC_MAX_RESTARTS TORCHELASTIC_RUN_ID
//     TORCHELASTIC_USE_AGENT_STORE TORCHELASTIC_ERROR_FILE as torchrun;
//     USE_AGENT_STORE is False: the agent hosts no store, the rank-0 worker
//     creates it (as with torch 1.13's torchrun and c10d backend; torch
//     2.x's torchrun says True, its own agent hosting the workers' store,
//     and both ways work with init_process_group's env://); with the store
//     proxy (the default) global rank 0's MASTER_PORT is a private port and
//     the round's MASTER_PORT is the proxy's, where torchrun gives all
//     ranks the same port;
//   - NCCL_ASYNC_ERROR_HANDLING defaults to 1, as torchrun 1.13; on torch
//     2.x, TORCH_NCCL_ASYNC_ERROR_HANDLING does, and
//     TORCHELASTIC_SIGNALS_TO_HANDLE is torchrun's default
//     (SIGTERM,SIGINT,SIGHUP,SIGQUIT), as torchrun 2.x sets them;
//   - OMP_NUM_THREADS=1 when unset and more than one local worker, as
//     torchrun's run.py does to its own environment;
//   - PYTHONUNBUFFERED=1 when unset: torchrun runs "python -u", we run any
//     command, and line-by-line output feeds the hang watchdog and the logs;
//   - _F_WN=<pod>/<local rank> and _F_DES=Earliest so that flytekit writes
//     one error document per worker (the long names too, when inherited);
//   - KFELASTIC_PROGRESS_FILE, the file the hang watchdog watches;
//   - KFELASTIC_AGENT=<agent id>/<attempt>, the mark by which the agent
//     and its guardian find every process the workers started (package
//     guardian).
func WorkerEnv(base []string, w workerSpec) []string {
	env := envMap(base)
	r := w.group.Round
	rank := r.FirstGlobalRank + w.localRank
	set := map[string]string{
		"LOCAL_RANK":                   strconv.Itoa(w.localRank),
		"RANK":                         strconv.Itoa(rank),
		"GROUP_RANK":                   strconv.Itoa(r.GroupRank),
		"ROLE_RANK":                    strconv.Itoa(rank),
		"ROLE_NAME":                    RoleName,
		"LOCAL_WORLD_SIZE":             strconv.Itoa(w.localWorkers),
		"WORLD_SIZE":                   strconv.Itoa(r.WorldSize),
		"GROUP_WORLD_SIZE":             strconv.Itoa(r.GroupWorldSize),
		"ROLE_WORLD_SIZE":              strconv.Itoa(r.WorldSize),
		"MASTER_ADDR":                  r.MasterAddr,
		"MASTER_PORT":                  strconv.Itoa(r.MasterPort),
		"TORCHELASTIC_RESTART_COUNT":   strconv.Itoa(w.group.RestartCount),
		"TORCHELASTIC_MAX_RESTARTS":    strconv.Itoa(w.maxRestarts),
		"TORCHELASTIC_RUN_ID":          r.RunID,
		"TORCHELASTIC_USE_AGENT_STORE": "False",
		"TORCHELASTIC_ERROR_FILE":      w.errorFile,
		"_F_WN":                        workerName(w.pod, w.localRank),
		"_F_DES":                       "Earliest",
		ProgressFileEnv:                w.progressFile,
	}
	if w.mark != "" {
		set[guardian.MarkEnv] = w.mark
	}
	if rank == 0 && w.storePort != 0 {
		set["MASTER_PORT"] = strconv.Itoa(w.storePort)
	}
	// The training operator's PET_NODE_RANK counts from 1 beside a Master
	// replica; a worker that reads it sees the node rank it runs as.
	if _, ok := env["PET_NODE_RANK"]; ok {
		set["PET_NODE_RANK"] = strconv.Itoa(r.GroupRank)
	}
	if _, ok := env["FLYTE_INTERNAL_WORKER_NAME"]; ok {
		set["FLYTE_INTERNAL_WORKER_NAME"] = set["_F_WN"]
	}
	if _, ok := env["FLYTE_INTERNAL_DIST_ERROR_STRATEGY"]; ok {
		set["FLYTE_INTERNAL_DIST_ERROR_STRATEGY"] = "Earliest"
	}
	setDefaults(env, w.localWorkers, w.torch2)
	for k, v := range set {
		env[k] = v
	}
	return envList(env)
}

// setDefaults sets in env the variables WorkerEnv gives a worker when the
// agent's environment lacks them.
func setDefaults(env map[string]string, localWorkers int, torch2 bool) {
	defaults := map[string]string{"NCCL_ASYNC_ERROR_HANDLING": "1", "PYTHONUNBUFFERED": "1"}
	if torch2 {
		defaults = map[string]string{"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "PYTHONUNBUFFERED": "1",
			"TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP,SIGQUIT"}
	}
	if localWorkers > 1 {
		defaults["OMP_NUM_THREADS"] = "1"
	}
	for k, v := range defaults {
		if _, ok := env[k]; !ok {
			env[k] = v
		}
	}
}

// envMap is an environment (KEY=value lines) as a map.
func envMap(env []string) map[string]string {
	m := make(map[string]string, len(env))
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok {
			m[k] = v
		}
	}
	return m
}

// serverEnv is the fork server's environment: base with the workers'
// defaults, which matter while it imports (OpenMP reads OMP_NUM_THREADS
// when torch loads it), and without base's own mark.
func serverEnv(base []string, localWorkers int, torch2 bool) []string {
	env := envMap(base)
	setDefaults(env, localWorkers, torch2)
	delete(env, guardian.MarkEnv)
	return envList(env)
}

// envList is envMap's inverse, sorted.
func envList(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	slices.Sort(out)
	return out
}

// freePort returns a TCP port free on all interfaces now. Like torchrun's
// _get_socket_with_port it closes the socket before the worker binds it.
func freePort() (int, error) {
	l, err := net.Listen("tcp", ":0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// hostFQDN mirrors Python's socket.getfqdn(socket.gethostname()), which
// torchrun uses for MASTER_ADDR: the first name of the host's address that
// contains a dot, else the first name, else the hostname.
func hostFQDN(ctx context.Context) string {
	host, err := os.Hostname()
	if err != nil {
		return "localhost"
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	addrs, err := net.DefaultResolver.LookupHost(ctx, host)
	if err != nil || len(addrs) == 0 {
		return host
	}
	names, err := net.DefaultResolver.LookupAddr(ctx, addrs[0])
	if err != nil || len(names) == 0 {
		return host
	}
	for _, n := range names {
		if n = strings.TrimSuffix(n, "."); strings.Contains(n, ".") {
			return n
		}
	}
	return strings.TrimSuffix(names[0], ".")
}

// torchVersionProbe prints the version of the torch an interpreter would
// import, read from torch/version.py without importing torch (a second or
// more), or nothing.
const torchVersionProbe = `import importlib.util, os, re
s = importlib.util.find_spec("torch")
v = ""
for d in (s and s.submodule_search_locations) or []:
    try:
        with open(os.path.join(d, "version.py")) as f:
            v = re.search(r"__version__\s*=\s*['\"]([^'\"]+)", f.read()).group(1)
        break
    except (OSError, AttributeError):
        pass
print(v)
`

// torchVersion is the version of the torch the command's interpreter
// (InterpreterOf) would import, "" when there is none or it cannot be told
// within limit: the workers' environment follows that torch's torchrun.
func torchVersion(ctx context.Context, command []string, env []string, limit time.Duration) string {
	py := InterpreterOf(command)
	if py == "" {
		return ""
	}
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, py, "-c", torchVersionProbe)
	cmd.Env = env
	out, err := cmd.Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

// isTorch2 reports whether a torch version is 2.x or later.
func isTorch2(v string) bool {
	major, _, _ := strings.Cut(v, ".")
	n, err := strconv.Atoi(major)
	return err == nil && n >= 2
}
