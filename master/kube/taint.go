package kube

import (
	"context"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
)

// UnhealthyTaint is the taint the owner puts on a node a pod was taken off
// for a fault of the node (Config.TaintNodes): NoSchedule, its value the
// failure's code, so that no other workload lands on the machine either
// until someone looks at it and removes the taint.
const UnhealthyTaint = "kfelastic.io/unhealthy"

// taintValue is code as a taint value (a label value: at most 63
// characters of [A-Za-z0-9._-]).
func taintValue(code string) string {
	v := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-' {
			return r
		}
		return '_'
	}, code)
	if len(v) > 63 {
		v = v[:63]
	}
	return strings.Trim(v, "._-")
}

// addTaint adds UnhealthyTaint=value:NoSchedule to a node object unless it
// has UnhealthyTaint already (the first fault's code stays).
func addTaint(n object, value string) (changed bool) {
	spec := ensure(n, "spec")
	taints, _ := spec["taints"].([]any)
	for _, t := range taints {
		if m, ok := t.(map[string]any); ok && m["key"] == UnhealthyTaint {
			return false
		}
	}
	spec["taints"] = append(taints, object{"key": UnhealthyTaint, "value": value, "effect": "NoSchedule"})
	return true
}

// taintNode puts UnhealthyTaint on host, best effort: the relaunch's
// anti-affinity already keeps the job off it; the taint keeps everyone
// else off too. It needs get and update on nodes, which only a ClusterRole
// grants (the plugin's Role does not): a refusal is logged, once, with
// what to grant.
func (o *Owner) taintNode(ctx context.Context, host, code string, log *slog.Logger) {
	if o.taintForbidden.Load() {
		return
	}
	path := "/api/v1/nodes/" + url.PathEscape(host)
	for attempt := 0; attempt < 5; attempt++ {
		var n object
		err := o.c.do(ctx, http.MethodGet, path, nil, nil, &n)
		if err == nil {
			if !addTaint(n, taintValue(code)) {
				log.Info("node already tainted", "node", host, "taint", UnhealthyTaint)
				return
			}
			// The object's resourceVersion makes the update conditional.
			err = o.c.do(ctx, http.MethodPut, path, nil, n, nil)
		}
		switch {
		case err == nil:
			log.Warn("node tainted: no pod that does not tolerate it is scheduled there until the taint is removed", "node", host,
				"taint", UnhealthyTaint+"="+taintValue(code)+":NoSchedule", "remove_with", "kubectl taint nodes "+host+" "+UnhealthyTaint+"-")
			return
		case isConflict(err):
			continue
		case isStatus(err, http.StatusForbidden):
			o.taintForbidden.Store(true)
			log.Error("cannot taint the failed node: the master's service account needs get and update on nodes (a ClusterRole); the relaunch avoids the node all the same",
				"node", host, "err", err)
			return
		default:
			log.Warn("cannot taint the failed node; the relaunch avoids it all the same", "node", host, "err", err)
			return
		}
	}
	log.Warn("cannot taint the failed node: it kept changing under the update", "node", host)
}
