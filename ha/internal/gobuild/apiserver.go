// The kube-apiserver of ha/kube's tests: a pinned Kubernetes release built
// from the Go module proxy (k8s.io/kubernetes, with its staging modules at
// their published versions), the way Kubernetes' own release builds stamp
// its version.

package gobuild

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// CurrentKube is the Kubernetes release whose kube-apiserver ha/kube's
// tests and its example run against by default.
const CurrentKube = "v1.36.3"

var kubeReleasePattern = regexp.MustCompile(`^v1\.([0-9]+)\.[0-9]+$`)

// CheckKubeRelease tells why release is no Kubernetes release the build can
// make, or returns nil: the build maps v1.N.P to the staging modules'
// v0.N.P, so only a v1 release will do.
func CheckKubeRelease(release string) error {
	if !kubeReleasePattern.MatchString(release) {
		return fmt.Errorf("%q: want a Kubernetes release such as %s", release, CurrentKube)
	}
	return nil
}

// KubeAPIServer returns the cached kube-apiserver of release
// ("v1.36.3"), built first if need be: minutes the first time.
func KubeAPIServer(release string) (string, error) {
	if err := CheckKubeRelease(release); err != nil {
		return "", err
	}
	return Cached("kube-apiserver", release, kubeAPIServerRelease, func(ctx context.Context, tmp, out string) error {
		return buildAPIServer(ctx, release, tmp, out)
	})
}

// kubeAPIServerRelease returns the release the kube-apiserver at bin
// reports, "v1.36.3".
func kubeAPIServerRelease(bin string) (string, error) {
	return VersionLine(bin, "Kubernetes ")
}

// stagingReplace matches the lines of k8s.io/kubernetes's go.mod that point
// a module at its staging directory: inside the repository the staging
// modules are built from there, and a build of k8s.io/kubernetes as a
// dependency must replace each with its published version instead.
var stagingReplace = regexp.MustCompile(`(?m)^\s*(?:replace\s+)?(\S+)\s+=>\s+\./staging/`)

// buildAPIServer builds kube-apiserver release into out, in a module of
// its own in tmp. The version is stamped the way Kubernetes' own release
// builds stamp it, so that --version and /version report release.
func buildAPIServer(ctx context.Context, release, tmp, out string) error {
	if _, err := GoIn(ctx, tmp, "mod", "init", "kube-apiserver-for-ha-kube-tests"); err != nil {
		return err
	}
	info, err := GoIn(ctx, tmp, "mod", "download", "-json", "k8s.io/kubernetes@"+release)
	if err != nil {
		return err
	}
	var dl struct{ GoMod, Error string }
	if err := json.Unmarshal(info, &dl); err != nil {
		return fmt.Errorf("go mod download -json: %w", err)
	}
	if dl.Error != "" {
		return errors.New(dl.Error)
	}
	kubeMod, err := os.ReadFile(dl.GoMod)
	if err != nil {
		return err
	}
	m := kubeReleasePattern.FindStringSubmatch(release)
	minor := m[1]
	stagingVersion := "v0." + strings.TrimPrefix(release, "v1.")
	edit := []string{"mod", "edit", "-require=k8s.io/kubernetes@" + release}
	for _, sm := range stagingReplace.FindAllStringSubmatch(string(kubeMod), -1) {
		edit = append(edit, "-replace="+sm[1]+"="+sm[1]+"@"+stagingVersion)
	}
	if len(edit) == 3 {
		return fmt.Errorf("k8s.io/kubernetes@%s's go.mod points no module at ./staging", release)
	}
	if _, err := GoIn(ctx, tmp, edit...); err != nil {
		return err
	}
	const main = `package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	os.Exit(cli.Run(app.NewAPIServerCommand()))
}
`
	if err := os.WriteFile(filepath.Join(tmp, "main.go"), []byte(main), 0o644); err != nil {
		return err
	}
	if _, err := GoIn(ctx, tmp, "mod", "tidy"); err != nil {
		return err
	}
	const v = "k8s.io/component-base/version."
	ldflags := "-X " + v + "gitVersion=" + release + " -X " + v + "gitMajor=1 -X " + v + "gitMinor=" + minor + " -X " + v + "gitTreeState=clean"
	_, err = GoIn(ctx, tmp, "build", "-trimpath", "-ldflags", ldflags, "-o", out, ".")
	return err
}
