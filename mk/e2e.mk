# End to end (e2e/): a real flytepropeller with the plugin
# (cmd/flytepropeller-kfelastic, built into $(CACHE)/propeller by the tests)
# runs FlyteWorkflows compiled by propeller's own compiler. `make test`
# includes them (./...); this runs them alone.
.PHONY: e2e flytepropeller

e2e: deps
	$(GO) test -count=1 -timeout 30m ./e2e/...

# The propeller binary alone, for running it by hand:
# bin/flytepropeller-kfelastic --config propeller.yaml
flytepropeller:
	$(GO) build -o bin/flytepropeller-kfelastic ./cmd/flytepropeller-kfelastic
