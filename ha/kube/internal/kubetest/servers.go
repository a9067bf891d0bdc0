// An etcd and a kube-apiserver storing into it, started together in a
// temporary directory: what ha/kube's tests run against, and what its
// example starts when it is given no cluster.

package kubetest

import (
	"errors"
	"os"
)

// Servers is an etcd and a kube-apiserver storing into it. Its fields are
// set by Start and never change.
type Servers struct {
	Release string     // the kube-apiserver's, "v1.36.3"
	Dir     string     // the servers' data, certificates and logs
	Etcd    *Process   // etcd's process
	EtcdURL string     // etcd's client URL
	API     *APIServer // the kube-apiserver
	APIBin  string     // the kube-apiserver binary, for a caller that starts another
}

// Start builds (once per release, into the user cache directory) and
// starts etcd etcdRelease and kube-apiserver release, with apiFlags added
// to the kube-apiserver's own flags (StartAPIServer), trying three times,
// as a free port may be taken meanwhile. Stop stops them.
func Start(release, etcdRelease string, apiFlags ...string) (*Servers, error) {
	etcdBin, err := EtcdBinary(etcdRelease)
	if err != nil {
		return nil, err
	}
	apiBin, err := APIServerBinary(release)
	if err != nil {
		return nil, err
	}
	var errs []error
	for range 3 {
		s, err := startOnce(release, etcdRelease, etcdBin, apiBin, apiFlags)
		if err == nil {
			return s, nil
		}
		errs = append(errs, err)
	}
	return nil, errors.Join(errs...)
}

func startOnce(release, etcdRelease, etcdBin, apiBin string, apiFlags []string) (s *Servers, err error) {
	base := ""
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		base = "/dev/shm" // etcd fsyncs every write: memory is faster than a disk
	}
	dir, err := os.MkdirTemp(base, "ha-kube-")
	if err != nil {
		return nil, err
	}
	s = &Servers{Release: release, Dir: dir, APIBin: apiBin}
	defer func() {
		if err != nil {
			s.Stop()
		}
	}()
	if s.EtcdURL, s.Etcd, err = StartEtcd(etcdBin, etcdRelease, dir); err != nil {
		return nil, err
	}
	if s.API, err = StartAPIServer(apiBin, release, s.EtcdURL, dir, apiFlags...); err != nil {
		return nil, err
	}
	return s, nil
}

// Stop stops the kube-apiserver, then its etcd, and removes their files.
func (s *Servers) Stop() {
	if s.API != nil {
		s.API.Proc.Stop()
	}
	if s.Etcd != nil {
		s.Etcd.Stop()
	}
	os.RemoveAll(s.Dir)
}
