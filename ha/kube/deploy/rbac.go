// rbac.yaml, embedded.

package deploy

import _ "embed"

// RBAC is rbac.yaml.
//
//go:embed rbac.yaml
var RBAC []byte
