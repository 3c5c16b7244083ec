# End to end (e2e/): a real flytepropeller with the plugin
# (cmd/flytepropeller-kfelastic, built into $(CACHE)/propeller by the tests)
# runs FlyteWorkflows compiled by propeller's own compiler. `make test`
# includes them (./...); this runs them alone.
.PHONY: e2e flytepropeller

e2e: deps
	$(GO) test -count=1 -timeout 45m ./e2e/...

# The propeller binary alone, for running it by hand:
# bin/flytepropeller-kfelastic --config propeller.yaml
flytepropeller:
	$(GO) build -o bin/flytepropeller-kfelastic ./cmd/flytepropeller-kfelastic

# E3's and E4's faults (worker 1's, worker 0's pod deleted under a flytekit-style task) through
# propeller with our plugin and, in the same run, with flyteplugins' own
# PyTorch plugin and plain torch elastic (e2e/bench_test.go).
BENCHES += e2e
.PHONY: bench-e2e
bench-e2e: deps
	KFELASTIC_BENCH_E2E=1 $(GO) test -count=1 -timeout 45m -run TestBenchPodDeletedBesideUpstream -v ./e2e/
