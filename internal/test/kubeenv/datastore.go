package kubeenv

import (
	"github.com/flyteorg/flyte/flytestdlib/storage"

	"github.com/kfelastic/kfelastic/internal/test/testenv"
)

// DataStoreConfig is flytestdlib's storage configuration for bucket on the
// MinIO server p, as a propeller pointed at it would have (stow kind "s3").
func DataStoreConfig(p *testenv.MinIOProcess, bucket string) *storage.Config {
	return &storage.Config{
		Type:          storage.TypeStow,
		InitContainer: bucket,
		Stow: storage.StowConfig{Kind: "s3", Config: map[string]string{
			"auth_type":     "accesskey",
			"access_key_id": testenv.MinIOAccessKey,
			"secret_key":    testenv.MinIOSecretKey,
			"region":        testenv.MinIORegion,
			"endpoint":      p.Endpoint,
			"disable_ssl":   "true",
		}},
	}
}
