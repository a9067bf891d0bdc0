// The etcd the kube-apiserver stores into: built and cached by
// ha/internal/gobuild, as ha/etcd's tests build theirs, so both modules'
// tests share one binary per release.

package kubetest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"time"

	"github.com/bgctl/controller/ha/internal/gobuild"
)

// CurrentEtcd is the etcd release the kube-apiserver stores into by
// default (pinned in ha/internal/gobuild, for ha/etcd's tests too).
const CurrentEtcd = gobuild.CurrentEtcd

// EtcdBinary returns the cached etcd of release ("v3.7.3"), built first
// if need be.
func EtcdBinary(release string) (string, error) { return gobuild.Etcd(release) }

// StartEtcd starts the etcd at bin with its data and log in dir, and
// returns its client URL once it is healthy and reports release.
func StartEtcd(bin, release, dir string) (string, *Process, error) {
	cport, err := FreePort()
	if err != nil {
		return "", nil, err
	}
	pport, err := FreePort()
	if err != nil {
		return "", nil, err
	}
	client := fmt.Sprintf("http://127.0.0.1:%d", cport)
	peer := fmt.Sprintf("http://127.0.0.1:%d", pport)
	p, err := startProcess(bin, filepath.Join(dir, "etcd.log"), "ETCD_", // etcd reads ETCD_* as flags
		"--name", "kube-test",
		"--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "kube-test="+peer,
		"--log-level", "warn", "--logger", "zap")
	if err != nil {
		return "", nil, err
	}
	hc := &http.Client{Timeout: time.Second}
	defer hc.CloseIdleConnections()
	var version struct{ Etcdserver string }
	err = p.waitFor(15*time.Second, func() error {
		var health struct{ Health string }
		if err := getJSON(hc, client+"/health", &health); err != nil {
			return err
		}
		if health.Health != "true" {
			return fmt.Errorf("etcd reports health %q", health.Health)
		}
		return getJSON(hc, client+"/version", &version)
	})
	if err == nil && "v"+version.Etcdserver != release {
		err = fmt.Errorf("%s serves etcd %s, not %s", bin, version.Etcdserver, release)
	}
	if err != nil {
		p.Stop()
		return "", nil, fmt.Errorf("etcd: %w", err)
	}
	return client, p, nil
}

func getJSON(hc *http.Client, url string, v any) error {
	resp, err := hc.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}
